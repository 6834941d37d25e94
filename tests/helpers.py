"""Helpers for tests: bounded polling waits and workers run in threads or processes."""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.db import connection, connections
from django.tasks import task_backends

from stalwart.conf import WorkerOptions
from stalwart.db import Interruption
from stalwart.processes.worker import Worker
from stalwart.queues import QueueSelector

ROOT = Path(__file__).resolve().parent.parent

# Through PgBouncer (STALWART_TEST_DATABASE=postgresql-pgbouncer), "default" is a pooled
# connection: what a test needs a session for (a lock held across statements) goes to
# "direct", PostgreSQL itself.
PGBOUNCER = os.environ.get("STALWART_TEST_DATABASE") == "postgresql-pgbouncer"
SESSION_DATABASE = "direct" if PGBOUNCER else "default"
DATABASES = sorted({"default", SESSION_DATABASE})  # for django_db(databases=...)
# Why a test of the queue's lock_timeout and statement_timeout does not run through PgBouncer.
WITHOUT_TIMEOUTS = (
    "behind a pooler in transaction mode the queue's sessions carry no lock_timeout or "
    "statement_timeout (PgBouncer refuses them; docs/how-to/use-pgbouncer.md): a lock held "
    "by the application is waited for, not given up on"
)


def wait_for(condition: Callable[[], Any], *, timeout: float = 10.0, message: str = "") -> Any:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    delay = 0.005
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {message or condition}")
        time.sleep(delay)  # polling a condition with a deadline, not synchronising on time
        delay = min(delay * 2, 0.1)


def make_worker(queues: str = "*", threads: int = 4, **kwargs: Any) -> Worker:
    config = kwargs.pop("config", None) or task_backends["default"].config
    return Worker(
        config=config,
        worker=WorkerOptions(
            queues=QueueSelector.parse(queues),
            threads=threads,
            poll_interval=kwargs.pop("poll_interval", 0.05),
        ),
        **kwargs,
    )


