"""MySQL 8.0+ and MariaDB 10.6+ (InnoDB): the claim protocol as short locking transactions.

Neither has ``UPDATE … RETURNING`` (MariaDB has it for INSERT and DELETE only), nor an
``UPDATE`` whose subquery reads the table it writes (MySQL), nor ``ON CONFLICT``. So each step
that PostgreSQL does in one statement is here one short transaction of a few statements:

1. a locking read picks the rows, in the step's order: ``FOR UPDATE SKIP LOCKED`` where
   contention is normal (claim, promotion: rows another transaction holds are skipped, never
   waited on), ``FOR UPDATE`` in id order where it is not (finish, release, bulk control);
2. an ``UPDATE … WHERE id IN (…)`` that checks the state again (fenced: on status, owner,
   attempt, as on every database);
3. where the caller needs rows back, a ``SELECT`` of those ids, which the locks taken in
   step 1 keep ours until the transaction ends.

The connection runs at ``READ COMMITTED`` (Django's default on MySQL, and what
``docs/how-to/use-mysql.md`` asks for): a locking read then locks the rows it returns, not the
gaps between index entries, so a claim never blocks an enqueue, and two claims skip each
other's rows. A locking read reads the newest committed row, so a job another worker has just
claimed reads as ``running`` and is not picked again.

Unique keys: MySQL has no partial unique index. Migration 0010 adds a generated column,
``unique_holder``, that is the job's unique key while it waits (or runs, for a job unique
while running) and NULL otherwise, with a UNIQUE index on it: NULLs never collide, so the index
is exactly PostgreSQL's partial one. Two enqueues of one key serialise on the index entry; the
second finds it taken (error 1062, inside a savepoint) and reports the twin.

Wake-ups: there is no LISTEN/NOTIFY; idle workers poll (``polling_interval``, 0.1 s by
default in a dispatcher: the pick-up latency is at most one interval, half of one on average).

The clock is the database's: ``UTC_TIMESTAMP(6)``, whatever the session's time zone (Django
stores UTC in ``DATETIME(6)`` columns when ``USE_TZ`` is on).

MySQL's other differences sit with their concerns, in the module of each (``slots``,
``uniqueness``, ``control``, ``processes``, ``leases``, ``counters``, ``dialect``), and
``stalwart.db.mysql`` lists them.
"""

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from stalwart.db.claims import NO_LIVE_OWNER, Claims, Held, judge_given, judge_owner
from stalwart.db.decoding import decode_rows
from stalwart.db.dialect import MYSQL_DUPLICATE_KEY, MYSQL_NOW, marks
from stalwart.db.errors import mysql_errno
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
from stalwart.models.job import FINISHED_STATES
from stalwart.queues import QueuePattern

# The states of the jobs ``waiting_queues`` looks for.
_WAITING = ("scheduled", "blocked", "ready")
# The insert: whether a new job is due, and since when, is the database clock's verdict on
# its run_after (as on PostgreSQL); status takes the status asked for (a job that waits for
# its parents stays pending), run_after and concurrency_key; available_at takes run_after.
_BY_THE_DATABASE_CLOCK = {
    "status": f"CASE WHEN %s = 'pending' THEN 'pending' WHEN %s > {MYSQL_NOW} THEN 'scheduled' "
    "WHEN %s IS NOT NULL THEN 'blocked' ELSE 'ready' END",
    "available_at": f"GREATEST(COALESCE(%s, {MYSQL_NOW}), {MYSQL_NOW})",
}
_ROW = (
    "("
    + ", ".join(
        [_BY_THE_DATABASE_CLOCK.get(name, "%s") for name in INSERT_COLUMNS]
        + list(INSERT_CONSTANTS.values())
    )
    + ")"
)
_INSERT_INTO = f"INSERT INTO stalwart_job ({', '.join([*INSERT_COLUMNS, *INSERT_CONSTANTS])})"
_CLAIM_SELECT = ", ".join(CLAIM_COLUMNS)


def _moment() -> str:
    """The time recorded in an error or interruption entry (the host's: for reading only)."""
    return timezone.now().isoformat()


