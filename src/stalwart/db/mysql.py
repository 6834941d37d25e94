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
"""

import json
import uuid
from collections.abc import Sequence
from datetime import UTC
from typing import Any

from django.db import IntegrityError, transaction

from stalwart.db.base import (
    _CANCELLABLE,
    CLAIM_COLUMNS,
    INSERT_COLUMNS,
    INSERT_CONSTANTS,
    NO_LIVE_OWNER,
    ClaimedJob,
    Death,
    NewJob,
    Outcome,
    Released,
    Statements,
    decode_json,
    decode_rows,
)
from stalwart.db.errors import mysql_errno
from stalwart.models.job import FINISHED_STATES
from stalwart.queues import QueuePattern

NOW = "UTC_TIMESTAMP(6)"
_WAITING = ("scheduled", "blocked", "ready")
_DUPLICATE_KEY = 1062
# The insert: whether a new job is due, and since when, is the database clock's verdict on
# its run_after (as on PostgreSQL); status takes run_after and concurrency_key, available_at
# run_after.
_BY_THE_DATABASE_CLOCK = {
    "status": f"CASE WHEN %s > {NOW} THEN 'scheduled' "
    "WHEN %s IS NOT NULL THEN 'blocked' ELSE 'ready' END",
    "available_at": f"GREATEST(COALESCE(%s, {NOW}), {NOW})",
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
# One key's most urgent blocked jobs (key, how many), locked: an arm of a UNION ALL.
_BLOCKED_HEAD = (
    "(SELECT id FROM stalwart_job WHERE status = 'blocked' AND concurrency_key = %s "
    "ORDER BY priority DESC, available_at, id LIMIT %s FOR UPDATE SKIP LOCKED)"
)


# ``Statements``' twin check (see ``_NO_WAITING_TWIN`` in base), as MySQL runs it fast: a job
# without a key is let through before any subquery (MariaDB otherwise walks every job of the
# candidate's status for each one: 22 s for a batch of 500 among 200,000 jobs, against 10 ms),
# and the twin that holds the key is one look-up of the ``unique_holder`` unique index.
_NO_WAITING_TWIN = """
    AND (candidate.unique_key IS NULL OR (
        NOT EXISTS (
            SELECT 1 FROM stalwart_job AS twin
            WHERE twin.unique_holder = candidate.unique_key AND twin.id <> candidate.id)
        AND NOT EXISTS (
            SELECT 1 FROM stalwart_job AS sibling
            WHERE sibling.unique_key = candidate.unique_key AND sibling.id < candidate.id
              AND sibling.status = candidate.status)))"""


def _in(values: Sequence) -> str:
    return ", ".join(["%s"] * len(values))


class MySQLStatements(Statements):
    vendor = "mysql"
    # Placeholders per statement stay far under MySQL's 65,535.
    insert_chunk = 1000

    # -- helpers ---------------------------------------------------------------------------

    def _atomic(self) -> Any:
        """One transaction for a step of several statements (joins the caller's, if any)."""
        return transaction.atomic(using=self.connection.alias, savepoint=False)

    def now_sql(self) -> tuple[str, list]:
        return NOW, []

    def ago_sql(self) -> str:
        return f"{NOW} - INTERVAL %s MICROSECOND"

    def ago_params(self, seconds: float) -> list:
        return [round(seconds * 1_000_000)]

    def database_now(self, cursor: Any) -> Any:
        cursor.execute(f"SELECT {NOW}")
        return cursor.fetchone()[0].replace(tzinfo=UTC)

    def error_count_sql(self, column: str) -> str:
        return f"JSON_LENGTH({column})"

    row_lock = "FOR UPDATE"

    def queue_filter(
        self, pattern: QueuePattern, excluded: Sequence[QueuePattern]
    ) -> tuple[str, list]:
        # A backslash is an escape character in MySQL's string literals too: '\\' is one.
        sql, params = super().queue_filter(pattern, excluded)
        return sql.replace("ESCAPE '\\'", "ESCAPE '\\\\'"), params

    def _ids(self, rows: Sequence) -> list:
        return [self.uuid_param(self._uuid(row[0])) for row in rows]

    def _uuid(self, value: Any) -> uuid.UUID:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))

    def _twin_holds(self, cursor: Any, key: str, job_id: Any) -> bool:
        """Whether another job holds ``key`` (the unique index's column answers)."""
        cursor.execute(
            "SELECT 1 FROM stalwart_job WHERE unique_holder = %s AND id <> %s",
            [key, job_id],
        )
        return cursor.fetchone() is not None

    def _key_after(
        self, cursor: Any, job_id: Any, key: str | None, status: str, taken: set[str]
    ) -> str | None:
        """The unique key of a job leaving ``running`` for ``status`` (see
        ``Statements.unique_key_leaving``): dropped if it goes back to waiting while a twin
        holds the key, or an earlier job of this same step took it back. A twin that slips
        in between this look and the write meets the unique index (1062), and the step is
        retried: it then sees the twin."""
        if key is None or status not in _WAITING:
            return key
        if key in taken or self._twin_holds(cursor, key, job_id):
            return None
        taken.add(key)
        return key

    # -- insert ----------------------------------------------------------------------------

    def insert_params(self, job: NewJob) -> list:
        values = dict(zip(INSERT_COLUMNS, super().insert_params(job), strict=True))
        params = []
        for name in INSERT_COLUMNS:
            if name == "status":
                params += [values["run_after"], values["concurrency_key"]]
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
            if mysql_errno(error) == _DUPLICATE_KEY:
                return False
            raise
        return True

    # -- claim -----------------------------------------------------------------------------

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
                    started_at = COALESCE(started_at, {NOW}),
                    last_attempted_at = {NOW},
                    worker_ids = JSON_ARRAY_APPEND(worker_ids, '$', %s)
                WHERE id IN ({_in(ids)}) AND status = 'ready'
                """,
                [owner, worker_name, *ids],
            )
            cursor.execute(
                f"SELECT {_CLAIM_SELECT} FROM stalwart_job "
                f"WHERE id IN ({_in(ids)}) AND status = 'running' AND owner = %s",
                [*ids, owner],
            )
            return self.claimed_from_rows(cursor.fetchall())

    # -- finish, release -------------------------------------------------------------------

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
        written = {}
        with self._atomic():
            cursor.execute(
                f"SELECT id, attempt, unique_key FROM stalwart_job WHERE id IN ({_in(ids)}) "
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
                    retry_at = f"{NOW} + INTERVAL %s MICROSECOND"
                    retry_params = [round(outcome.retry_in * 1_000_000)]
                cursor.execute(
                    f"""
                    UPDATE stalwart_job
                    SET status = %s,
                        owner = CASE WHEN %s THEN owner END,
                        isolated = 0,
                        finished_at = {NOW if outcome.status in FINISHED_STATES else "NULL"},
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
                cursor.execute(
                    f"SELECT id, finished_at FROM stalwart_job WHERE id IN ({_in(written)})",
                    [self.uuid_param(job_id) for job_id in written],
                )
                for job_id, finished_at in decode_rows(
                    self.connection, ["id", "finished_at"], cursor.fetchall()
                ):
                    written[job_id] = finished_at
        return written

    def slot_expired(self, job: str) -> tuple[str, list]:
        return (
            (
                f"({job}.concurrency_duration IS NOT NULL AND {job}.last_attempted_at "
                f"+ INTERVAL ROUND({job}.concurrency_duration * 1000000) MICROSECOND <= {NOW})"
            ),
            [],
        )

    def _held(self, cursor: Any, condition: str, params: list) -> list[dict]:
        """Lock running jobs in id order; each as a dict of the columns a release needs."""
        names = [
            "id",
            "attempt",
            "unique_key",
            "queue_name",
            "concurrency_key",
            "concurrency_duration",
            "max_attempts",
        ]
        cursor.execute(
            f"SELECT {', '.join(names)}, JSON_LENGTH(errors) FROM stalwart_job "
            f"WHERE status = 'running' AND {condition} ORDER BY id FOR UPDATE",
            params,
        )
        return [
            {**dict(zip(names, row, strict=False)), "id": self._uuid(row[0]), "failed": row[-1]}
            for row in cursor.fetchall()
        ]

    def release_rows(
        self, cursor: Any, *, owner: int, jobs: Sequence[tuple[Any, int]]
    ) -> list[Released]:
        attempts = {self._uuid(job_id): attempt for job_id, attempt in jobs}
        ids = [self.uuid_param(job_id) for job_id in sorted(attempts)]
        released = []
        with self._atomic():
            held = self._held(cursor, f"owner = %s AND id IN ({_in(ids)})", [owner, *ids])
            taken: set[str] = set()
            for job in held:
                if attempts.get(job["id"]) != job["attempt"]:
                    continue
                status = "ready" if job["concurrency_duration"] is None else "blocked"
                param = self.uuid_param(job["id"])
                cursor.execute(
                    "UPDATE stalwart_job SET status = %s, owner = NULL, unique_key = %s "
                    "WHERE id = %s AND status = 'running' AND owner = %s AND attempt = %s",
                    [
                        status,
                        self._key_after(cursor, param, job["unique_key"], status, taken),
                        param,
                        owner,
                        job["attempt"],
                    ],
                )
                if cursor.rowcount:
                    released.append(
                        Released(job["id"], status, job["queue_name"], job["concurrency_key"])
                    )
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
        error = json.dumps({"exception_class_path": error_class, "traceback": error_text})
        released = []
        with self._atomic():
            held = self._held(cursor, "owner = %s", [owner])
            # Charged: every job (a silence), or a job that was alone (a crash), or none.
            charged = death == Death.SILENCE or (death == Death.CRASH and len(held) == 1)
            isolate = death == Death.CRASH  # a crash's suspects, the one charged too
            taken: set[str] = set()
            for job in held:
                if charged and job["failed"] + 1 >= job["max_attempts"]:
                    status = "failed"
                else:
                    status = "ready" if job["concurrency_duration"] is None else "blocked"
                param = self.uuid_param(job["id"])
                cursor.execute(
                    f"""
                    UPDATE stalwart_job
                    SET status = %s,
                        finished_at = {NOW if status == "failed" else "NULL"},
                        available_at = {NOW if charged else "available_at"},
                        owner = NULL,
                        isolated = isolated OR %s,
                        unique_key = %s,
                        errors = {
                        "JSON_ARRAY_APPEND(errors, '$', JSON_EXTRACT(%s, '$'))"
                        if charged
                        else "errors"
                    }
                    WHERE id = %s AND status = 'running' AND owner = %s
                    """,
                    [
                        status,
                        isolate,
                        self._key_after(cursor, param, job["unique_key"], status, taken),
                        *([error] if charged else []),
                        param,
                        owner,
                    ],
                )
                if cursor.rowcount:
                    released.append(
                        Released(job["id"], status, job["queue_name"], job["concurrency_key"])
                    )
        return released

    # -- promotion, concurrency slots ------------------------------------------------------

    def promote_due(self, cursor: Any, *, limit: int, notify: bool) -> tuple[int, list]:
        with self._atomic():
            cursor.execute(
                f"""
                SELECT id, concurrency_key FROM stalwart_job AS candidate
                WHERE status = 'scheduled' AND available_at <= {NOW} {NO_LIVE_OWNER}
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
                f"WHERE id IN ({_in(ids)}) AND status = 'scheduled'",
                ids,
            )
            return cursor.rowcount, sorted({row[1] for row in rows if row[1] is not None})

    def lock_concurrency_key(self, cursor: Any, *, key: str, limit: int | None) -> int:
        if limit is None:
            cursor.execute(
                f"UPDATE stalwart_concurrency_key SET updated_at = {NOW} WHERE `key` = %s",
                [key],
            )
            if not cursor.rowcount:
                return 0
        else:
            cursor.execute(
                "INSERT INTO stalwart_concurrency_key (`key`, slot_limit, updated_at) "
                f"VALUES (%s, %s, {NOW}) ON DUPLICATE KEY UPDATE "
                "slot_limit = VALUES(slot_limit), updated_at = VALUES(updated_at)",
                [key, limit],
            )
        cursor.execute("SELECT slot_limit FROM stalwart_concurrency_key WHERE `key` = %s", [key])
        row = cursor.fetchone()
        return 0 if row is None else row[0]

    def unblock(self, cursor: Any, *, key: str, notify: bool, limit: int | None = None) -> int:
        with self._atomic():
            free = self.lock_free_slots(cursor, key=key, limit=limit)
            if free <= 0:
                return 0
            # SKIP LOCKED: a locking read would wait on a blocked job another transaction has
            # inserted and not committed yet (PostgreSQL would not see it at all), or is moving
            # (a release, a cancel). That job's own hand-out follows its commit.
            cursor.execute(
                "SELECT id FROM stalwart_job WHERE status = 'blocked' AND concurrency_key = %s "
                "ORDER BY priority DESC, available_at, id LIMIT %s FOR UPDATE SKIP LOCKED",
                [key, free],
            )
            ids = self._ids(cursor.fetchall())
            if not ids:
                return 0
            cursor.execute(
                "UPDATE stalwart_job SET status = 'ready' "
                f"WHERE id IN ({_in(ids)}) AND status = 'blocked'",
                ids,
            )
            return cursor.rowcount

    def unblock_keys(self, cursor: Any, *, keys: Sequence[str], notify: bool) -> int:
        # As on PostgreSQL (a few statements for all the keys, each key's row locked in key
        # order first), but the jobs are picked by a locking read and then moved: no
        # ``UPDATE … RETURNING``, no ``ON CONFLICT``, and ``key`` is a reserved word.
        keys = sorted(set(keys))
        if not keys:
            return 0
        with self._atomic():
            cursor.execute(
                f"SELECT `key` FROM stalwart_concurrency_key WHERE `key` IN ({_in(keys)})", keys
            )
            missing = sorted(set(keys) - {row[0] for row in cursor.fetchall()})
            if missing:
                self._add_concurrency_keys(cursor, missing)
            cursor.execute(
                "SELECT `key`, slot_limit FROM stalwart_concurrency_key "
                f"WHERE `key` IN ({_in(keys)}) ORDER BY `key` FOR UPDATE",
                keys,
            )
            free = self.free_slots(cursor, dict(cursor.fetchall()))
            free_keys = sorted(free)
            made_ready = 0
            for start in range(0, len(free_keys), 200):
                chunk = free_keys[start : start + 200]
                # Each key's most urgent blocked jobs, as many as it has free slots: one
                # descent of ``stalwart_job_blocked`` per key. SKIP LOCKED, as in ``unblock``:
                # a blocked job another transaction inserts or moves is its own hand-out's.
                arms = " UNION ALL ".join([_BLOCKED_HEAD] * len(chunk))
                cursor.execute(arms, [value for key in chunk for value in (key, free[key])])
                ids = self._ids(cursor.fetchall())
                if not ids:
                    continue
                cursor.execute(
                    "UPDATE stalwart_job SET status = 'ready' "
                    f"WHERE id IN ({_in(ids)}) AND status = 'blocked'",
                    ids,
                )
                made_ready += cursor.rowcount
            return made_ready

    def _add_concurrency_keys(self, cursor: Any, keys: Sequence[str]) -> None:
        # A key another transaction has just given a row keeps it (the no-op update).
        cursor.execute(
            "INSERT INTO stalwart_concurrency_key (`key`, slot_limit, updated_at) "
            f"SELECT newest.concurrency_key, newest.concurrency_limit, {NOW} FROM ("
            "  SELECT concurrency_key, concurrency_limit, row_number() OVER ("
            "    PARTITION BY concurrency_key ORDER BY id DESC) AS newest_first "
            "  FROM stalwart_job WHERE status = 'blocked' AND concurrency_limit IS NOT NULL"
            f"  AND concurrency_key IN ({_in(keys)})"
            ") AS newest WHERE newest.newest_first = 1 ORDER BY newest.concurrency_key "
            "ON DUPLICATE KEY UPDATE `key` = stalwart_concurrency_key.`key`",
            list(keys),
        )

    # The loose index scans PostgreSQL writes as recursive CTEs are built into MySQL and
    # MariaDB: a DISTINCT or GROUP BY on an index prefix reads one entry per group ("Using
    # index for group-by"). A recursive CTE would not do here: MariaDB stops one after 1,000
    # iterations (``max_recursive_iterations``, MySQL's ``cte_max_recursion_depth``), and its
    # correlated ``min()`` scans the whole status range for each key instead of descending.

    def blocked_keys(
        self, cursor: Any, *, after: str | None = None, limit: int = 1000
    ) -> list[str]:
        # One descent of ``stalwart_job_slot_holders`` (or ``_blocked``) per key.
        cursor.execute(
            "SELECT DISTINCT concurrency_key FROM stalwart_job "
            "WHERE status = 'blocked' AND concurrency_key > %s "
            "ORDER BY concurrency_key LIMIT %s",
            ["" if after is None else after, limit],
        )
        return [row[0] for row in cursor.fetchall()]

    def waiting_queues(self, cursor: Any) -> list[str]:
        # One descent per (state, queue) of an index on (status, queue_name, …); on MySQL
        # ``stalwart_job_waiting_queue`` and its like hold every state.
        cursor.execute(
            "SELECT DISTINCT status, queue_name FROM stalwart_job "
            f"WHERE status IN ({_in(_WAITING)})",
            list(_WAITING),
        )
        return sorted({row[1] for row in cursor.fetchall()})

    def last_ticks(self, cursor: Any) -> list[tuple[str, Any]]:
        # One descent of the (key, run_at) unique index per key.
        cursor.execute("SELECT `key`, MAX(run_at) FROM stalwart_recurring_run GROUP BY `key`")
        return [tuple(row) for row in cursor.fetchall()]

    # -- bulk control ----------------------------------------------------------------------

    def _chosen(self, cursor: Any, where: str, params: list, limit: int) -> list:
        """Lock up to ``limit`` jobs matching ``where``, in id order; their ids."""
        cursor.execute(
            f"SELECT id FROM stalwart_job AS candidate WHERE {where} "
            "ORDER BY id LIMIT %s FOR UPDATE",
            [*params, limit],
        )
        return self._ids(cursor.fetchall())

    def _queues_and_keys(self, cursor: Any, ids: list) -> list[tuple[str, str | None]]:
        cursor.execute(
            f"SELECT queue_name, concurrency_key FROM stalwart_job WHERE id IN ({_in(ids)})",
            ids,
        )
        return [tuple(row) for row in cursor.fetchall()]

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
        attempts = ""
        if grant_attempt:
            failed = self.error_count_sql("errors")
            attempts = (
                f", max_attempts = CASE WHEN max_attempts > {failed} THEN max_attempts "
                f"ELSE {failed} + 1 END"
            )
        with self._atomic():
            # After the last batch's last id (a keyset): each candidate is read once.
            ids = self._chosen(
                cursor,
                f"status = %s {'AND id > %s' if after is not None else ''} {conditions} "
                f"{_NO_WAITING_TWIN} {NO_LIVE_OWNER}",
                [status, *([self.uuid_param(after)] if after is not None else []), *params],
                limit,
            )
            if not ids:
                return []
            cursor.execute(
                "UPDATE stalwart_job SET status = CASE WHEN concurrency_key IS NULL "
                "THEN 'ready' ELSE 'blocked' END, "
                f"finished_at = NULL, owner = NULL, available_at = {NOW}{attempts} "
                f"WHERE status = %s AND id IN ({_in(ids)})",
                [status, *ids],
            )
            cursor.execute(
                "SELECT queue_name, concurrency_key, id FROM stalwart_job "
                f"WHERE id IN ({_in(ids)}) AND status IN ('ready', 'blocked')",
                ids,
            )
            return [(queue, key, self._uuid(job_id)) for queue, key, job_id in cursor.fetchall()]

    def count_requeueable(self, cursor: Any, *, status: str, conditions: str, params: list) -> int:
        cursor.execute(
            f"SELECT count(*) FROM stalwart_job AS candidate "
            f"WHERE status = %s {conditions} {_NO_WAITING_TWIN} {NO_LIVE_OWNER}",
            [status, *params],
        )
        return cursor.fetchone()[0]

    def cancel_batch(
        self, cursor: Any, *, conditions: str, params: list, limit: int
    ) -> list[tuple[str, str | None]]:
        with self._atomic():
            ids = self._chosen(cursor, f"status IN ({_CANCELLABLE}) {conditions}", params, limit)
            if not ids:
                return []
            cursor.execute(
                f"UPDATE stalwart_job SET status = 'cancelled', finished_at = {NOW}, "
                f"owner = NULL WHERE status IN ({_CANCELLABLE}) AND id IN ({_in(ids)})",
                ids,
            )
            return self._queues_and_keys(cursor, ids)

    def request_cancel_batch(
        self, cursor: Any, *, conditions: str, params: list, limit: int
    ) -> int:
        with self._atomic():
            ids = self._chosen(
                cursor,
                f"status = 'running' AND cancel_requested_at IS NULL {conditions}",
                params,
                limit,
            )
            if not ids:
                return 0
            cursor.execute(
                f"UPDATE stalwart_job SET cancel_requested_at = {NOW} "
                "WHERE status = 'running' AND cancel_requested_at IS NULL "
                f"AND id IN ({_in(ids)})",
                ids,
            )
            return cursor.rowcount

    def count_cancellable(self, cursor: Any, *, conditions: str, params: list) -> tuple[int, int]:
        cursor.execute(
            f"SELECT COALESCE(SUM(status IN ({_CANCELLABLE})), 0), "
            "COALESCE(SUM(status = 'running' AND cancel_requested_at IS NULL), 0) "
            f"FROM stalwart_job WHERE status IN ({_CANCELLABLE}, 'running') {conditions}",
            params,
        )
        waiting, running = cursor.fetchone()
        return int(waiting), int(running)

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
        chosen, chosen_params = self._status_and_age(statuses, older_than)
        with self._atomic():
            ids = self._chosen(cursor, f"{chosen} {conditions}", [*chosen_params, *params], limit)
            if not ids:
                return 0
            cursor.execute(
                f"DELETE FROM stalwart_job WHERE {chosen} AND id IN ({_in(ids)})",
                [*chosen_params, *ids],
            )
            return cursor.rowcount

    def delete_old_ticks(self, cursor: Any, *, older_than: float) -> int:
        # MySQL reads no table a DELETE writes in a subquery: join a derived table instead.
        cursor.execute(
            "DELETE run FROM stalwart_recurring_run AS run JOIN ("
            "SELECT `key`, MAX(run_at) AS latest FROM stalwart_recurring_run GROUP BY `key`"
            f") AS newest ON newest.`key` = run.`key` "
            f"WHERE run.run_at < {self.ago_sql()} AND run.run_at < newest.latest",
            self.ago_params(older_than),
        )
        return cursor.rowcount

    # -- the process table -----------------------------------------------------------------

    def delete_child_processes(self, cursor: Any, *, supervisors: Sequence[int], pid: int) -> list:
        where = f"supervisor IN ({_in(supervisors)}) AND pid = %s"
        with self._atomic():
            cursor.execute(
                "SELECT id, kind, name, pid, hostname, metadata FROM stalwart_process "
                f"WHERE {where} ORDER BY id FOR UPDATE",
                [*supervisors, pid],
            )
            rows = cursor.fetchall()
            if rows:
                cursor.execute(
                    f"DELETE FROM stalwart_process WHERE id IN ({_in(rows)})",
                    [row[0] for row in rows],
                )
        return sorted((*row[:5], decode_json(row[5]) or {}) for row in rows)

    def delete_process_if_dead(
        self, cursor: Any, *, process_id: int, threshold: float
    ) -> dict | None:
        silent = f"id = %s AND last_heartbeat_at < {self.ago_sql()}"
        params = [process_id, *self.ago_params(threshold)]
        with self._atomic():
            cursor.execute(
                f"SELECT metadata FROM stalwart_process WHERE {silent} FOR UPDATE", params
            )
            row = cursor.fetchone()
            if row is None:
                return None
            cursor.execute("DELETE FROM stalwart_process WHERE id = %s", [process_id])
        return decode_json(row[0]) or {}

    def wait_briefly_for_locks(self, cursor: Any) -> None:
        # InnoDB counts lock waits in whole seconds, and has no SET LOCAL: the session's
        # value is kept on the connection, and put back after the finish that follows.
        if getattr(self.connection, "stalwart_lock_wait_timeout", None) is None:
            cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
            self.connection.stalwart_lock_wait_timeout = cursor.fetchone()[0]
        cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")

    def _restore_lock_wait(self, cursor: Any) -> None:
        previous = getattr(self.connection, "stalwart_lock_wait_timeout", None)
        # In a transaction an error has doomed, nothing more can run: the next finish on
        # this connection puts it back (until then, its lock waits are brief).
        if previous is None or self.connection.needs_rollback:
            return
        self.connection.stalwart_lock_wait_timeout = None
        cursor.execute("SET SESSION innodb_lock_wait_timeout = %s", [previous])

    # -- leases, recurring ticks, counters -------------------------------------------------

    def acquire_lease(self, cursor: Any, *, name: str, holder: str, ttl: float) -> bool:
        ttl_us = round(ttl * 1_000_000)
        with transaction.atomic(using=self.connection.alias):
            # A row another transaction holds is skipped: contention, not a wait.
            cursor.execute(
                "SELECT holder = %s, expires_at < UTC_TIMESTAMP(6) FROM stalwart_lease "
                "WHERE name = %s FOR UPDATE SKIP LOCKED",
                [holder, name],
            )
            row = cursor.fetchone()
            if row is not None:
                ours, expired = row
                if not (ours or expired):
                    return False
                cursor.execute(
                    "UPDATE stalwart_lease "
                    f"SET acquired_at = CASE WHEN holder = %s THEN acquired_at ELSE {NOW} END, "
                    f"holder = %s, expires_at = {NOW} + INTERVAL %s MICROSECOND "
                    "WHERE name = %s",
                    [holder, holder, ttl_us, name],
                )
                return True
            # No row, or one another transaction holds (a plain read sees it committed).
            cursor.execute("SELECT 1 FROM stalwart_lease WHERE name = %s", [name])
            if cursor.fetchone() is not None:
                return False
        try:
            with transaction.atomic(using=self.connection.alias):
                cursor.execute(
                    "INSERT INTO stalwart_lease (name, holder, acquired_at, expires_at) "
                    f"VALUES (%s, %s, {NOW}, {NOW} + INTERVAL %s MICROSECOND)",
                    [name, holder, ttl_us],
                )
        except IntegrityError as error:
            if mysql_errno(error) == _DUPLICATE_KEY:
                return False  # another holder created it first
            raise
        return True

    def claim_tick(self, cursor: Any, *, key: str, run_at: Any, job_id: uuid.UUID) -> bool:
        cursor.execute(
            "INSERT IGNORE INTO stalwart_recurring_run (`key`, run_at, job_id, created_at) "
            f"VALUES (%s, %s, %s, {NOW})",
            [key, self.datetime_param(run_at), self.uuid_param(job_id)],
        )
        return cursor.rowcount == 1

    def add_to_counters(self, cursor: Any, counts: Sequence[tuple[tuple, float]]) -> None:
        for start in range(0, len(counts), 500):
            chunk = counts[start : start + 500]
            params: list = []
            for (name, queue, task, le), amount in chunk:
                params.extend([name, queue, task, le, amount])
            rows = ", ".join([f"(%s, %s, %s, %s, %s, {NOW})"] * len(chunk))
            cursor.execute(
                "INSERT INTO stalwart_counter (name, queue_name, task_path, le, value, "
                f"updated_at) VALUES {rows} ON DUPLICATE KEY UPDATE "
                "value = value + VALUES(value), updated_at = VALUES(updated_at)",
                params,
            )
