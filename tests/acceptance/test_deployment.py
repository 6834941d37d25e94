"""The deployment files: the systemd unit (and its notify protocol) and the Procfile."""

import configparser
import contextlib
import json
import os
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

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


def dockerfile() -> dict[str, str]:
    """example/Dockerfile's instructions, by name (the last of each), continuations joined."""
    text = (ROOT / "example" / "Dockerfile").read_text().replace("\\\n", " ")
    instructions = {}
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, _, rest = line.strip().partition(" ")
            instructions[name] = " ".join(rest.split())
    return instructions


def health_check(env: dict[str, str]) -> subprocess.CompletedProcess:
    """The Dockerfile's HEALTHCHECK command, run as Docker runs it: in its WORKDIR."""
    command = json.loads(dockerfile()["HEALTHCHECK"].partition(" CMD ")[2])
    assert command[0] == "python"
    return subprocess.run(
        [sys.executable, *command[1:]],
        check=False,
        cwd=ROOT / "example",
        env=env,
        timeout=120,
        capture_output=True,
        text=True,
    )


def test_the_dockerfile_runs_the_supervisor_of_the_demo_project_with_a_health_check():
    """No Docker engine runs here (the image is not built by the tests): what can be held
    to account without one is. Its HEALTHCHECK runs in the Procfile test below."""
    instructions = dockerfile()
    assert instructions["FROM"] == "python:3.13-slim"
    assert json.loads(instructions["CMD"]) == ["python", "manage.py", "queue", "supervise"]
    assert instructions["WORKDIR"] == "/src/example"  # where manage.py is
    assert instructions["USER"] == "stalwart"
    assert instructions["HEALTHCHECK"].startswith("--interval=30s --timeout=20s")
    assert '"status", "--check", "--this-host"]' in instructions["HEALTHCHECK"]
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "**/*.sqlite3"} <= set(ignored)


@contextlib.contextmanager
def demo_database(vendor: str, tmp_path: Path) -> Iterator[tuple[dict[str, str], Any]]:
    """The demo project's database for the Procfile's lines: on the PostgreSQL leg a scratch
    PostgreSQL database named by ``DATABASE_URL`` (as a platform's add-on sets it), else an
    SQLite file. Yields the environment, and a function that reads a job's status."""
    if vendor != "postgresql":
        database = tmp_path / "procfile.sqlite3"

        def sqlite_status(job_id: str) -> str | None:
            with contextlib.closing(sqlite3.connect(database)) as db:
                row = db.execute(
                    "SELECT status FROM stalwart_job WHERE id = ?", [job_id.replace("-", "")]
                ).fetchone()
            return row and row[0]

        yield {"STALWART_DEMO_DB": str(database)}, sqlite_status
        return
    import psycopg

    settings = connections["default"].settings_dict
    name = f"stalwart_procfile_{uuid.uuid4().hex[:8]}"
    server = {
        "host": settings["HOST"],
        "port": settings["PORT"],
        "user": settings["USER"],
        "password": settings["PASSWORD"],
    }
    with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    url = (
        f"postgresql://{quote(settings['USER'])}:{quote(settings['PASSWORD'])}@"
        f"{settings['HOST']}:{settings['PORT']}/{name}"
    )

    def postgresql_status(job_id: str) -> str | None:
        with psycopg.connect(dbname=name, **server) as db:
            row = db.execute("SELECT status FROM stalwart_job WHERE id = %s", [job_id]).fetchone()
        return row and row[0]

    try:
        yield {"DATABASE_URL": url}, postgresql_status
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True, **server) as admin:
            admin.execute(f"DROP DATABASE {name} WITH (FORCE)")


def test_the_procfile_release_and_worker_lines_run(tmp_path: Path, vendor: str):
    """The repository's Procfile runs the demo project: on SQLite (one host only), or on the
    PostgreSQL that DATABASE_URL names, as on a platform with several dynos."""
    entries = dict(
        line.split(":", 1) for line in (ROOT / "Procfile").read_text().splitlines() if line.strip()
    )
    assert set(entries) == {"release", "worker"}
    with demo_database(vendor, tmp_path) as (database_env, job_status):
        env = {
            **os.environ,
            **database_env,
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
                    "from shop.tasks import resize_image as t; print(t.enqueue('a.png', 32).id)",
                ],
                cwd=ROOT,
                env=env,
                check=True,
                timeout=120,
                capture_output=True,
                text=True,
            )
            job_id = enqueue.stdout.strip().splitlines()[-1]
            wait_for(
                lambda: job_status(job_id) == "successful",
                timeout=60,
                message="the Procfile worker to run the job",
            )
            # The container's health check (example/Dockerfile), on this host's supervisor.
            assert health_check(env).returncode == 0
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(timeout=40) == 0, worker_log.read_text()
            unhealthy = health_check(env)
            assert unhealthy.returncode == 1
            assert "unhealthy: no live supervisor or worker of host" in unhealthy.stderr
        finally:
            if worker.poll() is None:
                os.killpg(worker.pid, signal.SIGKILL)
                worker.wait()
