"""The Stalwart processes of one scenario: real ``queue supervise`` / ``queue work`` children.

Each is a ``tests.helpers.Child`` (its own session, killed as a whole group when the scenario
ends, whatever happens). Waits are bounded polls of the process table. ``skew`` runs a
child under ``libfaketime`` with its wall clock off by that much, its monotonic clock true.
"""

import atexit
import os
from collections import defaultdict
from pathlib import Path

import psutil
from django.db import DatabaseError, InterfaceError

from stalwart.models import Process
from tests.faults.target import ALIAS, Target
from tests.helpers import Child, wait_for

FAKETIME_LIBRARIES = (
    "/usr/lib/*/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
)


def faketime_library() -> str | None:
    for pattern in FAKETIME_LIBRARIES:
        found = sorted(Path("/").glob(pattern.removeprefix("/")))
        if found:
            return str(found[0])
    return None


# Its sitecustomize keeps time.sleep working under libfaketime (see the module).
SKEW_SITE = Path(__file__).parent / "skew"


def skew_env(offset: str, pythonpath: str) -> dict[str, str]:
    """Environment that runs a process with its wall clock ``offset`` (e.g. ``+30s``) off."""
    library = faketime_library()
    if library is None:
        raise RuntimeError("libfaketime is not installed (Debian: apt-get install faketime)")
    return {
        "LD_PRELOAD": library,
        "FAKETIME": offset,
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
        "PYTHONPATH": os.pathsep.join([str(SKEW_SITE), pythonpath]),
    }


def quietly(condition):
    """``condition`` for a poll that runs while the database may be away: errors are False."""

    def probe():
        try:
            return condition()
        except (DatabaseError, InterfaceError):
            from django.db import connections

            connections[ALIAS].close()
            return False

    return probe


class Fleet:
    def __init__(self, target: Target, ledger: Path) -> None:
        self.target = target
        self.ledger = ledger
        self.children: list[Child] = []
        atexit.register(self.close)  # should the scenario's own teardown never run

    def env(self, skew: str | None = None, **extra: str) -> dict[str, str]:
        env = self.target.env(STALWART_LEDGER=str(self.ledger), **extra)
        if skew is not None:
            env.update(skew_env(skew, env["PYTHONPATH"]))
        return env

    def start(self, *args: str, skew: str | None = None, **extra: str) -> Child:
        child = Child(*args, env=self.env(skew, **extra))
        self.children.append(child)
        return child

    def supervise(
        self, *args: str, children: int, skew: str | None = None, timeout: float = 30, **extra: str
    ) -> Child:
        """Start ``queue supervise`` and wait until it and its ``children`` have registered."""
        supervisor = self.start("queue", "supervise", *args, skew=skew, **extra)

        def registered() -> bool:
            if supervisor.process.poll() is not None:
                raise AssertionError(f"the supervisor exited early:\n{supervisor.output}")
            row = self.rows().filter(pid=supervisor.pid, kind="supervisor").first()
            return row is not None and self.rows().filter(supervisor=row.id).count() == children

        wait_for(quietly(registered), timeout=timeout, message=f"a supervisor and {children}")
        return supervisor

    def work(self, *args: str, skew: str | None = None, timeout: float = 30, **extra: str) -> Child:
        """Start ``queue work`` and wait until it has registered."""
        worker = self.start("queue", "work", *args, skew=skew, **extra)

        def registered() -> bool:
            if worker.process.poll() is not None:
                raise AssertionError(f"the worker exited early:\n{worker.output}")
            return self.rows().filter(pid=worker.pid).exists()

        wait_for(quietly(registered), timeout=timeout, message="the worker to register")
        return worker

    def rows(self):
        return Process.objects.using(ALIAS)

    def family(self, supervisor: Child) -> dict[str, list[int]]:
        """Pids of the supervisor's live children, by kind (from the process table)."""
        row = self.rows().filter(pid=supervisor.pid, kind="supervisor").first()
        found: dict[str, list[int]] = defaultdict(list)
        if row is None:
            return found
        for kind, pid in self.rows().filter(supervisor=row.id).values_list("kind", "pid"):
            found[kind].append(pid)
        return found

    @staticmethod
    def os_children(supervisor: Child) -> set[int]:
        """Pids of the supervisor's live child processes, as the OS sees them."""
        try:
            return {
                child.pid
                for child in psutil.Process(supervisor.pid).children()
                if child.status() != psutil.STATUS_ZOMBIE
            }
        except psutil.NoSuchProcess:
            return set()

    def outputs(self) -> str:
        return "\n".join(
            f"--- {' '.join(child.args)} (pid {child.pid}) ---\n{child.output}"
            for child in self.children
        )

    def close(self) -> None:
        for child in self.children:
            child.__exit__()
        atexit.unregister(self.close)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def role_backends(target: Target, pid: int) -> list[int]:
    """The PostgreSQL backends serving the Stalwart process ``pid`` (direct connections).

    Stalwart names its connections ``stalwart:<kind>:<pid>`` (``application_name``); where
    it does not (yet), the process's own TCP ports are matched to ``client_port``.
    """
    cluster = target.cluster
    assert cluster is not None
    named = cluster.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND application_name LIKE %s",
        [target.name, f"stalwart:%:{pid}"],
    )
    if named:
        return [row[0] for row in named]
    try:
        ports = [
            connection.laddr.port
            for connection in psutil.Process(pid).net_connections(kind="tcp")
            if connection.raddr and connection.raddr.port == cluster.port
        ]
    except psutil.NoSuchProcess:
        return []
    if not ports:
        return []
    rows = cluster.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND client_port = ANY(%s)",
        [target.name, ports],
    )
    return [row[0] for row in rows]
