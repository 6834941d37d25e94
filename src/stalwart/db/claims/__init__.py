"""The claim protocol: insert, claim, finish, release, take back a dead owner's jobs,
promote due scheduled jobs. What every database shares is here; each database writes the
protocol its own way, top to bottom, in a module of its own: ``postgresql`` (single
statements), ``mysql`` (short locking transactions), ``sqlite`` (one writer at a time).

Every state change is one atomic, fenced step: a statement that re-checks its condition in
its ``WHERE`` clause (a finish or release on status, owner and attempt), so a late result
never overwrites a newer attempt.
"""

import json
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from stalwart.db.decoding import decode_rows
from stalwart.db.dialect import Dialect
from stalwart.db.rows import (
    CLAIM_COLUMNS,
    INSERT_COLUMNS,
    INSERT_CONSTANTS,
    ClaimedJob,
    Death,
    Interruption,
    NewJob,
    Outcome,
    Released,
)
from stalwart.models import Job
from stalwart.queues import QueuePattern


def like_prefix(prefix: str) -> str:
    """A LIKE pattern for names starting with ``prefix`` (escape character: backslash)."""
    return prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


# The error of a job charged for interruptions past its ``max_interruptions``.
JOB_INTERRUPTED = "stalwart.exceptions.JobInterrupted"

# The states in which a job waits for something other than a worker (its time, a slot).
_WAITING = "'scheduled', 'blocked'"

# A scheduled job may keep its owner: its attempt timed out and may still run in a thread of
# that process, so it waits until the process row is gone (see ``Outcome.keep_owner``).
NO_LIVE_OWNER = """
    AND (candidate.owner IS NULL OR NOT EXISTS (
        SELECT 1 FROM stalwart_process AS holder WHERE holder.id = candidate.owner))"""


@dataclass(frozen=True, slots=True)
class Held:
    """A running job being given back, as a database that decides in Python reads it."""

    id: uuid.UUID
    attempt: int
    failed: int  # errors so far: attempts charged
    interrupted: int  # interruptions so far
    max_attempts: int
    max_interruptions: int


@dataclass(frozen=True, slots=True)
class GiveBack:
    """What becomes of one job given back (see ``Death``): charged (``error``, JSON of the
    error to append) or interrupted (``interruption``, JSON of the entry to append),
    failed for good or not, isolated or not."""

    charged: bool
    fails: bool
    isolate: bool
    error: str | None
    interruption: str | None


def judge(
    held: Sequence[Held],
    *,
    suspected: Callable[[Held], bool],
    error_class: Callable[[Held], str],
    exhausted_class: Callable[[Held], str],
    error_text: Callable[[Held], str],
    cause: Callable[[Held], str],
    process: str,
    moment: str,
) -> dict[uuid.UUID, GiveBack]:
    """Who pays, job by job, as PostgreSQL's ``_GIVE_BACK`` decides it in SQL: one suspect
    alone is blamed (charged, isolated); several are isolated and not blamed; a job not
    blamed is interrupted, unless it has used up its free interruptions (then charged)."""
    suspects = sum(1 for job in held if suspected(job))
    verdicts = {}
    for job in held:
        blamed = suspected(job) and suspects == 1
        charged = blamed or job.interrupted >= job.max_interruptions
        entry: dict[str, Any] = {"attempt": job.attempt, "at": moment, "process": process}
        verdicts[job.id] = GiveBack(
            charged=charged,
            fails=charged and job.failed + 1 >= job.max_attempts,
            isolate=suspected(job),
            error=json.dumps(
                {
                    "exception_class_path": error_class(job) if blamed else exhausted_class(job),
                    "traceback": error_text(job),
                    **entry,
                }
            )
            if charged
            else None,
            interruption=None if charged else json.dumps({**entry, "cause": cause(job)}),
        )
    return verdicts


def judge_given(
    held: Sequence[Held], jobs: Sequence[Interruption], *, process: str, moment: str
) -> dict[uuid.UUID, GiveBack]:
    """``judge`` for jobs a live process gives back (``release``): interruptions, each with
    its own cause and error."""
    given = {job.id: job for job in jobs}
    return judge(
        held,
        suspected=lambda job: False,
        error_class=lambda job: given[job.id].error_class,
        exhausted_class=lambda job: given[job.id].error_class,
        error_text=lambda job: given[job.id].error,
        cause=lambda job: given[job.id].cause,
        process=process,
        moment=moment,
    )


