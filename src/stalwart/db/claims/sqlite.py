"""SQLite: one writer at a time, so each step is one write statement or one write transaction.

A single ``UPDATE … RETURNING`` takes the write lock before it reads, so the claim cannot
read rows another writer is changing (and ``select_for_update()`` would be a no-op here
anyway). Steps of several statements run in a transaction whose first statement writes, so
it never has to upgrade a read lock. The host clock stands in for the database clock: SQLite
lives on one host.
"""

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from django.utils import timezone

from stalwart.db.claims import NO_LIVE_OWNER, Claims, Held, judge_given, judge_owner
from stalwart.db.rows import (
    CLAIM_COLUMNS,
    INSERT_COLUMNS,
    ClaimedJob,
    Death,
    Interruption,
    Outcome,
    Released,
)
from stalwart.db.slots import Slots
from stalwart.db.uniqueness import Uniqueness
from stalwart.models.job import FINISHED_STATES
from stalwart.queues import QueuePattern

_RETURNING = ", ".join(CLAIM_COLUMNS)
_NO_SIBLING = "SELECT 1 WHERE 0"  # statements here move one job at a time
# The statements that move one job out of running, fenced on its owner (and attempt).
_FINISH_ONE = f"""
    UPDATE stalwart_job
    SET status = %s, owner = CASE WHEN %s THEN owner END, isolated = 0, finished_at = %s,
        available_at = COALESCE(%s, available_at),
        return_value = %s, errors = COALESCE(%s, errors),
        {Uniqueness.unique_key_leaving("stalwart_job", "%s", _NO_SIBLING)}
    WHERE id = %s AND status = 'running' AND owner = %s AND attempt = %s
    RETURNING finished_at"""
# A write first, to take the write lock and list the running jobs a release may give back,
# with what deciding who pays needs (see ``judge``).
_LIST_HELD = """
    UPDATE stalwart_job SET owner = owner WHERE status = 'running' AND owner = %s {only}
    RETURNING id, attempt, json_array_length(errors), json_array_length(interruptions),
              max_attempts, max_interruptions"""
# Then one job given back as judged: failed for good (the first parameter), or waiting again.
_GIVE_BACK_ONE = f"""
    UPDATE stalwart_job
    SET status = CASE WHEN %s THEN 'failed'
                      ELSE {Slots.status_after_release("stalwart_job")} END,
        finished_at = %s,
        available_at = COALESCE(%s, available_at),
        owner = NULL,
        isolated = isolated OR %s,
        {Uniqueness.unique_key_leaving("stalwart_job", "%s", _NO_SIBLING)},
        errors = CASE WHEN %s IS NULL THEN errors ELSE json_insert(errors, '$[#]', json(%s)) END,
        interruptions = CASE WHEN %s IS NULL THEN interruptions
                             ELSE json_insert(interruptions, '$[#]', json(%s)) END
    WHERE id = %s AND status = 'running' AND owner = %s AND attempt = %s
    RETURNING id, status, queue_name, concurrency_key, task_path"""


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
                WHERE status = 'ready' AND priority >= -100 AND isolated = %s {conditions}
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
            ops: Any = self.connection.ops  # SQLite's operations, which the stubs don't name
            field = ops.convert_datetimefield_value
            written = {key: field(value, None, self.connection) for key, value in written.items()}
        return written

    def _held(self, cursor: Any, owner: int, ids: Sequence[Any] | None = None) -> list[Held]:
        only = "" if ids is None else f"AND id IN ({', '.join(['%s'] * len(ids))})"
        cursor.execute(
            _LIST_HELD.format(only=only),
            [owner, *(self.uuid_param(job_id) for job_id in ids or ())],
        )
        ops: Any = self.connection.ops  # SQLite's operations, which the stubs don't name
        field = ops.convert_uuidfield_value
        return sorted(
            (Held(field(row[0], None, self.connection), *row[1:]) for row in cursor.fetchall()),
            key=lambda job: job.id,
        )

    def _give_back(
        self, cursor: Any, owner: int, held: Sequence[Held], verdicts: dict
    ) -> list[Released]:
        moment = timezone.now()
        now = self.datetime_param(moment)
        released = []
        for job in held:
            verdict = verdicts[job.id]
            cursor.execute(
                _GIVE_BACK_ONE,
                [
                    verdict.fails,
                    now if verdict.fails else None,
                    now if verdict.charged else None,
                    verdict.isolate,
                    "failed" if verdict.fails else "ready",
                    verdict.error,
                    verdict.error,
                    verdict.interruption,
                    verdict.interruption,
                    self.uuid_param(job.id),
                    owner,
                    job.attempt,
                ],
            )
            released.extend(self._released(cursor.fetchone(), charged=verdict.charged))
        return released

    def release_rows(
        self, cursor: Any, *, owner: int, jobs: Sequence[Interruption], process: str = ""
    ) -> list[Released]:
        attempts = {job.id: job.attempt for job in jobs}
        held = [
            job
            for job in self._held(cursor, owner, list(attempts))
            if attempts.get(job.id) == job.attempt
        ]
        verdicts = judge_given(held, jobs, process=process, moment=timezone.now().isoformat())
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
        # One statement per job, so each sees the ones before it: twins given back together
        # never collide.
        held = self._held(cursor, owner)
        verdicts = judge_owner(
            held,
            death=death,
            suspects=suspects,
            error_class=error_class,
            error_text=error_text,
            process=process,
            moment=timezone.now().isoformat(),
        )
        return self._give_back(cursor, owner, held, verdicts)

    def _released(self, row: tuple | None, *, charged: bool = False) -> list[Released]:
        """A row of ``RETURNING id, status, queue_name, concurrency_key, task_path``, as a
        Released."""
        if row is None:
            return []
        ops: Any = self.connection.ops  # SQLite's operations, which the stubs don't name
        job_id = ops.convert_uuidfield_value(row[0], None, self.connection)
        status, queue_name, concurrency_key, task_path = row[1:]
        return [Released(job_id, status, queue_name, concurrency_key, task_path, charged=charged)]

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
