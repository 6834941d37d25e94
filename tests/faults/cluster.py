"""A private, disposable PostgreSQL cluster: ``initdb`` and ``pg_ctl`` on a spare port.

Never the shared server: the suite restarts, stops, fills and write-protects this one. It
lives in a temporary directory, listens on 127.0.0.1 only, trusts local logins, and is
stopped (``-m immediate``) and deleted by ``destroy()``, which the fixture calls whatever
happens. Run as root, the server runs as the ``postgres`` user (PostgreSQL refuses root).

Two roles: ``postgres`` (superuser) for the test's own look at the tables, never touched by
a fault, and ``stalwart_app`` for the Stalwart processes, on which the role-level faults
(timeouts, connection limits, read-only) are set.
"""

import atexit
import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

APP_ROLE = "stalwart_app"
SERVER_SETTINGS = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{sockets}'
max_connections = 80
shared_buffers = 16MB
fsync = off
full_page_writes = off
autovacuum = off
log_line_prefix = '%m [%p] %u@%d %a: '
log_min_messages = warning
"""


class ClusterUnavailable(RuntimeError):
    """No PostgreSQL binaries here, or the cluster would not start."""


def find_bindir() -> Path:
    """The newest PostgreSQL server binaries on this machine (``PG_BINDIR`` wins)."""
    candidates = []
    if os.environ.get("PG_BINDIR"):
        candidates.append(Path(os.environ["PG_BINDIR"]))
    installed = sorted(
        Path("/usr/lib/postgresql").glob("*/bin"), key=lambda p: int(p.parent.name), reverse=True
    )
    candidates += installed
    if shutil.which("pg_ctl"):
        candidates.append(Path(shutil.which("pg_ctl")).parent)
    for candidate in candidates:
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    raise ClusterUnavailable("no PostgreSQL server binaries (initdb, pg_ctl) were found")


def _tool(name: str) -> str:
    return shutil.which(name) or f"/bin/{name}"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PrivateCluster:
    """One PostgreSQL cluster of our own. ``start()`` it; ``destroy()`` always."""

    def __init__(self) -> None:
        self.bindir = find_bindir()
        self.root = Path(tempfile.mkdtemp(prefix="stalwart-faults-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port()
        self.host = "127.0.0.1"
        self.mounts: list[Path] = []
        atexit.register(self.destroy)  # should the session's own teardown never run
        # PostgreSQL will not run as root: as root, run it as the postgres user.
        self.user = "postgres" if os.geteuid() == 0 else None
        if self.user is not None:
            try:
                entry = pwd.getpwnam(self.user)
            except KeyError:
                raise ClusterUnavailable("running as root, but there is no postgres user") from None
            os.chown(self.root, entry.pw_uid, entry.pw_gid)
        self.root.chmod(0o755)

    # -- running the server's programs --------------------------------------------------------

    def _run(self, *command: str, timeout: float = 60) -> str:
        completed = subprocess.run(
            [str(self.bindir / command[0]), *command[1:]],
            capture_output=True,
            text=True,
            timeout=timeout,
            user=self.user,
            cwd=self.root,
            check=False,
        )
        if completed.returncode != 0:
            raise ClusterUnavailable(
                f"{' '.join(command)} failed ({completed.returncode}):\n"
                f"{completed.stdout}{completed.stderr}\n{self.server_log()[-3000:]}"
            )
        return completed.stdout

    def server_log(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def start(self) -> "PrivateCluster":
        if not self.data.exists():
            self._run(
                "initdb", "-D", str(self.data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
                "--locale=C", "--no-sync", "--no-instructions",
            )  # fmt: skip
            with (self.data / "postgresql.conf").open("a") as conf:
                conf.write(SERVER_SETTINGS.format(port=self.port, sockets=self.root))
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "start")
        return self

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def restart(self, mode: str = "fast") -> None:
        """Stop (``fast``: sessions ended cleanly; ``immediate``: as a crash) and start again."""
        self.stop(mode)
        self.start()

    def down_for(self, seconds: float, mode: str = "fast") -> None:
        """Stop, stay down ``seconds`` (holding the fault open), start again."""
        self.stop(mode)
        time.sleep(seconds)  # the length of the outage, not a synchronisation
        self.start()

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    def destroy(self) -> None:
        """Stop the server at once and delete everything, tmpfs mounts included (twice is
        harmless)."""
        if not self.root.exists():
            return
        with contextlib.suppress(Exception):
            if self.running():
                self.stop("immediate")
        for mount in reversed(self.mounts):
            subprocess.run([_tool("umount"), "-l", str(mount)], capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)

    # -- talking to it ------------------------------------------------------------------------

    def connect(self, dbname: str = "postgres", user: str = "postgres") -> psycopg.Connection:
        return psycopg.connect(
            host=self.host, port=self.port, user=user, dbname=dbname, autocommit=True,
            connect_timeout=5,
        )  # fmt: skip

    def execute(self, statement: Any, params: Any = None, dbname: str = "postgres") -> list[tuple]:
        """Run one statement as the superuser, in autocommit; return its rows, if any."""
        with self.connect(dbname) as connection, connection.cursor() as cursor:
            cursor.execute(statement, params)
            return cursor.fetchall() if cursor.description else []

    @contextlib.contextmanager
    def session(self, dbname: str) -> Iterator[psycopg.Connection]:
        """A superuser session of the test's own (for locks held across a fault)."""
        connection = self.connect(dbname)
        try:
            yield connection
        finally:
            connection.close()

    # -- faults -------------------------------------------------------------------------------

    def terminate(self, pids: list[int]) -> int:
        """``pg_terminate_backend`` these backends (what a failover does to them)."""
        if not pids:
            return 0
        rows = self.execute(
            "SELECT count(pg_terminate_backend(p)) FROM unnest(%s::int[]) AS p", [pids]
        )
        return rows[0][0]

    def app_backends(self, dbname: str) -> list[int]:
        rows = self.execute(
            "SELECT pid FROM pg_stat_activity WHERE usename = %s AND datname = %s",
            [APP_ROLE, dbname],
        )
        return [row[0] for row in rows]

    def set_role(self, **settings: Any) -> None:
        """``ALTER ROLE stalwart_app SET …`` (new sessions); ``None`` resets a setting."""
        for name, value in settings.items():
            if value is None:
                self.execute(f"ALTER ROLE {APP_ROLE} RESET {name}")
            else:
                self.execute(
                    sql.SQL("ALTER ROLE {} SET {} = {}").format(
                        sql.Identifier(APP_ROLE), sql.Identifier(name), sql.Literal(str(value))
                    )
                )

    def connection_limit(self, limit: int) -> None:
        self.execute(f"ALTER ROLE {APP_ROLE} CONNECTION LIMIT {int(limit)}")

    def read_only(self, on: bool) -> None:
        """Make every session that has not chosen otherwise read-only, at once (a reload).

        The superuser's sessions are exempt (a role setting beats the server's), so the test
        can still look, and write, while the queue's processes cannot.
        """
        value = "on" if on else "off"
        self.execute(f"ALTER SYSTEM SET default_transaction_read_only = {value}")
        self.execute("SELECT pg_reload_conf()")

    def small_tablespace(self, name: str, megabytes: int) -> Path:
        """A tablespace on a tmpfs of ``megabytes`` that we mount (root only)."""
        location = self.root / f"tablespace-{name}"
        location.mkdir()
        mounted = subprocess.run(
            [_tool("mount"), "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(location)],
            capture_output=True,
            text=True,
            check=False,
        )
        if mounted.returncode != 0:
            raise ClusterUnavailable(f"cannot mount a tmpfs: {mounted.stderr.strip()}")
        self.mounts.append(location)
        if self.user is not None:
            entry = pwd.getpwnam(self.user)
            os.chown(location, entry.pw_uid, entry.pw_gid)
        self.execute(f"CREATE TABLESPACE {name} LOCATION '{location}'")
        return location


def prepare(cluster: PrivateCluster) -> None:
    """The application role, and the superuser immune to the faults set for everyone."""
    cluster.execute(f"CREATE ROLE {APP_ROLE} LOGIN CREATEDB")
    cluster.execute("ALTER ROLE postgres SET default_transaction_read_only = off")
