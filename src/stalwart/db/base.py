"""What every database's statements share: the records they take and return, and row decoding.

Each vendor module (``postgresql``, ``sqlite``) holds that database's hot SQL, top to bottom,
as one protocol: insert, claim, finish, release, promote. Every state change is one atomic,
fenced step: a statement that re-checks its condition in its ``WHERE`` clause.
"""

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar

from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from stalwart.models import Job
from stalwart.models.job import CANCELLABLE_STATES
from stalwart.queues import QueuePattern

# The columns a claim returns: everything needed to run the job and report its result.
CLAIM_COLUMNS = (
    "id",
    "task_path",
    "backend",
    "queue_name",
    "priority",
    "args",
    "kwargs",
    "run_after",
    "enqueued_at",
    "started_at",
    "last_attempted_at",
    "attempt",
    "max_attempts",
    "worker_ids",
    "errors",
    "concurrency_key",
    "isolated",
    "unique_key",
    "cancel_requested_at",
)

# The columns an insert writes from each new job, in the order of insert_params()...
INSERT_COLUMNS = (
    "id",
    "task_path",
    "backend",
    "queue_name",
    "priority",
    "status",
    "args",
    "kwargs",
    "run_after",
    "available_at",
    "enqueued_at",
    "max_attempts",
    "concurrency_key",
    "concurrency_limit",
    "concurrency_duration",
    "unique_key",
    "unique_while_running",
)
# ...and those in which every new job starts alike, with these SQL literals.
INSERT_CONSTANTS = {"attempt": "0", "worker_ids": "'[]'", "errors": "'[]'"}


# Not frozen, though nothing changes one once made: a bulk enqueue makes thousands, and a
# frozen dataclass is made three times slower (each field set through object.__setattr__).
@dataclass(slots=True)
class NewJob:
    """A row to insert. ``args`` and ``kwargs`` are already encoded JSON."""

    id: uuid.UUID
    task_path: str
    backend: str
    queue_name: str
    priority: int
    status: str
    args: str
    kwargs: str
    run_after: datetime | None
    available_at: datetime
    enqueued_at: datetime
    max_attempts: int
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    concurrency_duration: float | None = None
    unique_key: str | None = None
    unique_while_running: bool = False


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job as one claim handed it to one process, for one attempt."""

    id: uuid.UUID
    task_path: str
    backend: str
    queue_name: str
    priority: int
    args: list
    kwargs: dict
    run_after: datetime | None
    enqueued_at: datetime
    started_at: datetime
    last_attempted_at: datetime
    attempt: int
    max_attempts: int
    worker_ids: list
    errors: list
    concurrency_key: str | None = None
    # It must run alone: it was running when a process died beside other jobs.
    isolated: bool = False
    unique_key: str | None = None
    # Someone asked the job to stop while an earlier attempt ran: it is not run again.
    cancel_requested_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one attempt, to be written if (and only if) we still own it.

    ``status`` is the new state; ``retry_in`` is set when the job goes back to waiting (a
    retry): the seconds to wait, counted from the database's clock when the outcome is
    written; ``errors`` is the whole new error list (encoded), or None to leave it as is.
    ``keep_owner``: the attempt may still be running in a thread of ours (it timed out), so
    the job stays ours, and is not made ready again, until our process row is gone.
    """

    id: uuid.UUID
    attempt: int
    status: str
    return_value: str | None = None
    errors: str | None = None
    retry_in: float | None = None
    keep_owner: bool = False


class Death(StrEnum):
    """How the process whose jobs are taken back came to an end, which decides who pays.

    A crash is charged to the job that crashed, and only to it."""

    #: It ended on its own, jobs still running in its threads (a stop past its timeout, a
    #: fence): nobody is charged, and nothing changes but the jobs' state.
    NONE = "none"
    #: It died (a signal, a crash, a task's ``os._exit``), and its supervisor saw it: a job
    #: that ran alone is charged; jobs that ran together are not. Either way each is
    #: isolated, to run alone next time, where a death can only be its own.
    CRASH = "crash"
    #: It went silent (pruned) or vanished (orphaned jobs): what ended it is unknown, and
    #: likely not a job (a host lost, a link cut). Each job is charged once; none isolated.
    SILENCE = "silence"


@dataclass(frozen=True, slots=True)
class Released:
    """A job taken back from its process: now ready again, blocked (its concurrency slot
    can expire, so it waits to be handed one again), or failed for good."""

    id: uuid.UUID
    status: str
    queue_name: str
    concurrency_key: str | None = None

    @property
    def failed(self) -> bool:
        """Failed for good (that was its last attempt); otherwise it will run again."""
        return self.status == "failed"


# Caches are per database alias, never per connection: each thread has its own connection
# object, and a cache entry that refers to one would keep it (and its socket) alive for ever.
_converters: dict[tuple[str, tuple[str, ...]], tuple[list[list], list]] = {}


def _detached(converter: Any, connection: BaseDatabaseWrapper) -> Any:
    """``converter``, holding no reference to ``connection``: a method of its ``ops`` is
    bound again, at each call, to the ``ops`` of the connection that decodes."""
    if getattr(converter, "__self__", None) is not connection.ops:
        return converter
    function = converter.__func__

    def convert(value: Any, expression: Any, connection: BaseDatabaseWrapper) -> Any:
        return function(connection.ops, value, expression, connection)

    return convert


def _row_converters(connection: BaseDatabaseWrapper, names: Sequence[str]) -> tuple[list, list]:
    """Django's own converters for these Job columns on this database (cached per alias)."""
    key = (connection.alias, tuple(names))
    if key not in _converters:
        table = Job._meta.db_table
        per_column = []
        for name in names:
            column = Job._meta.get_field(name).get_col(table)
            converters = connection.ops.get_db_converters(column) + column.get_db_converters(
                connection
            )
            per_column.append([_detached(converter, connection) for converter in converters])
        _converters[key] = (
            per_column,
            [Job._meta.get_field(name).get_col(table) for name in names],
        )
    return _converters[key]


def decode_rows(connection: BaseDatabaseWrapper, names: Sequence[str], rows: Sequence) -> list:
    """Turn raw rows of Job columns into Python values, as the ORM would."""
    per_column, columns = _row_converters(connection, names)
    decoded = []
    for row in rows:
        values = []
        for raw, converters, column in zip(row, per_column, columns, strict=True):
            value = raw
            for converter in converters:
                value = converter(value, column, connection)
            values.append(value)
        decoded.append(values)
    return decoded


