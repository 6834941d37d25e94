"""Run a command with a PgBouncer of its own in transaction mode, in front of the test server.

    python -m tests.pgbouncer python -m pytest tests/integration

starts Debian's ``pgbouncer`` on a spare port of 127.0.0.1, pointing at the PostgreSQL named
by PGHOST/PGPORT/PGUSER (default 127.0.0.1:5432, ``postgres``, trust), runs the command with
``STALWART_TEST_DATABASE=postgresql-pgbouncer`` and ``STALWART_PGBOUNCER_PORT`` set, then stops
it and exits with the command's status. Its configuration is the one docs/how-to/
use-pgbouncer.md asks for, no more: ``pool_mode = transaction``, a wildcard database entry (so
the test runner can create its databases through it), and no ``ignore_startup_parameters``,
so that a startup parameter PgBouncer cannot carry fails loudly.

A PgBouncer that cannot be started is an error (status 2), never a silent skip.
"""

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

CONFIG = """\
[databases]
* = host={host} port={port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {listen_port}
unix_socket_dir =
auth_type = trust
auth_file = {directory}/userlist.txt
pool_mode = transaction
default_pool_size = 15
max_client_conn = 1000
admin_users = {user}
"""


def spare_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def binary() -> str | None:
    return shutil.which("pgbouncer") or next(
        (path for path in ("/usr/sbin/pgbouncer",) if os.access(path, os.X_OK)), None
    )


def runs_as() -> list[str]:
    """PgBouncer refuses to run as root: then it switches to ``postgres`` (or ``nobody``)."""
    if os.geteuid() != 0:
        return []
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return ["-u", name]
    return []


class PgBouncer:
    """One PgBouncer process, with its configuration in a directory of its own."""

    def __init__(self) -> None:
        self.server_host = os.environ.get("PGHOST", "127.0.0.1")
        self.server_port = os.environ.get("PGPORT", "5432")
        self.user = os.environ.get("PGUSER", "postgres")
        self.directory = Path(tempfile.mkdtemp(prefix="stalwart-pgbouncer-"))
        self.directory.chmod(0o755)  # readable by the user it switches to
        self.log = self.directory / "pgbouncer.log"
        self.port = 0
        self.process: subprocess.Popen | None = None

    def start(self, *, attempts: int = 3) -> None:
        program = binary()
        if program is None:
            raise RuntimeError(
                "pgbouncer is not installed (on Debian: apt-get install pgbouncer; "
                "scripts/test installs it when it runs as root)"
            )
        (self.directory / "userlist.txt").write_text(f'"{self.user}" ""\n')
        for _ in range(attempts):  # a spare port may be taken before PgBouncer binds it
            self.port = spare_port()
            config = self.directory / "pgbouncer.ini"
            config.write_text(
                CONFIG.format(
                    host=self.server_host,
                    port=self.server_port,
                    listen_port=self.port,
                    directory=self.directory,
                    user=self.user,
                )
            )
            for path in self.directory.iterdir():
                path.chmod(0o644)
            with self.log.open("a") as log:
                self.process = subprocess.Popen(
                    [program, *runs_as(), str(config)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            if self._ready():
                return
            self.stop()
        raise RuntimeError(f"pgbouncer did not start:\n{self.log.read_text()}")

    def _ready(self, timeout: float = 15.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is None or self.process.poll() is not None:
                return False
            try:
                psycopg.connect(
                    host="127.0.0.1",
                    port=self.port,
                    user=self.user,
                    dbname="postgres",
                    connect_timeout=2,
                ).close()
            except psycopg.OperationalError:
                time.sleep(0.1)  # a bounded wait for the process to listen
            else:
                return True
        return False

    def stop(self) -> None:
        """Immediate shutdown (SIGTERM: no wait for clients), then reap it."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


def main(command: list[str]) -> int:
    if not command:
        print(__doc__, file=sys.stderr)  # noqa: T201 - a command-line tool
        return 2
    bouncer = PgBouncer()
    try:
        try:
            bouncer.start()
        except RuntimeError as error:
            print(f"error: {error}", file=sys.stderr)  # noqa: T201
            return 2
        print(  # noqa: T201
            f"PgBouncer {bouncer.port} (transaction mode) -> "
            f"{bouncer.server_host}:{bouncer.server_port}",
            file=sys.stderr,
        )
        env = {
            **os.environ,
            "STALWART_TEST_DATABASE": "postgresql-pgbouncer",
            "STALWART_PGBOUNCER_PORT": str(bouncer.port),
        }
        return subprocess.run(command, env=env, check=False).returncode
    finally:
        bouncer.stop()
        bouncer.remove()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