def judge_owner(
    held: Sequence[Held],
    *,
    death: Death,
    suspects: Sequence[uuid.UUID] | None,
    error_class: str,
    error_text: str,
    process: str,
    moment: str,
) -> dict[uuid.UUID, GiveBack]:
    """``judge`` for the jobs of a process that is gone (``release_owner``)."""
    named = {str(job_id) for job_id in suspects or ()}
    return judge(
        held,
        suspected=lambda job: death == Death.CRASH and (suspects is None or str(job.id) in named),
        error_class=lambda job: error_class,
        exhausted_class=lambda job: JOB_INTERRUPTED,
        error_text=lambda job: error_text,
        cause=lambda job: error_text,
        process=process,
        moment=moment,
    )


class Claims(Dialect):
    """The protocol's steps, as every database takes and returns them. Each database's
    module holds its SQL; what is the same everywhere is written here once."""

    # Rows per INSERT statement, kept under the database's limit on parameters.
    insert_chunk: ClassVar[int] = 1000
    # Whether finish is one statement (so needs no BEGIN when it hands on no slots).
    writes_are_single_statements: ClassVar[bool] = False
    # Whether finish_and_claim exists: outcomes written and jobs claimed in one statement.
    can_finish_and_claim: ClassVar[bool] = False

    if TYPE_CHECKING:
        # Steps of the sibling mixins that a database's Statements class combines with this
        # one (Uniqueness, Wakeups, Slots): declared for the type checker only.
        def unique_predicate(self) -> str: ...
        def notify(self, cursor: Any, queue_names: Sequence[str]) -> None: ...
        def notify_scheduled(
            self, cursor: Any, *, due_in: float | None = None, due_at: Any = None
        ) -> None: ...
        def hand_on_slots(
            self, cursor: Any, released: Sequence[Released], notify: bool
        ) -> None: ...
        @staticmethod
        def status_after_release(job: str) -> str: ...
        @staticmethod
        def unique_key_leaving(table: str, new_status: str, sibling: str) -> str: ...

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
            job.max_interruptions,
        ]

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
        self,
        cursor: Any,
        *,
        owner: int,
        jobs: Sequence[Interruption],
        notify: bool,
        process: str = "",
    ) -> list[Released]:
        """Give back jobs we hold, whose attempts were interrupted (a stop, a lost claim
        answer, a lost connection), and hand on the concurrency slots they gave up; return
        what became of each. Each interruption is recorded; a job that has used up its
        ``max_interruptions`` is charged instead (see ``Death``). Call inside a
        transaction."""
        released = self.release_rows(cursor, owner=owner, jobs=jobs, process=process)
        self.hand_on_slots(cursor, released, notify=notify)
        return released

    def release_rows(
        self, cursor: Any, *, owner: int, jobs: Sequence[Interruption], process: str = ""
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
        suspects: Sequence[uuid.UUID] | None = None,
        process: str = "",
    ) -> list[Released]:
        """Take back every job a process that is gone held, and hand on the concurrency slots
        they gave up. Call inside a transaction.

        Who is charged depends on ``death`` (see ``Death``): with ``Death.CRASH``, the
        ``suspects`` (None: every job held) are those that may have caused it. A charged job
        gets the death as an error (``error_class``, ``error_text``), and is failed if its
        failed attempts, this one included, reach ``max_attempts``; otherwise it goes to the
        back of its queue's line (``available_at`` now), so that a job which keeps killing
        workers does not keep coming first. The others keep their place, with the death
        recorded as an interruption (``error_text`` its cause); one that has used up its
        ``max_interruptions`` is charged after all (``JobInterrupted``). ``process``: the
        name of the process, recorded with each entry.
        """
        released = self.release_owner_rows(
            cursor,
            owner=owner,
            error_class=error_class,
            error_text=error_text,
            death=death,
            suspects=suspects,
            process=process,
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
        suspects: Sequence[uuid.UUID] | None = None,
        process: str = "",
    ) -> list[Released]:
        """``release_owner`` without the hand-on of slots, which must follow in the
        transaction (after the other owners', when several are taken back at once)."""
        raise NotImplementedError

    def promote_due(self, cursor: Any, *, limit: int, notify: bool) -> tuple[int, list]:
        """Move due scheduled jobs on (ready, or blocked if they need a concurrency slot).

        Returns how many moved, and the concurrency keys whose slots should be handed out.
        """
        raise NotImplementedError

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
