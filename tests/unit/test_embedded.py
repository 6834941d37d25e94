"""``stalwart.embedded`` without a web server: what its pieces decide before any process
starts (the real servers: tests/acceptance/test_embedded.py)."""

import asyncio
import os
import subprocess
import sys

import pytest

from stalwart.embedded import launcher
from stalwart.embedded.asgi import with_supervisor
from stalwart.embedded.launcher import MARK, SETTINGS_NEEDED, EmbeddedError, EmbeddedSupervisor
from tests.helpers import ROOT


def lifespan(application, *, shutdown: bool = True) -> list[dict]:
    """Run an ASGI lifespan through ``application``: startup, then shutdown; return what
    the application sent."""
    incoming = [{"type": "lifespan.startup"}]
    if shutdown:
        incoming.append({"type": "lifespan.shutdown"})
    sent: list[dict] = []

    async def receive() -> dict:
        return incoming.pop(0)

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(application({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send))
    return sent


async def never_called(scope, receive, send) -> None:
    raise AssertionError("Django's application has no lifespan: it must not see one")


def test_under_a_server_whose_master_runs_a_supervisor_the_lifespan_starts_none(monkeypatch):
    monkeypatch.setenv(MARK, "4242")
    started = []

    def start(self: EmbeddedSupervisor) -> None:
        started.append(self)

    monkeypatch.setattr(EmbeddedSupervisor, "start", start)
    sent = lifespan(with_supervisor(never_called))
    assert sent == [{"type": "lifespan.startup.complete"}, {"type": "lifespan.shutdown.complete"}]
    assert started == []


def test_without_django_settings_module_the_lifespan_fails_saying_so(monkeypatch):
    monkeypatch.delenv(MARK, raising=False)
    monkeypatch.delenv("DJANGO_SETTINGS_MODULE")
    sent = lifespan(with_supervisor(never_called), shutdown=False)
    assert sent == [{"type": "lifespan.startup.failed", "message": SETTINGS_NEEDED}]


def test_an_unknown_backend_is_refused_before_anything_starts(monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", None)  # nothing may be started
    with pytest.raises(EmbeddedError, match="TASKS has no entry 'nope' for the embedded"):
        EmbeddedSupervisor("nope").start()


def test_the_supervisor_is_told_its_parent_and_not_the_service_managers_socket(monkeypatch):
    monkeypatch.setenv("NOTIFY_SOCKET", "/run/systemd/notify")
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    monkeypatch.setenv(MARK, "1")
    supervisor = EmbeddedSupervisor("default")
    env = supervisor.environment("/tmp/ours")  # noqa: S108 - a name, never opened
    assert env["NOTIFY_SOCKET"] == "/tmp/ours"  # noqa: S108
    assert "WATCHDOG_USEC" not in env
    assert MARK not in env
    assert supervisor.command()[-2:] == ["--parent-pid", str(os.getpid())]
    assert supervisor.command()[:5] == [sys.executable, "-m", "django", "queue", "supervise"]
    assert str(ROOT) in env["PYTHONPATH"].split(os.pathsep)


def test_the_stop_wait_covers_the_supervisors_own_grace():
    from stalwart.processes.supervisor import SHUTDOWN_GRACE

    assert launcher.STOP_MARGIN > SHUTDOWN_GRACE + 5


def test_the_gunicorn_hooks_import_without_django_set_up():
    """gunicorn.conf.py imports them in Gunicorn's master, which never sets Django up."""
    code = (
        "import sys; from stalwart.embedded.gunicorn import *; "
        "print(sorted(n for n in dir() if not n.startswith('_') and n != 'sys'), "
        "'django.apps.registry' in sys.modules and __import__('django').apps.apps.ready)"
    )
    env = {key: value for key, value in os.environ.items() if key != "DJANGO_SETTINGS_MODULE"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "['on_exit', 'on_reload', 'when_ready'] False", done.stderr