class WorkerThread:
    """A worker running in a thread of the test process (it has its own connections)."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.errors: list[BaseException] = []
        self.thread = threading.Thread(target=self._run, name="test-worker", daemon=True)

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as error:  # noqa: BLE001 - re-raised in the test thread
            self.errors.append(error)

    def start(self) -> "WorkerThread":
        self.thread.start()
        wait_for(
            lambda: self.worker.registration.id is not None or not self.thread.is_alive(),
            message="the worker to register",
        )
        return self

    def join(self, timeout: float) -> None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the worker did not stop within {timeout} s"
        if self.errors:
            raise self.errors[0]


@contextlib.contextmanager
def worker_thread(
    worker: Worker | None = None, *, timeout: float = 30.0, **kwargs: Any
) -> Iterator[Worker]:
    """Run a worker in a thread for the duration of the block, then stop it gracefully."""
    running = WorkerThread(worker or make_worker(**kwargs)).start()
    try:
        yield running.worker
    finally:
        running.worker.request_stop()
        running.join(timeout)


def drain(*, timeout: float = 30.0, **kwargs: Any) -> Worker:
    """Run a worker until no job is ready or scheduled in its queues, then return it."""
    running = WorkerThread(make_worker(stop_when_empty=True, promote_scheduled=True, **kwargs))
    running.start().join(timeout)
    return running.worker


def child_env(**extra: str) -> dict[str, str]:
    """Environment for a process that must use this test run's database and settings."""
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["STALWART_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


# Every child started and not yet reaped: what a test leaves here (it failed, or forgot one)
# is killed and reaped when it ends (tests/conftest.py, reap_children).
UNREAPED: set["Child"] = set()

# Run before each started child: the kernel SIGKILLs the child if the test run ends without
# reaping it (pytest itself killed, so no fixture's teardown runs); its own children then
# notice their supervisor is gone and stop on their own. util-linux's setpriv sets this and
# execs the command, so no Python runs between the fork and the exec.
_DIE_WITH_THE_TEST_RUN = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []


class Child:
    """A process running ``python -m django …`` (or another module) against the test
    database. Always reaped: by the test, or else when it ends (``UNREAPED``)."""

    def __init__(
        self,
        *args: str,
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
        module: str = "django",
    ) -> None:
        """``prefix``: a command to run it under, e.g. ``faketime -f +30s``. ``module``: the
        module ``python -m`` runs (a web server's, say: ``gunicorn``)."""
        self.args = args
        # A file, not a pipe: a pipe nobody reads fills up and blocks the child's logging.
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - closed in _collect()
        self.process = subprocess.Popen(
            [*_DIE_WITH_THE_TEST_RUN, *prefix, sys.executable, "-m", module, *args],
            cwd=ROOT,
            env=env or child_env(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._output: str | None = None
        UNREAPED.add(self)

    @property
    def output(self) -> str:
        """Everything the child printed so far."""
        if self._output is not None:
            return self._output
        self._log.flush()
        self._log.seek(0)
        return self._log.read()

    def _collect(self) -> None:
        if self._output is None:
            self._output = self.output
            self._log.close()
        UNREAPED.discard(self)

    @property
    def pid(self) -> int:
        return self.process.pid

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, signum)

    def wait(self, timeout: float = 30.0) -> int:
        """Wait for exit; on timeout kill the whole process group and fail."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.process.wait()
            self._collect()
            raise AssertionError(
                f"{' '.join(self.args)} did not exit within {timeout} s:\n{self.output}"
            ) from None
        self._collect()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the child and every process under it, all as of one instant: the tree is
        stopped first, so no process in it sees another die (a worker that noticed its
        supervisor gone would drain and deregister) or forks a new one meanwhile. Forked
        children lead groups of their own, so killing the child's group alone would leave
        them."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGSTOP)
        try:
            root = psutil.Process(self.process.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.suspend()
        for process in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.kill()
        self.process.wait()
        self._collect()


def register_processes(*ids: int) -> None:
    """Process rows with these ids: only a registered process may claim jobs."""
    from django.db.models.functions import Now

    from stalwart.models import Process

    for process_id in ids:
        Process.objects.create(
            id=process_id,
            kind="worker",
            name=f"worker-test-{process_id}",
            pid=os.getpid(),
            hostname="test",
            created_at=Now(),
            last_heartbeat_at=Now(),
        )
    # Explicit ids do not move PostgreSQL's sequence; move it so later rows do not collide.
    from django.core.management.color import no_style

    with connection.cursor() as cursor:
        for statement in connection.ops.sequence_reset_sql(no_style(), [Process]):
            cursor.execute(statement)


class ApplicationTransaction:
    """An application's transaction, in a thread and connection of its own: it runs
    ``statements`` (SQL and parameters), then holds what they lock until ``end()``, when it
    commits. Use it as a context manager, or ``begin()`` and ``end()`` mid-test."""

    def __init__(self, *statements: tuple[str, list]) -> None:
        self.statements = statements
        self._holding = threading.Event()
        self._release = threading.Event()
        self._thread = threading.Thread(target=self._run, name="test-application")

    def _run(self) -> None:
        try:
            with connections["default"].cursor() as cursor:
                cursor.execute("BEGIN")
                for sql, params in self.statements:
                    cursor.execute(sql, params)
                self._holding.set()
                self._release.wait(60)
                cursor.execute("COMMIT")
        finally:
            connections.close_all()

    def begin(self) -> "ApplicationTransaction":
        self._thread.start()
        assert self._holding.wait(10), "the application's transaction did not begin"
        return self

    def end(self) -> None:
        self._release.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def __enter__(self) -> "ApplicationTransaction":
        return self.begin()

    def __exit__(self, *exc: object) -> None:
        self.end()


def locking_job_row(job_id: Any) -> ApplicationTransaction:
    """An application's transaction that holds a job's row (``SELECT … FOR UPDATE``)."""
    return ApplicationTransaction(
        ("SELECT 1 FROM stalwart_job WHERE id = %s FOR UPDATE", [str(job_id)])
    )


@contextlib.contextmanager
def session_lock_timeout(seconds: float) -> Iterator[None]:
    """Give up on a row lock after ``seconds`` (a wait raises) on this thread's session, until
    the block ends: PostgreSQL's ``lock_timeout``, InnoDB's ``innodb_lock_wait_timeout``
    (whole seconds, 1 at least).

    Not behind PgBouncer in transaction mode: there a ``SET`` stays with whichever server
    session ran it, and reaches the clients that get that session next (use
    ``transaction_lock_timeout``)."""
    assert not PGBOUNCER, "a session setting leaks through a pooler in transaction mode"
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SET SESSION innodb_lock_wait_timeout = %s", [max(1, round(seconds))])
        else:
            cursor.execute(f"SET lock_timeout = '{round(seconds * 1000)}ms'")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            if connection.vendor == "mysql":
                cursor.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT")
            else:
                cursor.execute("RESET lock_timeout")


@contextlib.contextmanager
def transaction_lock_timeout(seconds: float) -> Iterator[None]:
    """One transaction (``atomic``) in which a row lock waited on for ``seconds`` raises:
    ``SET LOCAL lock_timeout`` on PostgreSQL, which ends with the transaction, so it holds
    behind PgBouncer in transaction mode too and leaks to no one; InnoDB's
    ``innodb_lock_wait_timeout`` (whole seconds, 1 at least) on MySQL, set back after."""
    from django.db import transaction

    with transaction.atomic():
        with connection.cursor() as cursor:
            if connection.vendor == "mysql":
                wait = max(1, round(seconds))
                cursor.execute("SET SESSION innodb_lock_wait_timeout = %s", [wait])
            else:
                cursor.execute(f"SET LOCAL lock_timeout = '{round(seconds * 1000)}ms'")
        try:
            yield
        finally:
            if connection.vendor == "mysql":
                with connection.cursor() as cursor:
                    cursor.execute("SET SESSION innodb_lock_wait_timeout = DEFAULT")


# How long a claim a race test makes directly may wait on a row lock. A claim skips locked
# rows, so never waits on one: a claim that stopped skipping them raises after this, instead
# of hanging the test until the run's timeout.
CLAIM_PATIENCE = 5.0


@contextlib.contextmanager
def impatient(seconds: float = CLAIM_PATIENCE) -> Iterator[None]:
    """A transaction in which waiting on a row lock for ``seconds`` raises
    (``transaction_lock_timeout``), around a claim or another statement that must never wait
    on one. On SQLite, nothing: its one writer waits for the database lock, as it should."""
    if connection.vendor == "sqlite":
        yield
        return
    with transaction_lock_timeout(seconds):
        yield


def row_locks(vendor: str, reason: str) -> None:
    """Skip unless the database has row locks (PostgreSQL, MySQL/MariaDB's InnoDB)."""
    if vendor not in ("postgresql", "mysql"):
        pytest.skip(reason)


def _ten_outcomes() -> list:
    from stalwart.db import Outcome

    return [Outcome(id=uuid.uuid4(), attempt=1, status="successful") for _ in range(10)]


# The statements that lock rows other statements may lock, each a call on (statements,
# cursor): they must take their row locks in id order, so that no two of them deadlock. Held
# to that on PostgreSQL by its plans (tests/concurrency/test_lock_order.py), on MySQL by the
# SQL itself (tests/integration/test_mysql.py).
LOCKING_STEPS = [
    pytest.param(lambda s, c: s.finish(c, owner=1, outcomes=_ten_outcomes()), id="finish"),
    pytest.param(
        lambda s, c: s.release_rows(c, owner=1, jobs=[Interruption(uuid.uuid4(), 1, "stop")]),
        id="release",
    ),
    pytest.param(
        lambda s, c: s.release_owner_rows(c, owner=1, error_class="x", error_text="y"),
        id="release_owner",
    ),
    pytest.param(
        lambda s, c: s.delete_batch(
            c, statuses=["failed"], conditions="", params=[], limit=1000, older_than=60
        ),
        id="retention",
    ),
    pytest.param(
        lambda s, c: s.delete_batch(
            c, statuses=["failed"], conditions="AND queue_name = %s", params=["q"], limit=10
        ),
        id="discard",
    ),
    pytest.param(
        lambda s, c: s.requeue_batch(
            c, status="failed", conditions="", params=[], limit=1000, grant_attempt=True
        ),
        id="retry",
    ),
    pytest.param(lambda s, c: s.cancel_batch(c, conditions="", params=[], limit=1000), id="cancel"),
]


def in_a_bookkeeping_session(sql: str, *, pooled: bool = False) -> tuple:
    """Run ``sql`` in a session the queue opens for its own bookkeeping (as a worker named
    ``stalwart:worker:4242`` would, with a 1.25 s statement and a 0.5 s lock timeout), on a
    thread of its own, and return its one row."""
    from stalwart.db.session import bookkeeping

    seen: list[tuple] = []

    def bookkeeping_thread() -> None:
        try:
            bookkeeping(
                "default",
                application_name="stalwart:worker:4242",
                statement_timeout=1.25,
                lock_timeout=0.5,
                pooled=pooled,
            )
            with connections["default"].cursor() as cursor:
                cursor.execute(sql)
                seen.append(cursor.fetchone())
        finally:
            connections.close_all()

    thread = threading.Thread(target=bookkeeping_thread)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "the bookkeeping session did not answer"
    assert seen, "the bookkeeping session failed"
    return seen[0]


def at_once[T](racers: int, work: Callable[[int], T]) -> list[T]:
    """Run ``work(0)`` … ``work(racers - 1)`` on threads of their own (connections of their
    own), released together by a barrier; return what they returned, in the order they
    finished. Fails if any raised, or had not finished 30 s later."""
    barrier = threading.Barrier(racers)
    results: list[T] = []
    errors: list[BaseException] = []

    def race(number: int) -> None:
        try:
            barrier.wait(timeout=10)
            results.append(work(number))
        except BaseException as error:  # noqa: BLE001 - asserted below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=race, args=(number,)) for number in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads), "a racer did not finish"
    assert errors == []
    return results
