"""Tasks the tests enqueue. Each records what a user would check."""

import os
import signal
import threading
import time
from datetime import timedelta
from pathlib import Path

from django.db import connection, transaction
from django.tasks import TaskContext, task
from django.utils import timezone

import stalwart
from tests.testapp.models import Execution


@task
def noop() -> None:
    return None


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def echo(*args, **kwargs) -> dict:
    return {"args": list(args), "kwargs": kwargs}


@task
async def async_add(a: int, b: int) -> int:
    return a + b


@task(takes_context=True)
def whoami(context: TaskContext) -> dict:
    result = context.task_result
    return {"id": result.id, "attempt": context.attempt, "worker_ids": result.worker_ids}


@task
def fail(message: str = "boom") -> None:
    raise ValueError(message)


@task
def exit_process() -> None:
    raise SystemExit(3)


@task
def interrupt() -> None:
    raise KeyboardInterrupt


@task
def returns_unserializable() -> object:
    return {"when": object()}


@task(takes_context=True)
def record(context: TaskContext, label: str = "", sleep: float = 0.0) -> int:
    """Write one Execution row per run: the side table concurrency tests count."""
    started = timezone.now()
    if sleep:
        time.sleep(sleep)
    Execution.objects.create(
        job_id=context.task_result.id,
        label=label,
        attempt=context.attempt,
        pid=os.getpid(),
        started_at=started,
        finished_at=timezone.now(),
    )
    return os.getpid()


@task
def leave_transaction_open() -> None:
    """A badly behaved task: it enters a transaction and never leaves it."""
    transaction.atomic().__enter__()
    Execution.objects.create(job_id="abandoned", pid=os.getpid(), started_at=timezone.now())


@task
def break_connection() -> None:
    """A badly behaved task: it kills its own database connection."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    else:
        connection.connection.close()


@task
def kill_own_process() -> None:
    """A poison job: it takes its worker process down with it, every time."""
    os.kill(os.getpid(), signal.SIGKILL)


# -- tasks with Stalwart's options (stalwart.task works on Django 6.0 and 6.1) -----------------


@stalwart.task(takes_context=True, max_attempts=4, backoff=0)
def flaky(context: TaskContext, failures: int) -> int:
    """Fails its first ``failures`` attempts, then succeeds."""
    if context.attempt <= failures:
        raise ConnectionError(f"attempt {context.attempt} failed")
    return context.attempt


@stalwart.task(max_attempts=5, backoff=0)
def echo_with_retries(*args, **kwargs) -> dict:
    return {"args": list(args), "kwargs": kwargs}


@stalwart.task(max_attempts=3, backoff=0)
def always_fails() -> None:
    raise ConnectionError("never works")


@stalwart.task(max_attempts=3, retry_on=(ConnectionError,), backoff=0)
def fails_without_retry() -> None:
    raise TypeError("not worth retrying")


@stalwart.task(max_attempts=5, backoff=stalwart.Fixed(30))
def fails_slowly() -> None:
    raise ConnectionError("come back in 30 s")


@stalwart.task(timeout=1)
def overruns(seconds: float = 30) -> None:
    time.sleep(seconds)


@stalwart.task(takes_context=True, concurrency_limit=1, concurrency_key="{key}")
def one_at_a_time(context: TaskContext, key: str, sleep: float = 0.0) -> None:
    started = timezone.now()
    if sleep:
        time.sleep(sleep)
    Execution.objects.create(
        job_id=context.task_result.id,
        label=key,
        attempt=context.attempt,
        pid=os.getpid(),
        started_at=started,
        finished_at=timezone.now(),
    )


@stalwart.task(
    concurrency_limit=1, concurrency_key="{key}", concurrency_duration=timedelta(minutes=1)
)
def one_at_a_time_for_a_minute(key: str) -> None:
    return None


@stalwart.task(concurrency_limit=2, concurrency_key=lambda account, **kwargs: account)
def two_per_account(account: int, sleep: float = 0.0) -> None:
    time.sleep(sleep)


@stalwart.task(unique=True)
def unique_report(day: str) -> str:
    return day


@stalwart.task(unique="{account}", unique_while_running=True)
def sync_account(account: int, full: bool = False) -> None:
    return None


_hoard: list[bytes] = []


@task(takes_context=True)
def hog(context: TaskContext, megabytes: int, sleep: float = 0.0) -> int:
    """Keeps what it allocates, as a leaking task would: its worker's memory only grows."""
    _hoard.append(os.urandom(megabytes * 1024 * 1024))
    time.sleep(sleep)
    Execution.objects.create(
        job_id=context.task_result.id,
        label="hog",
        pid=os.getpid(),
        started_at=timezone.now(),
        finished_at=timezone.now(),
    )
    return os.getpid()


