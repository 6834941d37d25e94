"""Steering the queue from Python: pause and resume queues, retry and discard failed jobs,
run scheduled jobs now, cancel jobs, prune finished jobs. The ``queue`` command calls these.

Bulk operations work in bounded batches (``batch_size`` rows per statement, each its own
transaction), so thousands of jobs never hold one long transaction or lock. (Those are
batches of rows; ``stalwart.batch()``'s batches of jobs are pruned by ``prune_batches``.)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, task_backends
from django.utils import timezone

from stalwart import events
from stalwart.aliases import is_stalwart
from stalwart.db import Statements, statements_for
from stalwart.db.retry import retry_transient
from stalwart.db.wakeups import RESUMED
from stalwart.exceptions import NotAStalwartBackend
from stalwart.jobs import JobStore
from stalwart.models import QueuePause
from stalwart.models.job import FINISHED_STATES
from stalwart.queues import QueueSelector, validate_queue_name

if TYPE_CHECKING:
    from django.db.backends.utils import CursorWrapper

    from stalwart.conf import Options
    from stalwart.interface import Backend

BATCH_SIZE = 1000


def _stalwart(backend: str) -> Backend:
    """The Stalwart backend ``TASKS[backend]``; ``NotAStalwartBackend`` if it is another."""
    found = task_backends[backend]
    if not is_stalwart(found):
        raise NotAStalwartBackend(
            f"TASKS[{backend!r}] is {type(found).__qualname__}, not a Stalwart backend "
            "(stalwart.backend.StalwartBackend)."
        )
    return found


def _database(backend: str) -> str:
    return _stalwart(backend).config.database


# -- pausing ---------------------------------------------------------------------------------


def pause(queue_name: str, *, backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> bool:
    """Pause a queue on every host; True if it was running. Running jobs finish."""
    validate_queue_name(queue_name)
    _, created = QueuePause.objects.using(_database(backend)).get_or_create(
        queue_name=queue_name, defaults={"paused_at": timezone.now()}
    )
    if created:
        events.emit("queue_paused", queue=queue_name)
    return created


def resume(queue_name: str, *, backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> bool:
    """Resume a paused queue; True if it was paused."""
    validate_queue_name(queue_name)
    deleted, _ = QueuePause.objects.using(_database(backend)).filter(queue_name=queue_name).delete()
    if deleted:
        events.emit("queue_resumed", queue=queue_name)
        # The backend's own store: it notifies only where listen_notify says workers listen.
        _stalwart(backend).store.wake([f"{RESUMED}{queue_name}"])
    return bool(deleted)


def queue_users(queue_name: str, *, backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> list[str]:
    """What uses ``queue_name``, one phrase each: the project's tasks, ``QUEUES``, recurring
    entries and worker queue lists that name it (a name or a prefix; ``*`` names none), live
    workers that claim from it by name, and jobs ready or failed in it. Empty: most likely
    a misspelt name."""
    from stalwart.models import Job, Process

    stalwart = _stalwart(backend)
    config = stalwart.config
    users = [f"task {path}" for path, name in _task_queues() if name == queue_name]
    if queue_name in stalwart.queues:
        users.append(f"TASKS[{backend!r}]['QUEUES']")
    users += [
        f"recurring entry {entry.key!r}"
        for entry in config.recurring
        if entry.queue_name == queue_name
    ]
    users += [
        f"OPTIONS['workers'][{index}]"
        for index, worker in enumerate(config.workers)
        if _names(worker.queues, queue_name)
    ]
    for process in Process.objects.using(config.database).filter(kind="worker"):
        queues = (process.metadata or {}).get("queues")
        if isinstance(queues, str) and _names(_parse_selector(queues), queue_name):
            users.append(f"worker {process.name}")
    jobs = Job.objects.using(config.database).filter(queue_name=queue_name)
    if jobs.filter(status="ready").exists() or jobs.filter(status="failed").exists():
        users.append("jobs ready or failed in it")
    return users


def named_queues(*, backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> list[str]:
    """The queue names the project's tasks, ``QUEUES`` and recurring entries name."""
    stalwart = _stalwart(backend)
    config = stalwart.config
    names = {name for _, name in _task_queues()} | set(stalwart.queues)
    names |= {entry.queue_name for entry in config.recurring if entry.queue_name}
    return sorted(names)