def decode_json(value: Any) -> Any:
    """A JSON column's value from a raw cursor (text on some drivers, decoded on others)."""
    return json.loads(value) if isinstance(value, str | bytes) else value


def like_prefix(prefix: str) -> str:
    """A LIKE pattern for names starting with ``prefix`` (escape character: backslash)."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


# The states in which a job holds its unique key (the partial unique index's predicate).
_HOLDS_UNIQUE_KEY = (
    "({job}.status IN ('scheduled', 'blocked', 'ready') "
    "OR ({job}.status = 'running' AND {job}.unique_while_running))"
)
# A job may go back to waiting only if no twin (same unique key) holds the key, and, of
# several twins moved in one batch, only the first (smallest id) goes.
# (A job without a key has no twin: ``NULL = key`` is never true. Written as two plain NOT
# EXISTS, not under an ``OR``, so the planner can make them anti-joins on the unique indexes
# rather than one subplan per candidate.)
_NO_WAITING_TWIN = f"""
    AND NOT EXISTS (
        SELECT 1 FROM stalwart_job AS twin
        WHERE twin.unique_key = candidate.unique_key AND twin.id <> candidate.id
          AND {_HOLDS_UNIQUE_KEY.format(job="twin")})
    AND NOT EXISTS (
        SELECT 1 FROM stalwart_job AS sibling
        WHERE sibling.unique_key = candidate.unique_key AND sibling.id < candidate.id
          AND sibling.status = candidate.status)"""


_CANCELLABLE = ", ".join(f"'{state}'" for state in CANCELLABLE_STATES)
# The states in which a job waits for something other than a worker (its time, a slot).
_WAITING = "'scheduled', 'blocked'"

# A scheduled job may keep its owner: its attempt timed out and may still run in a thread of
# that process, so it waits until the process row is gone (see ``Outcome.keep_owner``).
NO_LIVE_OWNER = """
    AND (candidate.owner IS NULL OR NOT EXISTS (
        SELECT 1 FROM stalwart_process AS holder WHERE holder.id = candidate.owner))"""


class Statements:
    """The protocol every database implements. Subclasses hold the SQL.

    An instance is bound to one connection (one thread's) and cheap to make: take one from
    ``statements_for(connection)`` when needed rather than keeping it.
    """

    vendor: ClassVar[str]
    # Rows per INSERT statement, kept under the database's limit on parameters.
    insert_chunk: ClassVar[int] = 1000
    # Whether finish is one statement (so needs no BEGIN when it hands on no slots).
    writes_are_single_statements: ClassVar[bool] = False
    # Whether finish_and_claim exists: outcomes written and jobs claimed in one statement.
    can_finish_and_claim: ClassVar[bool] = False

    # The unique index's predicate as rendered for each database alias.
    _unique_predicates: ClassVar[dict[str, str]] = {}

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection

    # -- helpers ---------------------------------------------------------------------------

    def uuid_param(self, value: uuid.UUID) -> Any:
        return Job._meta.pk.get_db_prep_value(value, self.connection)

    def datetime_param(self, value: datetime | None) -> Any:
        if value is None:
            return None
        return self.connection.ops.adapt_datetimefield_value(value)

    def now_param(self) -> Any:
        return self.datetime_param(timezone.now())

    def now_sql(self) -> tuple[str, list]:
        """SQL for the database clock's "now", and its parameters: only the database's clock
        decides when a job is due, a retry may run or a row is old (where the database has
        a clock to offer; SQLite lives on one host, whose clock it uses)."""
        return "%s", [self.now_param()]

    def queue_filter(
        self, pattern: QueuePattern, excluded: Sequence[QueuePattern]
    ) -> tuple[str, list]:
        """SQL conditions (each starting with AND) selecting the pattern's queues."""
        sql, params = [], []
        if not pattern.matches_all:
            if pattern.is_prefix:
                sql.append("AND queue_name LIKE %s ESCAPE '\\'")
                params.append(like_prefix(pattern.name))
            else:
                sql.append("AND queue_name = %s")
                params.append(pattern.name)
        for exclusion in excluded:
            if exclusion.matches_all:
                sql.append("AND 1 = 0")
            elif exclusion.is_prefix:
                sql.append("AND queue_name NOT LIKE %s ESCAPE '\\'")
                params.append(like_prefix(exclusion.name))
            else:
                sql.append("AND queue_name <> %s")
                params.append(exclusion.name)
        return " ".join(sql), params

    def claimed_from_rows(self, rows: Sequence) -> list[ClaimedJob]:
        jobs = [ClaimedJob(*values) for values in decode_rows(self.connection, CLAIM_COLUMNS, rows)]
        # A claim returns rows in no particular order; start the most urgent first.
        jobs.sort(key=lambda job: (-job.priority, job.enqueued_at, job.id))
        return jobs

    # -- the protocol ----------------------------------------------------------------------

    def insert(self, cursor: Any, jobs: Sequence[NewJob], notify: bool) -> None:
        """Insert jobs, chunked into as few statements as the parameter limit allows.

        Where the database has a clock, it decides whether each job is due (``status``) and
        since when (``available_at``) from its ``run_after``; elsewhere ``NewJob`` says.
        """
        for start in range(0, len(jobs), self.insert_chunk):
            self.insert_chunk_of(cursor, jobs[start : start + self.insert_chunk], notify)

    def insert_chunk_of(self, cursor: Any, jobs: Sequence[NewJob], notify: bool) -> None:
        params: list = []
        for job in jobs:
            params.extend(self.insert_params(job))
        cursor.execute(self.insert_sql(len(jobs)), params)

    @staticmethod
    def insert_sql(rows: int) -> str:
        """``INSERT ... VALUES`` for ``rows`` rows of ``insert_params()``."""
        row = "(" + ", ".join(["%s"] * len(INSERT_COLUMNS) + [*INSERT_CONSTANTS.values()]) + ")"
        return (
            f"INSERT INTO stalwart_job ({', '.join([*INSERT_COLUMNS, *INSERT_CONSTANTS])}) "
            f"VALUES {', '.join([row] * rows)}"
        )

    def claim(
        self,
        cursor: Any,
        *,
        owner: int,
        worker_name: str,
        pattern: QueuePattern,
        excluded: Sequence[QueuePattern],
        limit: int,
        isolated: bool = False,
    ) -> list[ClaimedJob]:
        """Claim up to ``limit`` ready jobs for ``owner``, most urgent first: jobs that are
        not isolated, or, with ``isolated``, isolated ones (see ``Job.isolated``), which a
        worker claims one at a time, when it runs nothing else."""
        raise NotImplementedError

    def isolated_waiting(
        self, cursor: Any, *, pattern: QueuePattern, excluded: Sequence[QueuePattern]
    ) -> bool:
        """Whether an isolated job is ready in these queues (a partial index answers)."""
        conditions, params = self.queue_filter(pattern, excluded)
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM stalwart_job "
            f"WHERE status = 'ready' AND isolated {conditions})",
            params,
        )
        return bool(cursor.fetchone()[0])

    def finish(self, cursor: Any, *, owner: int, outcomes: Sequence[Outcome]) -> dict:
        """Write outcomes still ours; return ``{job id: finished_at}`` for those written."""
        raise NotImplementedError

    def release(
        self, cursor: Any, *, owner: int, jobs: Sequence[tuple[uuid.UUID, int]], notify: bool
    ) -> list[Released]:
        """Put jobs we hold back to waiting (graceful stop) and hand on the concurrency slots
        they gave up; return what became of each. Call inside a transaction."""
        released = self.release_rows(cursor, owner=owner, jobs=jobs)
        self.hand_on_slots(cursor, released, notify=notify)
        return released

    def release_rows(
        self, cursor: Any, *, owner: int, jobs: Sequence[tuple[uuid.UUID, int]]
    ) -> list[Released]:
        """``release`` without the hand-on of slots, which must follow in the transaction."""
        raise NotImplementedError

    def release_owner(
        self,
        cursor: Any,
        *,
        owner: int,
        error_class: str,
        error_text: str,
        notify: bool,
        death: Death = Death.CRASH,
    ) -> list[Released]:
        """Take back every job a process that is gone held, and hand on the concurrency slots
        they gave up. Call inside a transaction.

        Who is charged depends on ``death`` (see ``Death``). A charged job gets the death as
        an error (``error_class``, ``error_text``), and is failed if its failed attempts,
        this one included, reach ``max_attempts``; otherwise it goes to the back of its
        queue's line (``available_at`` now), so that a job which keeps killing workers does
        not keep coming first. The others keep their place. A process that ended on its own
        gives its jobs back uncharged, as a graceful release (``release``) does, so jobs
        given back at each deploy are never failed for it.
        """
        released = self.release_owner_rows(
            cursor, owner=owner, error_class=error_class, error_text=error_text, death=death
        )
        self.hand_on_slots(cursor, released, notify=notify)
        return released

    def release_owner_rows(
        self,
        cursor: Any,
        *,
        owner: int,
        error_class: str,
        error_text: str,
        death: Death = Death.CRASH,
    ) -> list[Released]:
        """``release_owner`` without the hand-on of slots, which must follow in the
        transaction (after the other owners', when several are taken back at once)."""
        raise NotImplementedError

    def promote_due(self, cursor: Any, *, limit: int, notify: bool) -> tuple[int, list]:
        """Move due scheduled jobs on (ready, or blocked if they need a concurrency slot).

        Returns how many moved, and the concurrency keys whose slots should be handed out.
        """
        raise NotImplementedError

    def notify(self, cursor: Any, queue_names: Sequence[str]) -> None:
        """Wake idle workers serving these queues (where the database can)."""

    # -- the process table -----------------------------------------------------------------

    def notify_scheduled(
        self, cursor: Any, *, due_in: float | None = None, due_at: Any = None
    ) -> None:
        """Tell dispatchers a scheduled job is due (only where they listen: PostgreSQL)."""

    def next_due(self, cursor: Any) -> tuple[float, float | None]:
        """The database clock now and the earliest scheduled job's due time, in epoch
        seconds (only where dispatchers listen: PostgreSQL)."""
        raise NotImplementedError

    def ago_sql(self) -> str:
        """SQL for "the database clock minus %s seconds"."""
        raise NotImplementedError

    def ago_params(self, seconds: float) -> list:
        return [seconds]

    def dead_processes(self, cursor: Any, *, threshold: float, exclude: int | None) -> list:
        """Processes whose last heartbeat is older than ``threshold`` seconds (database clock)."""
        cursor.execute(
            "SELECT id, kind, name, pid, hostname, supervisor FROM stalwart_process "
            f"WHERE last_heartbeat_at < {self.ago_sql()} AND id <> %s ORDER BY id",
            [*self.ago_params(threshold), -1 if exclude is None else exclude],
        )
        return cursor.fetchall()

    def delete_child_processes(self, cursor: Any, *, supervisors: Sequence[int], pid: int) -> list:
        """Delete a reaped child's row(s); return (id, kind, name, pid, hostname, metadata)
        of each."""
        cursor.execute(
            "DELETE FROM stalwart_process "
            f"WHERE supervisor IN ({', '.join(['%s'] * len(supervisors))}) AND pid = %s "
            "RETURNING id, kind, name, pid, hostname, metadata",
            [*supervisors, pid],
        )
        return sorted((*row[:5], decode_json(row[5]) or {}) for row in cursor.fetchall())

    def settled(self, cursor: Any, *, owner: int, outcomes: Sequence[Outcome]) -> dict:
        """Of these outcomes, which were written after all: ``{id: finished_at}``.

        Asked after a write whose answer was lost (the connection broke after COMMIT, and
        the retry matched nothing). While our process row stands, no one else takes a job
        from us (only a prune or the orphan sweep would, and both need our row gone), so a
        job no longer running under this attempt for us was moved by our own write.
        """
        if not outcomes:
            return {}
        ids = [outcome.id for outcome in outcomes]
        cursor.execute(
            "SELECT id, status, owner, attempt, finished_at FROM stalwart_job "
            f"WHERE id IN ({', '.join(['%s'] * len(ids))}) "
            "AND EXISTS (SELECT 1 FROM stalwart_process WHERE id = %s)",
            [*(self.uuid_param(job_id) for job_id in ids), owner],
        )
        names = ["id", "status", "owner", "attempt", "finished_at"]
        rows = {row[0]: row for row in decode_rows(self.connection, names, cursor.fetchall())}
        if not rows:
            return {}  # our row is gone (or so are the jobs): nothing can be vouched for
        written = {}
        for outcome in outcomes:
            row = rows.get(outcome.id)
            if row is None:
                continue
            _, status, row_owner, attempt, finished_at = row
            still_ours = status == "running" and row_owner == owner
            if attempt > outcome.attempt or (attempt == outcome.attempt and not still_ours):
                written[outcome.id] = finished_at
        return written

    def owned_running(self, cursor: Any, *, owner: int) -> list:
        """(id, attempt, cancel requested) of each running job ``owner`` holds."""
        cursor.execute(
            "SELECT id, attempt, cancel_requested_at IS NOT NULL FROM stalwart_job "
            "WHERE status = 'running' AND owner = %s",
            [owner],
        )
        pk = Job._meta.pk
        return [
            (
                pk.to_python(row[0]) if not isinstance(row[0], uuid.UUID) else row[0],
                row[1],
                bool(row[2]),
            )
            for row in cursor.fetchall()
        ]

    def wait_briefly_for_locks(self, cursor: Any) -> None:
        """For the rest of this transaction, give up on a lock after a moment (where the
        database can): for writes that may wait on an application's transaction."""

    def without_jit(self, cursor: Any) -> None:
        """For the rest of this transaction, run queries without compiling them (where the
        database would): a bulk statement over thousands of rows is priced high enough to
        be compiled, which costs more than running it."""

    def take_write_lock(self, cursor: Any) -> None:
        """Make the transaction a writer before it reads (SQLite: no read-then-upgrade)."""

    def orphan_owners(self, cursor: Any, *, limit: int | None = None) -> list[int]:
        """Owners of running jobs that have no process row (the ``limit`` smallest)."""
        cursor.execute(
            "SELECT DISTINCT owner FROM stalwart_job WHERE status = 'running' "
            "AND owner IS NOT NULL AND NOT EXISTS ("
            "SELECT 1 FROM stalwart_process WHERE stalwart_process.id = stalwart_job.owner) "
            f"ORDER BY owner{'' if limit is None else ' LIMIT %s'}",
            [] if limit is None else [limit],
        )
        return [row[0] for row in cursor.fetchall()]

    def delete_process_if_dead(
        self, cursor: Any, *, process_id: int, threshold: float
    ) -> dict | None:
        """Delete the row only if it is still silent (compare-and-set); return its metadata
        if deleted, None if not."""
        cursor.execute(
            "DELETE FROM stalwart_process "
            f"WHERE id = %s AND last_heartbeat_at < {self.ago_sql()} RETURNING metadata",
            [process_id, *self.ago_params(threshold)],
        )
        row = cursor.fetchone()
        return None if row is None else (decode_json(row[0]) or {})

    # -- leases and recurring ticks --------------------------------------------------------

    def database_now(self, cursor: Any) -> datetime:
        """The database clock (the host clock where the database has none to offer)."""
        return timezone.now()

    def acquire_lease(self, cursor: Any, *, name: str, holder: str, ttl: float) -> bool:
        """Take or renew the lease ``name`` for ``ttl`` seconds: True if ours, False if not.

        Contention is a return value: never an exception, never a wait on a lock another
        transaction holds, and the caller's transaction stays usable.
        """
        raise NotImplementedError

    def survey_for_prune(
        self,
        cursor: Any,
        *,
        lease: str,
        holder: str,
        ttl: float,
        threshold: float,
        exclude: int | None,
    ) -> tuple[list, bool] | None:
        """Take or renew the pruning lease ``lease``; None if it is not ours. If it is: the
        processes silent for longer than ``threshold`` (as ``dead_processes``), and whether
        a running job may have an owner without a row (here True: the orphan sweep looks)."""
        if not self.acquire_lease(cursor, name=lease, holder=holder, ttl=ttl):
            return None
        return self.dead_processes(cursor, threshold=threshold, exclude=exclude), True

    def release_lease(self, cursor: Any, *, name: str, holder: str) -> bool:
        """Let the lease go now, if we hold it."""
        now, params = self.now_sql()
        cursor.execute(
            f"UPDATE stalwart_lease SET expires_at = {now} WHERE name = %s AND holder = %s",
            [*params, name, holder],
        )
        return cursor.rowcount == 1

    def claim_tick(self, cursor: Any, *, key: str, run_at: datetime, job_id: uuid.UUID) -> bool:
        """Record that the tick ``(key, run_at)`` is enqueued; False if someone already did."""
        now, params = self.now_sql()
        cursor.execute(
            "INSERT INTO stalwart_recurring_run (key, run_at, job_id, created_at) "
            f"VALUES (%s, %s, %s, {now}) ON CONFLICT (key, run_at) DO NOTHING",
            [key, self.datetime_param(run_at), self.uuid_param(job_id), *params],
        )
        return cursor.rowcount == 1

    # -- uniqueness, concurrency keys ------------------------------------------------------

    def insert_unique(self, cursor: Any, job: NewJob, notify: bool) -> bool:
        """Insert one job unless an equal one is waiting (same unique key); True if inserted."""
        cursor.execute(
            f"{self.insert_sql(1)} "
            f"ON CONFLICT (unique_key) WHERE {self.unique_predicate()} DO NOTHING",
            self.insert_params(job),
        )
        inserted = cursor.rowcount == 1
        if inserted and notify and job.status == "ready":
            self.notify(cursor, [job.queue_name])
        return inserted

    def unique_predicate(self) -> str:
        """The partial unique index's condition, as Django wrote it for this database.

        ``ON CONFLICT`` must name the index's predicate; rendering it the way the migration
        did keeps the two identical on every database.
        """
        predicate = self._unique_predicates.get(self.connection.alias)
        if predicate is None:
            from django.db.models.sql import Query

            from stalwart.models.job import UNIQUE_STATES

            query = Query(model=Job, alias_cols=False)
            where = query.build_where(UNIQUE_STATES)
            sql, params = where.as_sql(
                query.get_compiler(connection=self.connection), self.connection
            )
            editor = self.connection.SchemaEditorClass(self.connection)
            predicate = sql % tuple(editor.quote_value(p) for p in params)
            self._unique_predicates[self.connection.alias] = predicate
        return predicate

    @staticmethod
    def unique_key_leaving(table: str, new_status: str, sibling: str) -> str:
        """``unique_key = ...`` for a job leaving ``running``.

        A job unique only while waiting may have got a twin while it ran. If it now goes back
        to waiting (a retry, a release) beside a twin that holds the key, it drops its key: the
        twin will do the work, this job keeps its own course. ``sibling`` is SQL for "another
        job leaving in this same statement with the same key and a smaller id": of several
        twins leaving at once, only the first may keep the key. Finished jobs keep theirs.
        """
        return f"""unique_key = CASE
            WHEN {table}.unique_key IS NOT NULL
             AND {new_status} IN ('scheduled', 'blocked', 'ready')
             AND (EXISTS (
                     SELECT 1 FROM stalwart_job AS twin
                     WHERE twin.unique_key = {table}.unique_key AND twin.id <> {table}.id
                       AND {_HOLDS_UNIQUE_KEY.format(job="twin")})
                  OR EXISTS ({sibling}))
            THEN NULL ELSE {table}.unique_key END"""

    def insert_params(self, job: NewJob) -> list:
        return [
            self.uuid_param(job.id),
            job.task_path,
            job.backend,
            job.queue_name,
            job.priority,
            job.status,
            job.args,
            job.kwargs,
            self.datetime_param(job.run_after),
            self.datetime_param(job.available_at),
            self.datetime_param(job.enqueued_at),
            job.max_attempts,
            job.concurrency_key,
            job.concurrency_limit,
            job.concurrency_duration,
            job.unique_key,
            job.unique_while_running,
        ]

    def lock_concurrency_key(self, cursor: Any, *, key: str, limit: int | None) -> int:
        """Create or lock the key's row (and set its limit, if given); return its limit.

        The row lock (a write, so SQLite's write lock too) serialises everyone who hands
        out this key's slots until the transaction ends.
        """
        now, params = self.now_sql()
        if limit is None:
            cursor.execute(
                f"UPDATE stalwart_concurrency_key SET updated_at = {now} WHERE key = %s "
                "RETURNING slot_limit",
                [*params, key],
            )
        else:
            cursor.execute(
                "INSERT INTO stalwart_concurrency_key (key, slot_limit, updated_at) "
                f"VALUES (%s, %s, {now}) ON CONFLICT (key) DO UPDATE "
                "SET slot_limit = excluded.slot_limit, updated_at = excluded.updated_at "
                "RETURNING slot_limit",
                [key, limit, *params],
            )
        row = cursor.fetchone()
        return 0 if row is None else row[0]

    def job_limit(self, cursor: Any, *, key: str) -> int | None:
        """The limit the key's newest waiting job was enqueued with (the task's, then)."""
        cursor.execute(
            "SELECT concurrency_limit FROM stalwart_job WHERE concurrency_key = %s "
            "AND status = 'blocked' AND concurrency_limit IS NOT NULL ORDER BY id DESC LIMIT 1",
            [key],
        )
        row = cursor.fetchone()
        return None if row is None else row[0]

    def slot_expired(self, job: str) -> tuple[str, list]:
        """SQL (and its parameters) true for a running ``job`` whose concurrency slot has
        expired: its task's ``concurrency_duration`` has passed since the attempt began."""
        raise NotImplementedError

    @staticmethod
    def status_after_release(job: str) -> str:
        """The status of a running ``job`` given back: ``ready``, keeping its concurrency
        slot; or, if its slot can expire, ``blocked``, to be handed a slot (perhaps its own)
        by ``hand_on_slots`` under the key's lock.

        Whether the slot has expired is not judged here: a release takes no key lock, so a
        hand-out running at the same time may count the slot as expired and give it away
        while this release still sees it as held. Under the key's lock, the two agree.
        """
        return f"CASE WHEN {job}.concurrency_duration IS NULL THEN 'ready' ELSE 'blocked' END"

    def slot_holders(self, cursor: Any, *, key: str) -> int:
        """How many of the key's slots are taken: by ready jobs, and running ones whose slot
        has not expired."""
        expired, params = self.slot_expired("stalwart_job")
        cursor.execute(
            "SELECT count(*) FROM stalwart_job "
            "WHERE concurrency_key = %s AND status IN ('ready', 'running') "
            f"AND NOT (status = 'running' AND {expired})",
            [key, *params],
        )
        return cursor.fetchone()[0]

    def lock_free_slots(self, cursor: Any, *, key: str, limit: int | None) -> int:
        """Lock the key's row (storing ``limit`` if given) and return how many of its slots
        are free (zero or less: none)."""
        stored = self.lock_concurrency_key(cursor, key=key, limit=limit)
        if not stored:  # no row yet: the limit its jobs were enqueued with
            stored = self.lock_concurrency_key(
                cursor, key=key, limit=self.job_limit(cursor, key=key) or 0
            )
        return stored - self.slot_holders(cursor, key=key)

    def free_slots(self, cursor: Any, limits: dict[str, int]) -> dict[str, int]:
        """The free slots of the keys of ``limits`` (key: slot limit, rows locked by the
        caller), for the keys that have any."""
        keys = sorted(limits)
        if not keys:
            return {}
        marks = ", ".join(["%s"] * len(keys))
        expired, expired_params = self.slot_expired("stalwart_job")
        cursor.execute(
            "SELECT concurrency_key, count(*) FROM stalwart_job "
            f"WHERE concurrency_key IN ({marks}) AND status IN ('ready', 'running') "
            f"AND NOT (status = 'running' AND {expired}) GROUP BY concurrency_key",
            [*keys, *expired_params],
        )
        holders = dict(cursor.fetchall())
        return {
            key: limits[key] - holders.get(key, 0)
            for key in keys
            if limits[key] - holders.get(key, 0) > 0
        }

    def unblock(self, cursor: Any, *, key: str, notify: bool, limit: int | None = None) -> int:
        """Hand the key's free slots to its blocked jobs, most urgent first; return how many.

        Call inside a transaction: the key's row stays locked until it ends.
        """
        free = self.lock_free_slots(cursor, key=key, limit=limit)
        if free <= 0:
            return 0
        cursor.execute(
            "UPDATE stalwart_job SET status = 'ready' WHERE status = 'blocked' AND id IN ("
            "SELECT id FROM stalwart_job WHERE status = 'blocked' AND concurrency_key = %s "
            "ORDER BY priority DESC, available_at, id LIMIT %s) RETURNING queue_name",
            [key, free],
        )
        queues = [row[0] for row in cursor.fetchall()]
        if queues and notify:
            self.notify(cursor, queues)
        return len(queues)

    def hand_on_slots(self, cursor: Any, released: Sequence[Released], notify: bool) -> None:
        """Hand on the concurrency slots that released jobs gave up, in their transaction.

        A job failed for good frees its slot. A job back to ``blocked`` (its slot can expire)
        gave its slot up, and is handed one now if one is free: its own, unless its slot
        expired and went to another job meanwhile. A job back to ``ready`` keeps its slot.
        """
        keys = {
            job.concurrency_key
            for job in released
            if job.status in ("failed", "blocked") and job.concurrency_key is not None
        }
        for key in sorted(keys):
            self.unblock(cursor, key=key, notify=notify)

    def blocked_keys(
        self, cursor: Any, *, after: str | None = None, limit: int = 1000
    ) -> list[str]:
        """Up to ``limit`` concurrency keys with blocked jobs, in order, after ``after``: one
        descent of ``stalwart_job_blocked`` per key (a loose index scan), whatever the number
        of blocked jobs."""
        cursor.execute(
            """
            WITH RECURSIVE blocked_key(key) AS (
                SELECT min(concurrency_key) FROM stalwart_job
                WHERE status = 'blocked' AND concurrency_key > %s
                UNION ALL
                SELECT (SELECT min(later.concurrency_key) FROM stalwart_job AS later
                        WHERE later.status = 'blocked'
                          AND later.concurrency_key > blocked_key.key)
                FROM blocked_key WHERE blocked_key.key IS NOT NULL
            )
            SELECT key FROM blocked_key WHERE key IS NOT NULL LIMIT %s
            """,
            ["" if after is None else after, limit],
        )
        return [row[0] for row in cursor.fetchall()]

    def unblock_sweep(
        self, cursor: Any, *, after: str | None, limit: int, notify: bool
    ) -> tuple[int, str | None]:
        """Hand out the free slots of up to ``limit`` keys with blocked jobs (those after
        ``after``, in key order): a few statements for the whole batch, not a transaction
        per key. Returns how many jobs were made ready, and the last key looked at (None
        when no key is left: the sweep is done). Call inside a transaction.

        Each key's row is locked first, in key order, as ``unblock`` locks it: whoever hands
        out a key's slots holds that lock, so the sweep and a finish never both count the
        same free slot.
        """
        self.take_write_lock(cursor)
        keys = self.blocked_keys(cursor, after=after, limit=limit)
        if not keys:
            return 0, None
        return self.unblock_keys(cursor, keys=keys, notify=notify), keys[-1]

    def unblock_keys(self, cursor: Any, *, keys: Sequence[str], notify: bool) -> int:
        """Hand out the free slots of these keys (a few statements for all of them); return
        how many jobs were made ready. Call inside a transaction."""
        keys = sorted(set(keys))
        if not keys:
            return 0
        self.take_write_lock(cursor)
        marks = ", ".join(["%s"] * len(keys))
        cursor.execute(f"SELECT key FROM stalwart_concurrency_key WHERE key IN ({marks})", keys)
        missing = sorted(set(keys) - {row[0] for row in cursor.fetchall()})
        if missing:
            self._add_concurrency_keys(cursor, missing)
        cursor.execute(
            f"SELECT key, slot_limit FROM stalwart_concurrency_key WHERE key IN ({marks}) "
            f"ORDER BY key {self.row_lock}",
            keys,
        )
        free = self.free_slots(cursor, dict(cursor.fetchall()))
        # Each key's most urgent blocked jobs, as many as it has free slots: one statement
        # per 200 keys (SQLite takes at most 500 arms in a compound SELECT).
        free_keys = sorted(free)
        queues: list[str] = []
        for start in range(0, len(free_keys), 200):
            chunk = free_keys[start : start + 200]
            arms = " UNION ALL ".join(
                [
                    (
                        "SELECT * FROM (SELECT id FROM stalwart_job WHERE status = 'blocked' "
                        "AND concurrency_key = %s ORDER BY priority DESC, available_at, id "
                        "LIMIT %s) AS arm"
                    )
                ]
                * len(chunk)
            )
            cursor.execute(
                "UPDATE stalwart_job SET status = 'ready' WHERE status = 'blocked' "
                f"AND id IN ({arms}) RETURNING queue_name",
                [value for key in chunk for value in (key, free[key])],
            )
            queues += [row[0] for row in cursor.fetchall()]
        if queues and notify:
            self.notify(cursor, queues)
        return len(queues)

    def _add_concurrency_keys(self, cursor: Any, keys: Sequence[str]) -> None:
        """Give keys without a row one, with the limit their newest blocked job has."""
        marks = ", ".join(["%s"] * len(keys))
        now, now_params = self.now_sql()
        cursor.execute(
            "INSERT INTO stalwart_concurrency_key (key, slot_limit, updated_at) "
            f"SELECT newest.concurrency_key, newest.concurrency_limit, {now} FROM ("
            "  SELECT concurrency_key, concurrency_limit, row_number() OVER ("
            "    PARTITION BY concurrency_key ORDER BY id DESC) AS rank "
            "  FROM stalwart_job WHERE status = 'blocked' AND concurrency_limit IS NOT NULL"
            f"  AND concurrency_key IN ({marks})"
            ") AS newest WHERE newest.rank = 1 ORDER BY newest.concurrency_key "
            "ON CONFLICT (key) DO NOTHING",
            [*now_params, *keys],
        )

    def waiting_queues(self, cursor: Any) -> list[str]:
        """The queues that have a job ready, blocked or scheduled: one index descent per
        queue (``claim_queue``, ``waiting_queue``), whatever the number of jobs."""
        cursor.execute(
            f"""
            WITH RECURSIVE ready(queue_name) AS (
                SELECT min(queue_name) FROM stalwart_job WHERE status = 'ready'
                UNION ALL
                SELECT (SELECT min(later.queue_name) FROM stalwart_job AS later
                        WHERE later.status = 'ready' AND later.queue_name > ready.queue_name)
                FROM ready WHERE ready.queue_name IS NOT NULL
            ),
            waiting(queue_name) AS (
                SELECT min(queue_name) FROM stalwart_job WHERE status IN ({_WAITING})
                UNION ALL
                SELECT (SELECT min(later.queue_name) FROM stalwart_job AS later
                        WHERE later.status IN ({_WAITING})
                          AND later.queue_name > waiting.queue_name)
                FROM waiting WHERE waiting.queue_name IS NOT NULL
            )
            SELECT queue_name FROM ready WHERE queue_name IS NOT NULL
            UNION
            SELECT queue_name FROM waiting WHERE queue_name IS NOT NULL
            """
        )
        return sorted(row[0] for row in cursor.fetchall())

    def last_ticks(self, cursor: Any) -> list[tuple[str, Any]]:
        """(key, latest run time) of each recurring key: one descent of the (key, run_at)
        unique index per key (a loose index scan), however many ticks are kept."""
        cursor.execute(
            """
            WITH RECURSIVE tick_key(key) AS (
                SELECT min(key) FROM stalwart_recurring_run
                UNION ALL
                SELECT (SELECT min(later.key) FROM stalwart_recurring_run AS later
                        WHERE later.key > tick_key.key)
                FROM tick_key WHERE tick_key.key IS NOT NULL
            )
            SELECT tick_key.key, (
                SELECT max(tick.run_at) FROM stalwart_recurring_run AS tick
                WHERE tick.key = tick_key.key)
            FROM tick_key WHERE tick_key.key IS NOT NULL
            """
        )
        return cursor.fetchall()

    # -- failed and finished jobs, in bounded batches --------------------------------------

    # The times a selection may be bounded by (a column name never comes from a caller).
    _TIME_COLUMNS = frozenset({"enqueued_at", "available_at", "last_attempted_at", "finished_at"})

    def selection_sql(
        self,
        *,
        ids: Sequence[uuid.UUID] = (),
        task_path: str | None = None,
        queue_name: str | None = None,
        priority: int | None = None,
        time_column: str = "enqueued_at",
        since: datetime | None = None,
        until: datetime | None = None,
        state: str | None = None,
    ) -> tuple[str, list]:
        """Extra conditions (each starting with AND) choosing jobs by id, task, queue,
        priority, a time range on one of the jobs' times, and state."""
        sql, params = [], []
        if state is not None:
            sql.append("AND status = %s")
            params.append(state)
        if time_column not in self._TIME_COLUMNS:
            raise ValueError(f"{time_column!r} is not a time a selection can use.")
        if priority is not None:
            sql.append("AND priority = %s")
            params.append(priority)
        if since is not None:
            sql.append(f"AND {time_column} >= %s")
            params.append(self.datetime_param(since))
        if until is not None:
            sql.append(f"AND {time_column} < %s")
            params.append(self.datetime_param(until))
        if ids:
            sql.append(f"AND id IN ({', '.join(['%s'] * len(ids))})")
            params.extend(self.uuid_param(job_id) for job_id in ids)
        if task_path is not None:
            sql.append("AND task_path = %s")
            params.append(task_path)
        if queue_name is not None:
            sql.append("AND queue_name = %s")
            params.append(queue_name)
        return " ".join(sql), params

    # Locks rows as a statement reads them (after ORDER BY id: so in id order), or nothing
    # where the database has one writer at a time anyway.
    row_lock: ClassVar[str] = ""

    def requeue_batch(
        self,
        cursor: Any,
        *,
        status: str,
        conditions: str,
        params: list,
        limit: int,
        grant_attempt: bool,
        after: Any = None,
    ) -> list[tuple[str, str | None, Any]]:
        """Move up to ``limit`` jobs in ``status`` back to waiting; return (queue, key, id)
        of each. ``after``: only jobs with a greater id (the last batch's last id), so that a
        run of batches reads each candidate once, not the jobs it left behind again.

        Jobs with a concurrency key go to ``blocked`` (a slot is then handed out), the rest to
        ``ready``. A failed job gets one more attempt than it has failed. A job whose unique
        key is taken by a waiting twin is left as it is, and so is a scheduled job whose
        timed-out attempt may still run in a live process (its ``owner``). Rows are locked
        in id order.
        """
        attempts = ""
        if grant_attempt:
            failed = self.error_count_sql("errors")
            attempts = (
                f", max_attempts = CASE WHEN max_attempts > {failed} THEN max_attempts "
                f"ELSE {failed} + 1 END"
            )
        now, now_params = self.now_sql()
        cursor.execute(
            f"""
            WITH chosen AS MATERIALIZED (
                SELECT id FROM stalwart_job AS candidate
                WHERE status = %s {"AND id > %s" if after is not None else ""} {conditions}
                  {_NO_WAITING_TWIN} {NO_LIVE_OWNER}
                ORDER BY id LIMIT %s {self.row_lock}
            )
            UPDATE stalwart_job
            SET status = CASE WHEN concurrency_key IS NULL THEN 'ready' ELSE 'blocked' END,
                finished_at = NULL, owner = NULL, available_at = {now}{attempts}
            WHERE status = %s AND id IN (SELECT id FROM chosen)
            RETURNING queue_name, concurrency_key, id
            """,
            [
                status,
                *([self.uuid_param(after)] if after is not None else []),
                *params,
                limit,
                *now_params,
                status,
            ],
        )
        return cursor.fetchall()

    def cancel_batch(
        self, cursor: Any, *, conditions: str, params: list, limit: int
    ) -> list[tuple[str, str | None]]:
        """Cancel up to ``limit`` waiting jobs (scheduled, blocked or ready); return the
        (queue, concurrency key) of each.

        One statement, fenced like every change of state: the rows are locked in id order
        and the state is checked again as they are written. A claim that locked a row first
        wins: the row is running when this statement gets to it, so it is left alone. One
        that comes second skips the locked row (``SKIP LOCKED``), and finds it cancelled.
        The job leaves the unique index's states, so its unique key is free at once; the
        caller hands on the slots of the keys returned, in the same transaction.
        """
        now, now_params = self.now_sql()
        cursor.execute(
            f"""
            WITH chosen AS MATERIALIZED (
                SELECT id FROM stalwart_job
                WHERE status IN ({_CANCELLABLE}) {conditions}
                ORDER BY id LIMIT %s {self.row_lock}
            )
            UPDATE stalwart_job
            SET status = 'cancelled', finished_at = {now}, owner = NULL
            WHERE status IN ({_CANCELLABLE}) AND id IN (SELECT id FROM chosen)
            RETURNING queue_name, concurrency_key
            """,
            [*params, limit, *now_params],
        )
        return cursor.fetchall()

    def request_cancel_batch(
        self, cursor: Any, *, conditions: str, params: list, limit: int
    ) -> int:
        """Ask up to ``limit`` running jobs not asked yet to stop; return how many.

        Only ``cancel_requested_at`` changes: the job stays running, its worker learns of
        the request at its next look at the jobs it holds, and tells the task."""
        now, now_params = self.now_sql()
        cursor.execute(
            f"""
            WITH chosen AS MATERIALIZED (
                SELECT id FROM stalwart_job
                WHERE status = 'running' AND cancel_requested_at IS NULL {conditions}
                ORDER BY id LIMIT %s {self.row_lock}
            )
            UPDATE stalwart_job SET cancel_requested_at = {now}
            WHERE status = 'running' AND cancel_requested_at IS NULL
              AND id IN (SELECT id FROM chosen)
            RETURNING id
            """,
            [*params, limit, *now_params],
        )
        return len(cursor.fetchall())  # (SQLite reports no row count after a WITH)

    def count_cancellable(self, cursor: Any, *, conditions: str, params: list) -> tuple[int, int]:
        """How many waiting jobs ``cancel_batch`` would cancel, and how many running jobs
        ``request_cancel_batch`` would ask to stop (for a dry run)."""
        cursor.execute(
            f"SELECT count(*) FILTER (WHERE status IN ({_CANCELLABLE})), "
            "count(*) FILTER (WHERE status = 'running' AND cancel_requested_at IS NULL) "
            f"FROM stalwart_job WHERE status IN ({_CANCELLABLE}, 'running') {conditions}",
            params,
        )
        waiting, running = cursor.fetchone()
        return waiting, running

    def count_requeueable(self, cursor: Any, *, status: str, conditions: str, params: list) -> int:
        """How many jobs ``requeue_batch`` would move (for a dry run)."""
        cursor.execute(
            f"SELECT count(*) FROM stalwart_job AS candidate "
            f"WHERE status = %s {conditions} {_NO_WAITING_TWIN} {NO_LIVE_OWNER}",
            [status, *params],
        )
        return cursor.fetchone()[0]

    def delete_batch(
        self,
        cursor: Any,
        *,
        statuses: Sequence[str],
        conditions: str,
        params: list,
        limit: int,
        older_than: float | None = None,
    ) -> int:
        """Delete up to ``limit`` jobs in ``statuses`` (finished over ``older_than`` seconds
        ago by the database's clock, if given), locking them in id order; return how many."""
        chosen, chosen_params = self._status_and_age(statuses, older_than)
        cursor.execute(
            f"""
            WITH chosen AS MATERIALIZED (
                SELECT id FROM stalwart_job
                WHERE {chosen} {conditions}
                ORDER BY id LIMIT %s {self.row_lock}
            )
            DELETE FROM stalwart_job WHERE {chosen} AND id IN (SELECT id FROM chosen)
            RETURNING id
            """,
            [*chosen_params, *params, limit, *chosen_params],
        )
        return len(cursor.fetchall())  # (SQLite reports no row count after a WITH)

    def count_selected(
        self,
        cursor: Any,
        *,
        statuses: Sequence[str],
        conditions: str,
        params: list,
        older_than: float | None = None,
    ) -> int:
        chosen, chosen_params = self._status_and_age(statuses, older_than)
        cursor.execute(
            f"SELECT count(*) FROM stalwart_job WHERE {chosen} {conditions}",
            [*chosen_params, *params],
        )
        return cursor.fetchone()[0]

    def _status_and_age(
        self, statuses: Sequence[str], older_than: float | None
    ) -> tuple[str, list]:
        """The condition (and its parameters) for jobs in ``statuses`` that finished more
        than ``older_than`` seconds ago, if given."""
        sql = f"status IN ({', '.join(['%s'] * len(statuses))})"
        if older_than is None:
            return sql, [*statuses]
        return f"{sql} AND finished_at < {self.ago_sql()}", [
            *statuses,
            *self.ago_params(older_than),
        ]

    def delete_old_ticks(self, cursor: Any, *, older_than: float) -> int:
        """Forget recurring ticks over ``older_than`` seconds old, keeping each key's latest."""
        cursor.execute(
            f"DELETE FROM stalwart_recurring_run WHERE run_at < {self.ago_sql()} AND run_at < ("
            "SELECT max(latest.run_at) FROM stalwart_recurring_run AS latest "
            "WHERE latest.key = stalwart_recurring_run.key)",
            self.ago_params(older_than),
        )
        return cursor.rowcount

    # -- metrics ---------------------------------------------------------------------------

    def add_to_counters(self, cursor: Any, counts: Sequence[tuple[tuple, float]]) -> None:
        """Add to the counters ``((name, queue, task, le), amount)``, creating them as needed.

        Sorted by key, so two processes adding at once lock the rows in one order."""
        now, now_params = self.now_sql()
        for start in range(0, len(counts), 500):
            chunk = counts[start : start + 500]
            params: list = []
            for (name, queue, task, le), amount in chunk:
                params.extend([name, queue, task, le, amount, *now_params])
            rows = ", ".join([f"(%s, %s, %s, %s, %s, {now})"] * len(chunk))
            cursor.execute(
                "INSERT INTO stalwart_counter (name, queue_name, task_path, le, value, "
                f"updated_at) VALUES {rows} "
                "ON CONFLICT (name, queue_name, task_path, le) DO UPDATE "
                "SET value = stalwart_counter.value + excluded.value, "
                "updated_at = excluded.updated_at",
                params,
            )

    def error_count_sql(self, column: str) -> str:
        raise NotImplementedError
