"""SQLite: one writer at a time, so each step is one write statement or one write transaction.

A single ``UPDATE … RETURNING`` takes the write lock before it reads, so the claim cannot
read rows another writer is changing (and ``select_for_update()`` would be a no-op here
anyway). Steps of several statements run in a transaction whose first statement writes, so
it never has to upgrade a read lock. The host clock stands in for the database clock: SQLite
lives on one host.
"""

import json
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.utils import timezone

from stalwart.db.claims import NO_LIVE_OWNER, Claims
from stalwart.db.rows import CLAIM_COLUMNS, INSERT_COLUMNS, ClaimedJob, Death, Outcome, Released
from stalwart.db.slots import Slots
from stalwart.db.uniqueness import Uniqueness
from stalwart.models.job import FINISHED_STATES
from stalwart.queues import QueuePattern

_RETURNING = ", ".join(CLAIM_COLUMNS)
_NO_SIBLING = "SELECT 1 WHERE 0"  # statements here move one job at a time
# Whether the death is charged to this job (the first parameter), and it is its last attempt.
_CHARGED_AT_LAST_ATTEMPT = "(%s AND json_array_length(errors) + 1 >= max_attempts)"
_STATUS_AFTER_DEATH = f"CASE WHEN {_CHARGED_AT_LAST_ATTEMPT} THEN 'failed' ELSE 'ready' END"
# The statements that move one job out of running, fenced on its owner (and attempt).
_FINISH_ONE = f"""
    UPDATE stalwart_job
    SET status = %s, owner = CASE WHEN %s THEN owner END, isolated = 0, finished_at = %s,
        available_at = COALESCE(%s, available_at),
        return_value = %s, errors = COALESCE(%s, errors),
        {Uniqueness.unique_key_leaving("stalwart_job", "%s", _NO_SIBLING)}
    WHERE id = %s AND status = 'running' AND owner = %s AND attempt = %s
    RETURNING finished_at"""
_RELEASE_ONE = f"""
    UPDATE stalwart_job
    SET status = {Slots.status_after_release("stalwart_job")}, owner = NULL,
        {Uniqueness.unique_key_leaving("stalwart_job", "'ready'", _NO_SIBLING)}
    WHERE id = %s AND status = 'running' AND owner = %s AND attempt = %s
    RETURNING id, status, queue_name, concurrency_key"""
_RELEASE_DEAD_ONE = f"""
    UPDATE stalwart_job
    SET status = CASE WHEN {_CHARGED_AT_LAST_ATTEMPT} THEN 'failed'
                      ELSE {Slots.status_after_release("stalwart_job")} END,
        finished_at = CASE WHEN {_CHARGED_AT_LAST_ATTEMPT} THEN %s END,
        available_at = CASE WHEN %s THEN %s ELSE available_at END,
        owner = NULL,
        isolated = isolated OR %s,
        {Uniqueness.unique_key_leaving("stalwart_job", _STATUS_AFTER_DEATH, _NO_SIBLING)},
        errors = CASE WHEN %s THEN json_insert(errors, '$[#]', json(%s)) ELSE errors END
    WHERE id = %s AND status = 'running' AND owner = %s
    RETURNING id, status, queue_name, concurrency_key"""