def _task_queues() -> list[tuple[str, str]]:
    """(path, queue name) of every task defined in the project's task modules."""
    import sys

    from django.tasks import Task

    from stalwart import catalog

    loaded = catalog.load()
    found = []
    for module_name in loaded.loaded if loaded is not None else ():
        module = sys.modules.get(module_name)
        for value in vars(module).values() if module is not None else ():
            if isinstance(value, Task) and value.func.__module__ == module_name:
                found.append((value.module_path, value.queue_name))
    return found


def _parse_selector(text: str) -> QueueSelector | None:
    try:
        return QueueSelector.parse(text)
    except ValueError:
        return None


def _names(selector: QueueSelector | None, queue_name: str) -> bool:
    """Whether a worker queue list names ``queue_name``: by name or by a prefix, not ``*``."""
    if selector is None or not selector.serves(queue_name):
        return False
    return any(
        pattern.matches(queue_name) and not pattern.matches_all for pattern in selector.patterns
    )


def paused_queues(
    *, backend: str = DEFAULT_TASK_BACKEND_ALIAS, database: str | None = None
) -> list[str]:
    """The paused queues, sorted (of ``backend``'s database, or of ``database``)."""
    return sorted(
        QueuePause.objects.using(database or _database(backend)).values_list(
            "queue_name", flat=True
        )
    )


# -- failed and scheduled jobs ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Selection:
    """Which jobs a bulk operation applies to: by id, by task, by queue, or all; further
    narrowed, if given, by priority and a time range (on ``time_column``: the dashboard's
    filters)."""

    ids: Sequence[Any] = ()
    task_path: str | None = None
    queue_name: str | None = None
    everything: bool = False
    priority: int | None = None
    time_column: str = "enqueued_at"
    since: datetime | None = None
    until: datetime | None = None
    state: str | None = None  # only jobs in this state (of those the operation applies to)

    def __post_init__(self) -> None:
        if not (self.ids or self.task_path or self.queue_name or self.everything):
            raise ValueError(
                "Say which jobs: by id, by task, by queue, or all of them (everything=True)."
            )

    def sql(self, statements: Statements) -> tuple[str, list[Any]]:
        """The selection's conditions for ``statements``' database."""
        return statements.selection_sql(
            ids=self.ids,
            task_path=self.task_path,
            queue_name=self.queue_name,
            priority=self.priority,
            time_column=self.time_column,
            since=self.since,
            until=self.until,
            state=self.state,
        )


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a whole number of at least 1, not {batch_size!r}.")


def _batches(
    database: str,
    work: Callable[[CursorWrapper, int], int],
    batch_size: int,
    *,
    conflicts: bool = False,
) -> int:
    """Run ``work(cursor, limit)`` (one transaction each) until a batch comes back short.
    With ``conflicts``, a batch that met a unique-index conflict is tried again (see
    ``retry_transient``)."""
    done = 0
    while True:

        def one_batch() -> int:
            with transaction.atomic(using=database), connections[database].cursor() as cursor:
                return work(cursor, batch_size)

        count = retry_transient(database, one_batch, what="a bulk operation", conflicts=conflicts)
        done += count
        if count < batch_size:
            return done


def _count(
    database: str,
    statuses: Sequence[str],
    selection: Selection,
    older_than: float | None = None,
) -> int:
    connection = connections[database]
    statements = statements_for(connection)
    conditions, params = selection.sql(statements)
    with connection.cursor() as cursor:
        return statements.count_selected(
            cursor,
            statuses=statuses,
            conditions=conditions,
            params=params,
            older_than=older_than,
        )


def _requeue(
    status: str,
    selection: Selection,
    *,
    backend: str,
    dry_run: bool,
    batch_size: int,
    grant_attempt: bool,
) -> int:
    database = _database(backend)
    _check_batch_size(batch_size)
    store = JobStore(database)
    statements: Statements = store.statements
    conditions, params = selection.sql(statements)
    if dry_run:
        with transaction.atomic(using=database), store.connection.cursor() as cursor:
            statements.without_jit(cursor)
            return statements.count_requeueable(
                cursor, status=status, conditions=conditions, params=params
            )

    # Each batch goes on after the last id the one before moved (a keyset), so the jobs a
    # batch leaves behind (a twin waits with their unique key) are not read again and again.
    last: dict[str, Any] = {"id": None}

    def batch(cursor: CursorWrapper, limit: int) -> int:
        statements.without_jit(cursor)
        moved = statements.requeue_batch(
            cursor,
            status=status,
            conditions=conditions,
            params=params,
            limit=limit,
            grant_attempt=grant_attempt,
            after=last["id"],
        )
        for key in sorted({key for _, key, _ in moved if key is not None}):
            statements.unblock(cursor, key=key, notify=store.notify)
        queues = sorted({queue for queue, key, _ in moved if key is None})
        if queues and store.notify:
            statements.notify(cursor, queues)
        if moved:
            last["id"] = max(_job_id(job_id) for _, _, job_id in moved)
        return len(moved)

    # A twin that took a job's unique key in a transaction not yet committed (an enqueue, a
    # dependant revived) is unseen by the twin check; the write waits for it and meets the
    # unique index. Tried again, the check sees the twin and leaves that job where it is.
    return _batches(database, batch, batch_size, conflicts=True)


