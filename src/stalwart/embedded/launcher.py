"""Starting Stalwart's supervisor beside a web server, and stopping it with the server.

The supervisor runs as a process of its own, ``python -m django queue supervise``, a child
of the process that starts it (Gunicorn's master, or the ASGI server's process). It shares
no thread, event loop or database connection with the web server, and it is the supervisor
that ``queue supervise`` runs anywhere else: heartbeats, reaping, releasing. It is given
``--parent-pid``, so that it stops if the web server dies without stopping it.

``start()`` returns once the supervisor has forked its children. The supervisor speaks
systemd's notify protocol: it is given a socket of ours to send ``READY=1`` to (never the
service manager's, which would take it for the main process). ``start()`` raises
``EmbeddedError`` if the supervisor ends first, or is not ready in time. ``stop()`` sends
``TERM`` and waits as long as a drain may take (the backend's ``shutdown_timeout``, the
supervisor's grace for its children, a margin); past that, it kills the supervisor and
every process under it.
"""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from django.conf import settings

from stalwart import events
from stalwart.conf import read_options
from stalwart.exceptions import ConfigurationError

# Set in the environment of a process that started a supervisor: the processes it forks
# afterwards (Gunicorn's web workers) see it, and start none of their own.
MARK = "STALWART_EMBEDDED_SUPERVISOR"
# How long the supervisor may take to start: Django's set-up, its row, its forks.
READY_TIMEOUT = 60.0
# What stop() waits past the shutdown timeout: the supervisor's grace for its children
# (SHUTDOWN_GRACE in stalwart.processes.supervisor, 5 s), their deregistration and its own.
STOP_MARGIN = 15.0
# A service manager's variables, addressed to the web server and not to its children.
_SERVICE_MANAGER_VARIABLES = (
    "NOTIFY_SOCKET",
    "WATCHDOG_USEC",
    "WATCHDOG_PID",
    "LISTEN_FDS",
    "LISTEN_PID",
    "LISTEN_FDNAMES",
)
SETTINGS_NEEDED = (
    "Stalwart's embedded supervisor runs 'python -m django queue supervise', which needs "
    "DJANGO_SETTINGS_MODULE in the web server's environment: set it where the server starts "
    '(for Gunicorn, raw_env = ["DJANGO_SETTINGS_MODULE=mysite.settings"] in gunicorn.conf.py).'
)


class EmbeddedError(RuntimeError):
    """The embedded supervisor could not start. (A ``RuntimeError``: Gunicorn prints the
    message of one raised by a hook, and exits.)"""


def shutdown_timeout(alias: str) -> float:
    """``TASKS[alias]``'s shutdown timeout, read as the supervisor reads it: this process
    need not have set Django up (Gunicorn's master has not)."""
    tasks = getattr(settings, "TASKS", {})
    if alias not in tasks:
        raise EmbeddedError(f"TASKS has no entry {alias!r} for the embedded supervisor.")
    try:
        return read_options(alias, tasks[alias]).shutdown_timeout
    except ConfigurationError as error:
        raise EmbeddedError(str(error)) from None


def import_path() -> str:
    """This process's import path, in its order, as ``PYTHONPATH`` for the supervisor: so
    that it imports the project from where the web server does (a server's ``--chdir``,
    ``--pythonpath`` or ``--app-dir`` among them)."""
    own = [entry or str(Path.cwd()) for entry in sys.path]
    inherited = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return os.pathsep.join(entry for entry in dict.fromkeys([*own, *inherited]) if entry)


class EmbeddedSupervisor:
    """One ``queue supervise`` process, started by and for this process."""

    def __init__(self, backend: str = "default", *, ready_timeout: float = READY_TIMEOUT):
        self.backend = backend
        self.ready_timeout = ready_timeout
        self.stop_timeout = 30.0 + STOP_MARGIN  # until start() has read the setting
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "django",
            "queue",
            "supervise",
            "--backend",
            self.backend,
            "--parent-pid",
            str(os.getpid()),
        ]

    def environment(self, notify_socket: str) -> dict[str, str]:
        env = {
            key: value
            for key, value in os.environ.items()
            if key not in _SERVICE_MANAGER_VARIABLES and key != MARK
        }
        env["NOTIFY_SOCKET"] = notify_socket
        path = import_path()
        if path:
            env["PYTHONPATH"] = path
        return env

    def start(self) -> "EmbeddedSupervisor":
        """Start the supervisor; return once it has forked its children."""
        if self.process is not None and self.process.poll() is None:
            return self
        if not os.environ.get("DJANGO_SETTINGS_MODULE"):
            raise EmbeddedError(SETTINGS_NEEDED)
        self.stop_timeout = shutdown_timeout(self.backend) + STOP_MARGIN
        with (
            tempfile.TemporaryDirectory(prefix="stalwart-") as directory,
            socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as listener,
        ):
            address = str(Path(directory) / "notify")
            listener.bind(address)
            # Its output goes where the web server's goes.
            self.process = subprocess.Popen(self.command(), env=self.environment(address))
            try:
                self._wait_until_ready(self.process, listener)
            except BaseException:
                self._kill()
                raise
        os.environ[MARK] = str(self.process.pid)
        events.emit("embedded_supervisor_started", pid=self.process.pid, backend=self.backend)
        return self

    def _wait_until_ready(self, process: subprocess.Popen, listener: socket.socket) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while True:
            status = process.poll()
            if status is not None:
                raise EmbeddedError(
                    f"The embedded supervisor (pid {process.pid}) exited with status "
                    f"{status} before it was ready: its own lines above say why."
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise EmbeddedError(
                    f"The embedded supervisor (pid {process.pid}) was not ready within "
                    f"{self.ready_timeout:g} s, and was killed."
                )
            # A wait on the socket, bounded so that an exit is seen too.
            listener.settimeout(min(remaining, 0.2))
            try:
                message = listener.recv(4096)
            except TimeoutError:
                continue
            if b"READY=1" in message.split(b"\n"):
                return

    def request_stop(self) -> None:
        """Send ``TERM``: the supervisor drains (running jobs get the shutdown timeout)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGTERM)

    def wait(self) -> int | None:
        """Wait for the supervisor to end, as long as a drain may take; past that, kill it
        and every process under it. Its exit status (0 when another waiter, such as
        Gunicorn's master, collected it), or None if it was never started."""
        process = self.process
        if process is None:
            return None
        try:
            process.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            self._kill()
            events.emit("embedded_supervisor_killed", pid=process.pid, waited=self.stop_timeout)
        events.emit("embedded_supervisor_stopped", pid=process.pid, status=process.returncode)
        if os.environ.get(MARK) == str(process.pid):
            del os.environ[MARK]
        return process.returncode

    def stop(self) -> int | None:
        """``TERM``, then ``wait()``."""
        self.request_stop()
        return self.wait()

    def _kill(self) -> None:
        """SIGKILL the supervisor and every process under it, stopped first, so that none
        sees another die (and starts a drain, or forks a replacement) meanwhile."""
        process = self.process
        if process is None or process.poll() is not None:
            return
        try:
            root = psutil.Process(process.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for member in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.suspend()
        for member in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        process.wait()