class MySQLClaims(Claims):
    # Placeholders per statement stay far under MySQL's 65,535.
    insert_chunk = 1000

    if TYPE_CHECKING:
        # From MySQLDialect and MySQLUniqueness, which MySQLStatements combines with this.
        def _restore_lock_wait(self, cursor: Any) -> None: ...
        def _key_after(
            self, cursor: Any, job_id: Any, key: str | None, status: str, taken: set[str]
        ) -> str | None: ...

    def queue_filter(
        self, pattern: QueuePattern, excluded: Sequence[QueuePattern]
    ) -> tuple[str, list]:
        # A backslash is an escape character in MySQL's string literals too: '\\' is one.
        sql, params = super().queue_filter(pattern, excluded)
        return sql.replace("ESCAPE '\\'", "ESCAPE '\\\\'"), params

    def insert_params(self, job: NewJob) -> list:
        values = dict(zip(INSERT_COLUMNS, super().insert_params(job), strict=True))
        params = []
        for name in INSERT_COLUMNS:
            if name == "status":
                params += [values["status"], values["run_after"], values["concurrency_key"]]
            elif name == "available_at":
                params.append(values["run_after"])
            else:
                params.append(values[name])
        return params

    def insert_chunk_of(self, cursor: Any, jobs: Sequence[NewJob], notify: bool) -> None:
        params: list = []
        for job in jobs:
            params.extend(self.insert_params(job))
        cursor.execute(f"{_INSERT_INTO} VALUES {', '.join([_ROW] * len(jobs))}", params)

    def insert_unique(self, cursor: Any, job: NewJob, notify: bool) -> bool:
        # A savepoint: a twin's key (error 1062) undoes this insert only, and is an answer.
        try:
            with transaction.atomic(using=self.connection.alias):
                cursor.execute(f"{_INSERT_INTO} VALUES {_ROW}", self.insert_params(job))
        except IntegrityError as error:
            if mysql_errno(error) == MYSQL_DUPLICATE_KEY:
                return False
            raise
        return True

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
        conditions, filter_params = self.queue_filter(pattern, excluded)
        with self._atomic():
            # Only a registered process claims, and its row cannot be deleted until this
            # claim commits: a prune then finds these jobs and releases them.
            cursor.execute(
                "SELECT id FROM stalwart_process WHERE id = %s LOCK IN SHARE MODE", [owner]
            )
            if cursor.fetchone() is None:
                return []
            cursor.execute(
                f"""
                SELECT id FROM stalwart_job
                WHERE status = 'ready' AND isolated = %s {conditions}
                ORDER BY priority DESC, available_at, id
                LIMIT %s
                FOR UPDATE SKIP LOCKED
                """,
                [isolated, *filter_params, limit],
            )
            ids = self._ids(cursor.fetchall())
            if not ids:
                return []
            cursor.execute(
                f"""
                UPDATE stalwart_job
                SET status = 'running',
                    owner = %s,
                    attempt = attempt + 1,
                    started_at = COALESCE(started_at, {MYSQL_NOW}),
                    last_attempted_at = {MYSQL_NOW},
                    worker_ids = JSON_ARRAY_APPEND(worker_ids, '$', %s)
                WHERE id IN ({marks(ids)}) AND status = 'ready'
                """,
                [owner, worker_name, *ids],
            )
            cursor.execute(
                f"SELECT {_CLAIM_SELECT} FROM stalwart_job "
                f"WHERE id IN ({marks(ids)}) AND status = 'running' AND owner = %s",
                [*ids, owner],
            )
            return self.claimed_from_rows(cursor.fetchall())

    def finish(self, cursor: Any, *, owner: int, outcomes: Sequence[Outcome]) -> dict:
        try:
            return self._finish(cursor, owner=owner, outcomes=outcomes)
        finally:
            self._restore_lock_wait(cursor)

    def _finish(self, cursor: Any, *, owner: int, outcomes: Sequence[Outcome]) -> dict:
        # Outcomes in id order, so concurrent writers lock rows in one order.
        outcomes = sorted(outcomes, key=lambda outcome: outcome.id)
        by_id = {outcome.id: outcome for outcome in outcomes}
        ids = [self.uuid_param(outcome.id) for outcome in outcomes]
        written: dict[uuid.UUID, Any] = {}
        with self._atomic():
            cursor.execute(
                f"SELECT id, attempt, unique_key FROM stalwart_job WHERE id IN ({marks(ids)}) "
                "AND status = 'running' AND owner = %s ORDER BY id FOR UPDATE",
                [*ids, owner],
            )
            ours = [
                (self._uuid(job_id), key)
                for job_id, attempt, key in cursor.fetchall()
                if by_id[self._uuid(job_id)].attempt == attempt
            ]
            taken: set[str] = set()
            for job_id, key in sorted(ours):
                outcome = by_id[job_id]
                param = self.uuid_param(job_id)
                retry_at = "available_at"
                retry_params: list = []
                if outcome.retry_in is not None:
                    retry_at = f"{MYSQL_NOW} + INTERVAL %s MICROSECOND"
                    retry_params = [round(outcome.retry_in * 1_000_000)]
                cursor.execute(
                    f"""
                    UPDATE stalwart_job
                    SET status = %s,
                        owner = CASE WHEN %s THEN owner END,
                        isolated = 0,
                        finished_at = {MYSQL_NOW if outcome.status in FINISHED_STATES else "NULL"},
                        available_at = {retry_at},
                        return_value = %s,
                        errors = COALESCE(%s, errors),
                        unique_key = %s
                    WHERE id = %s AND status = 'running' AND owner = %s AND attempt = %s
                    """,
                    [
                        outcome.status,
                        outcome.keep_owner,
                        *retry_params,
                        outcome.return_value,
                        outcome.errors,
                        self._key_after(cursor, param, key, outcome.status, taken),
                        param,
                        owner,
                        outcome.attempt,
                    ],
                )
                if cursor.rowcount:
                    written[job_id] = None
            if written:
                ids = [self.uuid_param(job_id) for job_id in written]
                cursor.execute(
                    f"SELECT id, finished_at FROM stalwart_job WHERE id IN ({marks(ids)})", ids
                )
                for job_id, finished_at in decode_rows(
                    self.connection, ["id", "finished_at"], cursor.fetchall()
                ):
                    written[job_id] = finished_at
        return written

    def _held(self, cursor: Any, condition: str, params: list) -> list[tuple[Held, dict]]:
        """Lock running jobs in id order; each as the facts ``judge`` needs, and the columns
        a release needs."""
        names = ["unique_key", "queue_name", "concurrency_key", "concurrency_duration", "task_path"]
        cursor.execute(
            "SELECT id, attempt, JSON_LENGTH(errors), JSON_LENGTH(interruptions), "
            f"max_attempts, max_interruptions, {', '.join(names)} FROM stalwart_job "
            f"WHERE status = 'running' AND {condition} ORDER BY id FOR UPDATE",
            params,
        )
        return [
            (Held(self._uuid(row[0]), *row[1:6]), dict(zip(names, row[6:], strict=True)))
            for row in cursor.fetchall()
        ]

    def _give_back(
        self, cursor: Any, owner: int, held: list[tuple[Held, dict]], verdicts: dict
    ) -> list[Released]:
        released = []
        taken: set[str] = set()
        for job, columns in held:
            verdict = verdicts[job.id]
            if verdict.fails:
                status = "failed"
            else:
                status = "ready" if columns["concurrency_duration"] is None else "blocked"
            param = self.uuid_param(job.id)
            cursor.execute(
                f"""
                UPDATE stalwart_job
                SET status = %s,
                    finished_at = {MYSQL_NOW if verdict.fails else "NULL"},
                    available_at = {MYSQL_NOW if verdict.charged else "available_at"},
                    owner = NULL,
                    isolated = isolated OR %s,
                    unique_key = %s,
                    errors = {
                    "JSON_ARRAY_APPEND(errors, '$', JSON_EXTRACT(%s, '$'))"
                    if verdict.error is not None
                    else "errors"
                },
                    interruptions = {
                    "JSON_ARRAY_APPEND(interruptions, '$', JSON_EXTRACT(%s, '$'))"
                    if verdict.interruption is not None
                    else "interruptions"
                }
                WHERE id = %s AND status = 'running' AND owner = %s AND attempt = %s
                """,
                [
                    status,
                    verdict.isolate,
                    self._key_after(cursor, param, columns["unique_key"], status, taken),
                    *([verdict.error] if verdict.error is not None else []),
                    *([verdict.interruption] if verdict.interruption is not None else []),
                    param,
                    owner,
                    job.attempt,
                ],
            )
            if cursor.rowcount:
                released.append(
                    Released(
                        job.id,
                        status,
                        columns["queue_name"],
                        columns["concurrency_key"],
                        columns["task_path"],
                        verdict.charged,
                    )
                )
        return released

    def release_rows(
        self, cursor: Any, *, owner: int, jobs: Sequence[Interruption], process: str = ""
    ) -> list[Released]:
        attempts = {self._uuid(job.id): job.attempt for job in jobs}
        ids = [self.uuid_param(job_id) for job_id in sorted(attempts)]
        with self._atomic():
            held = [
                (job, columns)
                for job, columns in self._held(
                    cursor, f"owner = %s AND id IN ({marks(ids)})", [owner, *ids]
                )
                if attempts.get(job.id) == job.attempt
            ]
            given = [
                Interruption(self._uuid(job.id), job.attempt, job.cause, job.error_class, job.error)
                for job in jobs
            ]
            verdicts = judge_given(
                [job for job, _ in held], given, process=process, moment=_moment()
            )
            return self._give_back(cursor, owner, held, verdicts)

    def release_owner_rows(
        self,
        cursor: Any,
        *,
        owner: int,
        error_class: str,
        error_text: str,
        death: Death = Death.CRASH,
        suspects: Sequence[Any] | None = None,
        process: str = "",
    ) -> list[Released]:
        with self._atomic():
            held = self._held(cursor, "owner = %s", [owner])
            verdicts = judge_owner(
                [job for job, _ in held],
                death=death,
                suspects=suspects,
                error_class=error_class,
                error_text=error_text,
                process=process,
                moment=_moment(),
            )
            return self._give_back(cursor, owner, held, verdicts)

    def promote_due(self, cursor: Any, *, limit: int, notify: bool) -> tuple[int, list]:
        with self._atomic():
            cursor.execute(
                f"""
                SELECT id, concurrency_key FROM stalwart_job AS candidate
                WHERE status = 'scheduled' AND available_at <= {MYSQL_NOW} {NO_LIVE_OWNER}
                ORDER BY available_at, id
                LIMIT %s
                FOR UPDATE SKIP LOCKED
                """,
                [limit],
            )
            rows = cursor.fetchall()
            if not rows:
                return 0, []
            ids = self._ids(rows)
            # Jobs with a concurrency key wait for a slot (blocked); the others are ready.
            cursor.execute(
                "UPDATE stalwart_job SET status = CASE WHEN concurrency_key IS NULL THEN 'ready' "
                "ELSE 'blocked' END, owner = NULL "
                f"WHERE id IN ({marks(ids)}) AND status = 'scheduled'",
                ids,
            )
            return cursor.rowcount, sorted({row[1] for row in rows if row[1] is not None})

    def waiting_queues(self, cursor: Any) -> list[str]:
        # One descent per (state, queue) of an index on (status, queue_name, …); on MySQL
        # ``stalwart_job_waiting_queue`` and its like hold every state.
        # (A DISTINCT on an index prefix, not a recursive CTE: see ``MySQLSlots.blocked_keys``.)
        cursor.execute(
            "SELECT DISTINCT status, queue_name FROM stalwart_job "
            f"WHERE status IN ({marks(_WAITING)})",
            list(_WAITING),
        )
        return sorted({row[1] for row in cursor.fetchall()})