@task
def shout_secret(secret: str) -> None:
    raise RuntimeError("the task failed")


@stalwart.task(max_attempts=3, backoff=0, takes_context=True)
def returns_keys_json_writes(context: TaskContext) -> dict:
    """A value json.dumps accepts, though its keys come back as strings; it has side effects
    that a retry would repeat."""
    Execution.objects.create(
        job_id=context.task_result.id, pid=os.getpid(), started_at=timezone.now()
    )
    return {1: "one", 2.5: "two and a half", False: "no", None: "none", "nested": {3: [4]}}


@stalwart.task(max_attempts=5, backoff=0)
def returns_a_set() -> set:
    """Retrying cannot help: the return value never fits JSON."""
    return {1, 2}


@task
def raises_unstorable() -> None:
    """Its error text holds a NUL and a lone surrogate, which databases refuse to store."""
    raise ValueError("nul \x00 and " + b"\xff".decode("utf-8", "surrogateescape"))


@stalwart.task(max_attempts=3, backoff=lambda failures: None)
def broken_backoff() -> None:
    raise ConnectionError("retry me, if you can")


# -- tasks that misbehave the way production code does -----------------------------------------


@task(takes_context=True)
def start_grandchild(context: TaskContext, pidfile: str, then: str = "return") -> None:
    """Starts a long-lived subprocess, records its pid, then returns, dies, or sleeps."""
    import subprocess

    child = subprocess.Popen(["sleep", "120"])  # noqa: S607 - the test's own command
    Path(pidfile).write_text(str(child.pid))
    if then == "die":
        os._exit(3)
    if then == "sleep":
        time.sleep(120)


@task
def hold_the_gil(seconds: int) -> None:
    """Holds the GIL for ``seconds``, as a C extension that never releases it does."""
    import ctypes

    ctypes.PyDLL(None).sleep(seconds)  # PyDLL keeps the GIL across the call


# A gate the next task waits at, for tests that run workers in their own process.
GATE = threading.Event()


@task
def wait_at_gate(seconds: float = 30.0) -> bool:
    """Runs until the test opens ``GATE`` (or ``seconds`` pass): a job still running."""
    return GATE.wait(seconds)


@stalwart.task(max_attempts=3, backoff=0)
def fails_at_gate() -> None:
    """Fails once the test opens ``GATE``, and reads no context: retried, unless someone
    asked it to stop meanwhile."""
    GATE.wait(30)
    raise ConnectionError("failed after the gate")


@stalwart.task(unique=True, max_attempts=3, backoff=0, takes_context=True)
def unique_fails_once(context: TaskContext, day: str) -> str:
    """A unique job whose first attempt fails (once ``GATE`` opens), so that it goes back to
    waiting with its key."""
    if context.attempt == 1:
        GATE.wait(30)
        raise ConnectionError("first attempt fails")
    return day


# -- the fault suite's tasks (tests/faults): each execution recorded in its ledger -------------