def _job_id(value: Any) -> Any:
    """A job id from a raw cursor (a UUID, or its text on SQLite)."""
    from stalwart.models import Job

    return Job._meta.pk.to_python(value) if not hasattr(value, "hex") else value


def retry_failed(
    selection: Selection,
    *,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
) -> int:
    """Give failed jobs another attempt (their errors are kept); return how many."""
    count = _requeue(
        "failed",
        selection,
        backend=backend,
        dry_run=dry_run,
        batch_size=batch_size,
        grant_attempt=True,
    )
    if count and not dry_run:
        events.emit("jobs_retried", count=count)
        # The jobs that ran after them, cancelled by their failure, wait for them again.
        from stalwart.db.dependencies import revive

        revived = revive(_database(backend))
        if revived:
            events.emit("dependants_revived", count=revived)
    return count


def run_now(
    selection: Selection,
    *,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
) -> int:
    """Make scheduled jobs claimable now instead of at their time; return how many."""
    return _requeue(
        "scheduled",
        selection,
        backend=backend,
        dry_run=dry_run,
        batch_size=batch_size,
        grant_attempt=False,
    )


def discard_failed(
    selection: Selection,
    *,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
) -> int:
    """Delete failed jobs (``get_result`` then raises ``TaskResultDoesNotExist``)."""
    database = _database(backend)
    _check_batch_size(batch_size)
    if dry_run:
        return _count(database, ["failed"], selection)
    statements = statements_for(connections[database])
    conditions, params = selection.sql(statements)
    count = _batches(
        database,
        lambda cursor, limit: statements.delete_batch(
            cursor, statuses=["failed"], conditions=conditions, params=params, limit=limit
        ),
        batch_size,
    )
    if count:
        events.emit("jobs_discarded", count=count)
    return count


# -- cancelling ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Cancelled:
    """What a cancel did: waiting jobs ``cancelled`` at once, and running jobs ``requested``
    to stop (they stop if and when their task checks ``context.cancel_requested``)."""

    cancelled: int = 0
    requested: int = 0

    def __bool__(self) -> bool:
        return bool(self.cancelled or self.requested)


def cancel_jobs(
    selection: Selection,
    *,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
) -> Cancelled:
    """Cancel the selected waiting jobs (scheduled, blocked, ready) and ask the selected
    running ones to stop. Finished jobs are left as they are.

    Each batch is one fenced statement in its own transaction; the concurrency slots that
    cancelled jobs held are handed on in it. See ``Statements.cancel_batch``.
    """
    database = _database(backend)
    _check_batch_size(batch_size)
    store = JobStore(database)
    statements: Statements = store.statements
    conditions, params = selection.sql(statements)
    if dry_run:
        with store.connection.cursor() as cursor:
            waiting, running = statements.count_cancellable(
                cursor, conditions=conditions, params=params
            )
        return Cancelled(cancelled=waiting, requested=running)

    def batch(cursor: CursorWrapper, limit: int) -> int:
        moved = statements.cancel_batch(cursor, conditions=conditions, params=params, limit=limit)
        for key in sorted({key for _, key in moved if key is not None}):
            statements.unblock(cursor, key=key, notify=store.notify)
        return len(moved)

    cancelled = _batches(database, batch, batch_size)
    # Waiting jobs first: one claimed meanwhile is running by now, and is asked to stop.
    requested = _batches(
        database,
        lambda cursor, limit: statements.request_cancel_batch(
            cursor, conditions=conditions, params=params, limit=limit
        ),
        batch_size,
    )
    # Waiting jobs again: one given back while the requests waited for its row (its worker
    # died, or stopped) is waiting by now, and is cancelled, not run again.
    cancelled += _batches(database, batch, batch_size)
    if cancelled or requested:
        events.emit("jobs_cancelled", count=cancelled, requested=requested)
    return Cancelled(cancelled=cancelled, requested=requested)