class SQLiteClaims(Claims):
    # One parameter per column and row (constants aside), under SQLite's default limit of
    # 32,766 parameters.
    insert_chunk = 32_766 // len(INSERT_COLUMNS)

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
        now = self.now_param()
        cursor.execute(
            f"""
            UPDATE stalwart_job
            SET status = 'running',
                owner = %s,
                attempt = attempt + 1,
                started_at = COALESCE(started_at, %s),
                last_attempted_at = %s,
                worker_ids = json_insert(worker_ids, '$[#]', %s)
            WHERE status = 'ready'
              AND EXISTS (SELECT 1 FROM stalwart_process WHERE id = %s)
              AND id IN (
                SELECT id FROM stalwart_job
                WHERE status = 'ready' AND isolated = %s {conditions}
                ORDER BY priority DESC, available_at, id
                LIMIT %s
            )
            RETURNING {_RETURNING}
            """,
            [owner, now, now, worker_name, owner, isolated, *filter_params, limit],
        )
        return self.claimed_from_rows(cursor.fetchall())

    def finish(self, cursor: Any, *, owner: int, outcomes: Sequence[Outcome]) -> dict:
        moment = timezone.now()
        now = self.datetime_param(moment)
        written = {}
        for outcome in outcomes:
            final = outcome.status in FINISHED_STATES
            retry_at = None
            if outcome.retry_in is not None:
                retry_at = self.datetime_param(moment + timedelta(seconds=outcome.retry_in))
            cursor.execute(
                _FINISH_ONE,
                [
                    outcome.status,
                    outcome.keep_owner,
                    now if final else None,
                    retry_at,
                    outcome.return_value,
                    outcome.errors,
                    outcome.status,
                    self.uuid_param(outcome.id),
                    owner,
                    outcome.attempt,
                ],
            )
            row = cursor.fetchone()
            if row is not None:
                written[outcome.id] = row[0]
        if written:
            # Decode the stored timestamps the way the ORM would.
            field = self.connection.ops.convert_datetimefield_value
            written = {key: field(value, None, self.connection) for key, value in written.items()}
        return written

    def release_rows(
        self, cursor: Any, *, owner: int, jobs: Sequence[tuple[Any, int]]
    ) -> list[Released]:
        released = []
        for job_id, attempt in jobs:
            cursor.execute(_RELEASE_ONE, [self.uuid_param(job_id), owner, attempt])
            released.extend(self._released(cursor.fetchone()))
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
        # A write first (it takes the write lock and lists the jobs), then one statement per
        # job, so each sees the ones before it: twins released together never collide.
        cursor.execute(
            "UPDATE stalwart_job SET owner = owner WHERE status = 'running' AND owner = %s "
            "RETURNING id",
            [owner],
        )
        ids = sorted(row[0] for row in cursor.fetchall())
        error = json.dumps({"exception_class_path": error_class, "traceback": error_text})
        now = self.now_param()
        # Charged: every job (a silence), or a job that was alone (a crash), or none.
        charged = death == Death.SILENCE or (death == Death.CRASH and len(ids) == 1)
        isolate = death == Death.CRASH  # a crash's suspects, the one charged too
        released = []
        for job_id in ids:
            cursor.execute(
                _RELEASE_DEAD_ONE,
                [
                    charged,
                    charged,
                    now,
                    charged,
                    now,
                    isolate,
                    charged,
                    charged,
                    error,
                    job_id,
                    owner,
                ],
            )
            released.extend(self._released(cursor.fetchone()))
        return released

    def _released(self, row: tuple | None) -> list[Released]:
        """A row of ``RETURNING id, status, queue_name, concurrency_key``, as a Released."""
        if row is None:
            return []
        job_id = self.connection.ops.convert_uuidfield_value(row[0], None, self.connection)
        return [Released(job_id, *row[1:])]

    def promote_due(self, cursor: Any, *, limit: int, notify: bool) -> tuple[int, list]:
        # Jobs with a concurrency key wait for a slot (blocked); the others are ready.
        cursor.execute(
            f"""
            UPDATE stalwart_job
            SET status = CASE WHEN concurrency_key IS NULL THEN 'ready' ELSE 'blocked' END,
                owner = NULL
            WHERE status = 'scheduled' AND id IN (
                SELECT id FROM stalwart_job AS candidate
                WHERE status = 'scheduled' AND available_at <= %s {NO_LIVE_OWNER}
                ORDER BY available_at, id
                LIMIT %s
            )
            RETURNING concurrency_key
            """,
            [self.now_param(), limit],
        )
        keys = [row[0] for row in cursor.fetchall()]
        return len(keys), sorted({key for key in keys if key is not None})