def _ledgered(context: TaskContext, seconds: float) -> int:
    from tests.faults import ledger as book

    job, attempt = context.task_result.id, context.attempt
    book.append("start", job, attempt, book.now())
    deadline = book.now() + seconds
    while (left := deadline - book.now()) > 0:
        time.sleep(min(left, book.TICK))
        book.append("tick", job, attempt, book.now())  # still running: when a kill came
    book.append("end", job, attempt, book.now())
    return os.getpid()


@task(takes_context=True)
def ledger(context: TaskContext, seconds: float = 0.0) -> int:
    """Runs ``seconds``, recorded in the ledger; returns its pid."""
    return _ledgered(context, seconds)


@stalwart.task(takes_context=True, max_attempts=3, backoff=stalwart.Fixed(4))
def ledger_fails_once(context: TaskContext) -> int:
    """Its first attempt fails (recorded like any other run); the retry comes 4 s later."""
    pid = _ledgered(context, 0.0)
    if context.attempt == 1:
        raise ConnectionError("the first attempt fails")
    return pid


@task(takes_context=True)
def ledger_enqueue_at(context: TaskContext, at: str, count: int) -> list[str]:
    """Enqueue ``count`` ledger jobs to run after ``at`` (ISO time), from this process."""
    from datetime import datetime

    _ledgered(context, 0.0)
    later = ledger.using(run_after=datetime.fromisoformat(at))
    return [later.enqueue().id for _ in range(count)]