# -- retention -------------------------------------------------------------------------------


def prune_finished(
    *,
    older_than: timedelta,
    statuses: Sequence[str] = FINISHED_STATES,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    database: str | None = None,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
) -> int:
    """Delete jobs finished more than ``older_than`` ago, in batches; return how many.

    A job of a batch is kept while its batch is unfinished or finished less than
    ``older_than`` ago (a batch and its jobs go together); a job that a pending job runs
    after is kept too. ``prune_batches`` then deletes the batches left without jobs."""
    database = database or _database(backend)
    _check_batch_size(batch_size)
    # Measured on the database's clock, like the finish times it compares them with.
    seconds = older_than.total_seconds()
    everything = Selection(everything=True)
    if dry_run:
        return _count(database, statuses, everything, older_than=seconds)
    statements = statements_for(connections[database])
    count = _batches(
        database,
        lambda cursor, limit: statements.delete_batch(
            cursor,
            statuses=list(statuses),
            conditions="",
            params=[],
            limit=limit,
            older_than=seconds,
        ),
        batch_size,
    )
    if count:
        events.emit(
            "jobs_pruned",
            count=count,
            statuses=",".join(statuses),
            older_than=older_than.total_seconds(),
        )
    return count


def prune_batches(
    *,
    older_than: timedelta,
    statuses: Sequence[str] = FINISHED_STATES,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    database: str | None = None,
    dry_run: bool = False,
    batch_size: int = BATCH_SIZE,
) -> int:
    """Delete the batches (``stalwart.batch()``) finished more than ``older_than`` ago that
    no job is left in (members and callbacks all deleted), with their leftover links, up to
    ``batch_size`` batches looked at per transaction; return how many were deleted.

    With ``dry_run``, count the batches that ``prune_finished`` with the same ``older_than``
    and ``statuses``, then this, would delete (``statuses`` matters only there)."""
    database = database or _database(backend)
    _check_batch_size(batch_size)
    seconds = older_than.total_seconds()  # on the database's clock, like batches' finish
    connection = connections[database]
    statements = statements_for(connection)
    if dry_run:
        with connection.cursor() as cursor:
            return statements.count_finished_batches(
                cursor, statuses=list(statuses), older_than=seconds
            )
    # Each transaction goes on after the last batch the one before looked at (a keyset), so
    # the old batches still kept by their jobs are read once per call, not once per batch.
    progress: dict[str, Any] = {"after": None, "deleted": 0}

    def batch(cursor: CursorWrapper, limit: int) -> int:
        looked_at, progress["after"], deleted = statements.delete_finished_batches(
            cursor, older_than=seconds, limit=limit, after=progress["after"]
        )
        progress["deleted"] += deleted
        return looked_at

    _batches(database, batch, batch_size)
    count: int = progress["deleted"]
    if count:
        events.emit("batches_pruned", count=count, older_than=seconds)
    return count


def delete_expired_jobs(config: Options, *, batch_size: int = BATCH_SIZE) -> int:
    """Apply ``OPTIONS['retention']``: delete expired finished jobs, the batches they leave
    without jobs, and old recurring ticks; return how many jobs were deleted.

    Each state's jobs go after their own period, counted from their own end and from
    their batch's (a batch's successful members go ``keep_successful`` after the batch
    finished, its failed ones ``keep_failed`` after). A batch with no job left goes once it
    finished longer ago than the shortest period set."""
    deleted = 0
    kept = (
        ("successful", config.keep_successful),
        ("failed", config.keep_failed),
        ("cancelled", config.keep_cancelled),
    )
    for status, keep in kept:
        if keep is not None:
            deleted += prune_finished(
                older_than=keep, statuses=[status], database=config.database, batch_size=batch_size
            )
    shortest = min((keep for _, keep in kept if keep is not None), default=None)
    if shortest is not None:
        prune_batches(older_than=shortest, database=config.database, batch_size=batch_size)
    longest = max((keep for _, keep in kept if keep is not None), default=None)
    if longest is not None:
        connection = connections[config.database]
        with connection.cursor() as cursor:
            statements_for(connection).delete_old_ticks(cursor, older_than=longest.total_seconds())
    return deleted
