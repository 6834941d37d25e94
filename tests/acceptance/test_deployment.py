"""The deployment files: the systemd unit (and its notify protocol) and the Procfile."""

import configparser
import contextlib
import os
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import connections

from stalwart.processes import systemd
from tests.helpers import ROOT, Child, child_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def read_unit() -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # systemd keys are case-sensitive
    unit.read(ROOT / "systemd" / "stalwart.service")
    return unit


def test_the_systemd_unit_runs_the_supervisor_the_way_the_docs_say():
    service = read_unit()["Service"]
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    assert service["ExecStart"].endswith("manage.py queue supervise")
    assert service["KillMode"] == "mixed"
    assert service["Restart"] == "on-failure"
    # Above the default shutdown timeout (30 s) plus the supervisor's grace for its children.
    from stalwart.processes.supervisor import SHUTDOWN_GRACE

    assert int(service["TimeoutStopSec"]) > 30 + SHUTDOWN_GRACE
    assert int(service["WatchdogSec"]) > 0


class NotifySocket:
    """A datagram socket standing in for systemd's $NOTIFY_SOCKET."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.2)
        self.messages: list[str] = []

    def collect(self) -> list[str]:
        while True:
            try:
                self.messages.append(self.sock.recv(4096).decode())
            except TimeoutError:
                return self.messages

    def saw(self, prefix: str) -> bool:
        return any(line.startswith(prefix) for m in self.collect() for line in m.splitlines())

    def close(self) -> None:
        self.sock.close()


def test_the_supervisor_speaks_the_notify_protocol(tmp_path: Path):
    notify = NotifySocket(str(tmp_path / "notify"))
    connections.close_all()
    try:
        with Child(
            "queue",
            "supervise",
            "--processes",
            "1",
            "--no-scheduler",
            "--dispatchers",
            "0",
            env=child_env(NOTIFY_SOCKET=notify.path, WATCHDOG_USEC="400000"),
        ) as supervisor:
            wait_for(lambda: notify.saw("READY=1"), timeout=30, message="READY=1")
            assert any(f"MAINPID={supervisor.pid}" in message for message in notify.messages)
            wait_for(lambda: notify.saw("WATCHDOG=1"), timeout=5, message="a watchdog ping")
            supervisor.signal(signal.SIGTERM)
            assert supervisor.wait(timeout=30) == 0, supervisor.output
            wait_for(lambda: notify.saw("STOPPING=1"), timeout=5, message="STOPPING=1")
    finally:
        notify.close()


def test_notify_reaches_abstract_sockets_and_is_a_no_op_without_systemd(monkeypatch):
    name = f"stalwart-test-{os.getpid()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind("\0" + name)
    listener.settimeout(5)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert systemd.notify("READY=1") is True
        assert listener.recv(100) == b"READY=1"
    finally:
        listener.close()
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert systemd.notify("READY=1") is False


def test_the_procfile_release_and_worker_lines_run(tmp_path: Path):
    entries = dict(
        line.split(":", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line.strip()
    )
    assert set(entries) == {"release", "worker"}
    database = tmp_path / "procfile.sqlite3"
    env = {
        **os.environ,
        "STALWART_DEMO_DB": str(database),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    subprocess.run(shlex.split(entries["release"]), cwd=ROOT, env=env, check=True, timeout=120)
    worker_log = tmp_path / "worker.log"
    with worker_log.open("w") as log:
        worker = subprocess.Popen(
            shlex.split(entries["worker"]),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        enqueue = subprocess.run(
            [
                sys.executable,
                "example/manage.py",
                "shell",
                "-c",
                "from shop.tasks import resize_image; print(resize_image.enqueue('a.png', 32).id)",
            ],
            cwd=ROOT,
            env=env,
            check=True,
            timeout=120,
            capture_output=True,
            text=True,
        )
        job_id = enqueue.stdout.strip().splitlines()[-1].replace("-", "")

        def succeeded() -> bool:
            with contextlib.closing(sqlite3.connect(database)) as db:
                row = db.execute(
                    "SELECT status FROM stalwart_job WHERE id = ?", [job_id]
                ).fetchone()
            return row == ("successful",)

        wait_for(succeeded, timeout=60, message="the Procfile worker to run the job")
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(timeout=40) == 0, worker_log.read_text()
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