@task
def connection_identity() -> int:
    """Which database session this job's thread used: the server's id for it, or (SQLite) a
    number kept in a temporary table, which lives as long as its connection."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
        elif connection.vendor == "mysql":
            cursor.execute("SELECT CONNECTION_ID()")
        else:
            cursor.execute("CREATE TEMP TABLE IF NOT EXISTS session_mark (mark INTEGER)")
            cursor.execute(
                "INSERT INTO session_mark SELECT abs(random()) "
                "WHERE NOT EXISTS (SELECT 1 FROM session_mark)"
            )
            cursor.execute("SELECT mark FROM session_mark")
        return cursor.fetchone()[0]


@task
def client_connection_identity() -> str:
    """Which client connection (Django's, to its database) this job's thread used: a mark
    kept on the driver's connection object, which lives as long as that connection (a
    server session id would not do behind a pooler in transaction mode)."""
    import uuid

    connection.ensure_connection()
    raw = connection.connection
    mark = getattr(raw, "_stalwart_test_mark", None)
    if mark is None:
        mark = str(uuid.uuid4())
        try:
            raw._stalwart_test_mark = mark
        except AttributeError:  # a driver object without a __dict__: keep marks aside
            mark = _marks.setdefault(id(raw), (raw, mark))[1]
    return mark


_marks: dict[int, tuple[object, str]] = {}


def _hold_the_gil(seconds: float) -> None:
    """As a C extension that never releases the GIL would: no other thread of this process
    runs Python meanwhile (the heartbeat's included)."""
    import ctypes

    libc = ctypes.PyDLL(None)  # PyDLL keeps the GIL across the call
    whole = int(seconds)
    if whole:
        libc.sleep(whole)
    libc.usleep(int((seconds - whole) * 1_000_000))


@task(takes_context=True)
def ledger_holding_the_gil(context: TaskContext, seconds: float, then: float = 0.0) -> int:
    """Recorded in the ledger: holds the GIL ``seconds``, then runs ``then`` more."""
    from tests.faults import ledger as book

    book.append("start", context.task_result.id, context.attempt, book.now())
    _hold_the_gil(seconds)
    return _ledgered_rest(context, then)


def _ledgered_rest(context: TaskContext, seconds: float) -> int:
    """The rest of a ledger run begun with its own start line."""
    from tests.faults import ledger as book

    job, attempt = context.task_result.id, context.attempt
    deadline = book.now() + seconds
    while (left := deadline - book.now()) > 0:
        time.sleep(min(left, book.TICK))
        book.append("tick", job, attempt, book.now())
    book.append("end", job, attempt, book.now())
    return os.getpid()


@task(takes_context=True)
def ledger_hog(context: TaskContext, megabytes: int, seconds: float) -> int:
    """Recorded in the ledger: keeps ``megabytes`` of memory, then runs ``seconds``."""
    from tests.faults import ledger as book

    book.append("start", context.task_result.id, context.attempt, book.now())
    # A megabyte at a time, as a leak grows: one allocation of hundreds of megabytes holds
    # the GIL for seconds on a loaded machine, and that is the GIL holder's scenario.
    chunk = bytearray(os.urandom(1024)) * 1024
    for _ in range(megabytes):
        _hoard.append(bytearray(chunk))
        time.sleep(0)
    return _ledgered_rest(context, seconds)


@task
def exit_at_once() -> None:
    """A poison job: ends its process with ``os._exit(3)``, no clean-up at all."""
    os._exit(3)


@task(takes_context=True)
def spawn_sleeper(context: TaskContext, seconds: float = 60.0) -> None:
    """Starts ``sleep 120`` (its pid recorded in the ledger), then runs ``seconds``."""
    import subprocess

    from tests.faults import ledger as book

    sleeper = subprocess.Popen(["sleep", "120"])  # noqa: S607 - a test task
    book.append("spawned", context.task_result.id, context.attempt, sleeper.pid)
    _ledgered(context, seconds)


@stalwart.task(timeout=1, backoff=0, takes_context=True)
def overruns_recorded(context: TaskContext, seconds: float = 4.0) -> None:
    """Runs past its 1 s timeout; records its start at once and its end when done."""
    row = Execution.objects.create(
        job_id=context.task_result.id,
        label="overrun",
        attempt=context.attempt,
        pid=os.getpid(),
        started_at=timezone.now(),
    )
    time.sleep(seconds)
    Execution.objects.filter(pk=row.pk).update(finished_at=timezone.now())


@stalwart.task(timeout=2)
def gate_with_timeout() -> bool:
    """Waits at ``GATE`` (well within its 2 s timeout, if the test opens it in time)."""
    return GATE.wait(10)


@task
def connection_pool_state() -> dict:
    """Whether this job's connection comes from Django's pool (PostgreSQL only), and how many
    connections this process has taken from its pool so far."""
    Execution.objects.exists()  # take a connection first
    pool = getattr(connection, "pool", None)
    if pool is None:
        return {"pooled": False, "requests": 0}
    return {"pooled": True, "requests": pool.get_stats().get("requests_num", 0)}


@task
def background_thread_state() -> dict:
    from tests.testapp import background

    return background.ticker.state()


@task(takes_context=True)
def until_cancelled(context: stalwart.StalwartTaskContext, seconds: float = 30.0) -> str:
    """Works in small steps, checking between them whether it was asked to stop."""
    Execution.objects.create(
        job_id=context.task_result.id,
        label="until_cancelled",
        attempt=context.attempt,
        pid=os.getpid(),
        started_at=timezone.now(),
    )
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        context.raise_if_cancelled()
        time.sleep(0.02)  # one step of the task's work
    return "finished"


@task
def cancels_itself() -> None:
    from stalwart.exceptions import JobCancelled

    raise JobCancelled("nothing left to do")


@stalwart.task(takes_context=True, max_attempts=2, backoff=1.5)
def fails_once_then_waits(context: TaskContext) -> int:
    """Fails its first attempt; the retry is due 1.5 seconds later."""
    if context.attempt == 1:
        raise ConnectionError("first attempt failed")
    return context.attempt


@task(takes_context=True)
def ledger_insert(context: TaskContext) -> int:
    """One INSERT through the ORM (an ``Execution`` row, in autocommit), recorded in the
    fault suite's ledger once it is committed: a run the database cut short left nothing, in
    the table or in the ledger. Returns its pid."""
    from tests.faults import ledger as book

    job, attempt = context.task_result.id, context.attempt
    started = book.now()
    Execution.objects.create(
        job_id=job, label="insert", attempt=attempt, pid=os.getpid(), started_at=timezone.now()
    )
    book.append("start", job, attempt, started)
    book.append("end", job, attempt, book.now())
    return os.getpid()


# A subprocess that handles TERM (it says so in the ledger) and keeps writing to the ledger.
_WRITER = (
    "import signal, sys, time\n"
    "from tests.faults import ledger as book\n"
    "job, attempt = sys.argv[1], int(sys.argv[2])\n"
    "signal.signal(signal.SIGTERM, lambda *_: book.append('termed', job, attempt, book.now()))\n"
    "while True:\n"
    "    book.append('wrote', job, attempt, book.now())\n"
    "    time.sleep(0.02)\n"
)


@stalwart.task(takes_context=True, max_attempts=3, backoff=0)
def spawn_a_writer_then_die(context: TaskContext) -> int:
    """Attempt 1 starts a subprocess that outlives TERM and keeps writing to the ledger, then
    ends its worker at once (``os._exit(3)``); later attempts run as ledger jobs do."""
    import subprocess
    import sys

    from tests.faults import ledger as book

    job, attempt = context.task_result.id, context.attempt
    if attempt > 1:
        return _ledgered(context, 0.1)
    book.append("start", job, attempt, book.now())
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, job, str(attempt)])
    book.append("spawned", job, attempt, writer.pid)
    ledger = book.Ledger(Path(os.environ[book.ENV]))
    deadline = time.monotonic() + 30
    # Until the writer has written (so its TERM handler is in place), bounded.
    while not any(fields[0] == "wrote" for fields in ledger.lines()):
        if time.monotonic() > deadline:
            break
        time.sleep(0.01)  # polling the ledger for the writer's first line
    os._exit(3)


@task(takes_context=True)
def change_the_kernel_timer(context: TaskContext, how: str = "alarm") -> int:
    """Changes the process's ``ITIMER_REAL`` (``signal.alarm(0)``, or a 600 s timer of its
    own), then waits for the heartbeat to set it back; returns its pid if it did (bounded),
    else 0. Recorded in the ledger."""
    from tests.faults import ledger as book

    job, attempt = context.task_result.id, context.attempt
    book.append("start", job, attempt, book.now())
    try:
        return os.getpid() if _wait_for_the_timer(how) else 0
    finally:
        book.append("end", job, attempt, book.now())


def _wait_for_the_timer(how: str) -> bool:
    if how == "alarm":
        signal.alarm(0)
    else:
        signal.setitimer(signal.ITIMER_REAL, 600)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        if 0 < remaining < 300:  # the heartbeat's kill deadline again
            return True
        time.sleep(0.02)  # polling the timer for the heartbeat's restoration
    return False


@task(takes_context=True)
def plus_parents(context: TaskContext, n: int = 0) -> int:
    """A dependant: ``n`` plus the return values of the jobs it runs after, in order."""
    return n + sum(parent.return_value for parent in context.parent_results())


@task(takes_context=True)
def parent_states(context: TaskContext) -> list[str]:
    """A dependant that runs whatever its parents did: their states, in order."""
    return [parent.status.value for parent in context.parent_results()]


@task(takes_context=True)
def batch_report(context: TaskContext, note: str = "") -> dict:
    """A batch callback: what it reads of its batch."""
    batch = context.batch()
    progress = batch.progress()
    return {
        "note": note,
        "batch": batch.id,
        "total": progress.total,
        "succeeded": progress.succeeded,
        "failed": progress.failed,
        "results": sorted(
            r.return_value for r in batch.results() if r.status.value == "SUCCESSFUL"
        ),
    }


@task(takes_context=True)
def add_then_grow(context: TaskContext, a: int, b: int, more: int = 0) -> int:
    """A batch member that adds ``more`` members to its own batch."""
    for n in range(more):
        context.batch().enqueue(add, n, 100)
    return a + b
