"""Bulk control and retention: requeue failed (or other) jobs, cancel waiting ones, ask
running ones to stop, delete finished ones (and old ones, for retention), and count what
each would touch, for a dry run; all in bounded batches.

Each batch is one fenced step: the rows are locked in id order (``row_lock``), so batches
and claims never deadlock, and the state is checked again as they are written. PostgreSQL
and SQLite write each batch as one statement (a materialised CTE of the chosen ids, then the
``UPDATE`` or ``DELETE``); MySQL as a locking read of the ids and a write by id, in one short
transaction.

Retention deletes a batch (``stalwart_batch``) and its jobs together: a job of a batch is
kept while its batch is unfinished or finished after the cutoff (``kept_for_dependants``),
and a finished batch goes once it is older than the cutoff and no job of it is left
(``delete_finished_batches``, the same statements on every database).
"""

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from stalwart.db.claims import NO_LIVE_OWNER
from stalwart.db.dialect import MYSQL_NOW, Dialect, marks
from stalwart.db.uniqueness import MYSQL_NO_WAITING_TWIN, NO_WAITING_TWIN
from stalwart.models.job import CANCELLABLE_STATES

_CANCELLABLE = ", ".join(f"'{state}'" for state in CANCELLABLE_STATES)


# A finished job that a pending job still runs after is kept, whatever its age: deleted,
# it could no longer say whether it succeeded (db/dependencies.py).
def kept_for_dependants(job: str, batch_cutoff: str | None = None) -> str:
    """The condition that keeps the job row ``job`` if a pending job runs after it, or if
    it is a job of a batch not finished yet (whose callbacks need its outcome) or, given
    ``batch_cutoff`` (SQL for a time: retention's), of a batch finished at or after it: a
    batch and its jobs are pruned together, once the batch is older than the cutoff.

    The batch is read per candidate job, through the membership's unique index on ``job``
    and the batch's primary key: a scalar subquery (a job is in one batch at most; in
    none, it is not kept for a batch), because MariaDB turns a ``NOT EXISTS`` into an
    ``IN`` it materialises, reading every link of every batch it keeps at each batch of
    deletes. Likewise the dependants are looked for only for a job that has some
    (``has_dependants``, set with its first dependant): MariaDB would otherwise read every
    dependency at each batch of deletes."""
    old_enough = f" AND kept_batch.finished_at < {batch_cutoff}" if batch_cutoff else ""
    return f"""
    AND ({job}.has_dependants = FALSE OR NOT EXISTS (
        SELECT 1 FROM stalwart_dependency AS kept_for
        JOIN stalwart_job AS dependant ON dependant.id = kept_for.child
        WHERE kept_for.parent = {job}.id AND dependant.status = 'pending'
    ))
    AND COALESCE((
        SELECT kept_batch.finished_at IS NOT NULL{old_enough}
        FROM stalwart_batch_job AS membership
        JOIN stalwart_batch AS kept_batch ON kept_batch.id = membership.batch
        WHERE membership.job = {job}.id
    ), TRUE)"""


# The jobs of a batch that are still there (whatever their state): one keeps the batch row.
# Read through the membership index (batch, role), then the job's primary key; a link left
# by a job deleted some other way keeps nothing.
_JOB_LEFT = """
    SELECT 1 FROM stalwart_batch_job AS link
    JOIN stalwart_job AS job ON job.id = link.job
    WHERE link.batch = stalwart_batch.id"""
# Batch rows per statement when deleting by id (SQLite takes at most 32,766 parameters).
_BATCH_ROWS_PER_DELETE = 1000


class Control(Dialect):
    """Choose jobs (``selection_sql``), then move, cancel, delete or count them."""

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
        sql: list[str] = []
        params: list[Any] = []
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
                  {NO_WAITING_TWIN} {NO_LIVE_OWNER}
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
            f"WHERE status = %s {conditions} {NO_WAITING_TWIN} {NO_LIVE_OWNER}",
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
        ago by the database's clock, if given), locking them in id order; return how many.
        With ``older_than``, a job of a batch finished since that cutoff is kept too."""
        cutoff, cutoff_params = self._cutoff(older_than)
        chosen, chosen_params = self._status_and_age(statuses, cutoff, cutoff_params)
        cursor.execute(
            f"""
            WITH chosen AS MATERIALIZED (
                SELECT id FROM stalwart_job
                WHERE {chosen} {conditions} {kept_for_dependants("stalwart_job", cutoff)}
                ORDER BY id LIMIT %s {self.row_lock}
            )
            DELETE FROM stalwart_job WHERE {chosen} AND id IN (SELECT id FROM chosen)
            RETURNING id
            """,
            [*chosen_params, *params, *cutoff_params, limit, *chosen_params],
        )
        deleted = [row[0] for row in cursor.fetchall()]
        self._forget_links(cursor, deleted)
        return len(deleted)  # (SQLite reports no row count after a WITH)

    @staticmethod
    def _forget_links(cursor: Any, deleted: Sequence[Any]) -> None:
        """Delete what linked the deleted jobs to others: the edges of the jobs that ran
        after others, and their batch memberships (a batch counts them as ``deleted``)."""
        if not deleted:
            return
        marks = ", ".join(["%s"] * len(deleted))
        cursor.execute(f"DELETE FROM stalwart_dependency WHERE child IN ({marks})", deleted)
        cursor.execute(f"DELETE FROM stalwart_batch_job WHERE job IN ({marks})", deleted)

    def count_selected(
        self,
        cursor: Any,
        *,
        statuses: Sequence[str],
        conditions: str,
        params: list,
        older_than: float | None = None,
    ) -> int:
        """How many jobs ``delete_batch`` would delete (for a dry run): what it keeps for
        dependants and for batches is not counted."""
        cutoff, cutoff_params = self._cutoff(older_than)
        chosen, chosen_params = self._status_and_age(statuses, cutoff, cutoff_params)
        cursor.execute(
            f"SELECT count(*) FROM stalwart_job WHERE {chosen} {conditions} "
            f"{kept_for_dependants('stalwart_job', cutoff)}",
            [*chosen_params, *params, *cutoff_params],
        )
        return cursor.fetchone()[0]

    def delete_finished_batches(
        self, cursor: Any, *, older_than: float, limit: int, after: Any = None
    ) -> tuple[int, Any, int]:
        """Look at up to ``limit`` batches finished over ``older_than`` seconds ago, in id
        order after ``after`` (the last call's last), and delete those no job is left in
        (members and callbacks all deleted), with the links their deleted jobs left; return
        (how many were looked at, the last id looked at, how many were deleted).

        The look walks the batch table's primary key (there is no index of batches by
        ``finished_at``), and for each old batch reads its links until one whose job is
        still there (``_JOB_LEFT``): never the links of other batches. A batch takes no job
        once finished (adding refuses it; callbacks are linked as it is marked finished),
        so one found empty stays empty: the rows chosen are locked, and deleted by id.
        """
        self.take_write_lock(cursor)
        cutoff, cutoff_params = self._cutoff(older_than)
        cursor.execute(
            f"SELECT id FROM stalwart_batch WHERE finished_at < {cutoff} "
            f"{'AND id > %s' if after is not None else ''} ORDER BY id LIMIT %s",
            [*cutoff_params, *([after] if after is not None else []), limit],
        )
        looked_at = self._ids(cursor.fetchall())
        if not looked_at:
            return 0, after, 0
        last = looked_at[-1]
        cursor.execute(
            f"SELECT id FROM stalwart_batch WHERE finished_at < {cutoff} "
            f"{'AND id > %s' if after is not None else ''} AND id <= %s "
            f"AND NOT EXISTS ({_JOB_LEFT}) ORDER BY id {self.row_lock}",
            [*cutoff_params, *([after] if after is not None else []), last],
        )
        empty = self._ids(cursor.fetchall())
        deleted = 0
        for start in range(0, len(empty), _BATCH_ROWS_PER_DELETE):
            ids = empty[start : start + _BATCH_ROWS_PER_DELETE]
            cursor.execute(f"DELETE FROM stalwart_batch_job WHERE batch IN ({marks(ids)})", ids)
            cursor.execute(f"DELETE FROM stalwart_batch WHERE id IN ({marks(ids)})", ids)
            deleted += cursor.rowcount
        return len(looked_at), last, deleted

    def count_finished_batches(
        self, cursor: Any, *, statuses: Sequence[str], older_than: float
    ) -> int:
        """How many batches ``delete_finished_batches`` would delete once ``delete_batch``
        had deleted the jobs in ``statuses`` finished over ``older_than`` seconds ago (for
        a dry run): old batches with no job left that such a prune would keep."""
        cutoff, cutoff_params = self._cutoff(older_than)
        chosen, chosen_params = self._status_and_age(statuses, cutoff, cutoff_params, "job")
        cursor.execute(
            f"""
            SELECT count(*) FROM stalwart_batch
            WHERE finished_at < {cutoff} AND NOT EXISTS (
                {_JOB_LEFT}
                  AND NOT ({chosen} AND job.finished_at IS NOT NULL
                           {kept_for_dependants("job", cutoff)})
            )
            """,
            [*cutoff_params, *chosen_params, *cutoff_params],
        )
        return cursor.fetchone()[0]

    def _cutoff(self, older_than: float | None) -> tuple[str | None, list]:
        """SQL for the database clock less ``older_than`` seconds, and its parameters
        (fixed once, so that every use in a statement means the same time)."""
        if older_than is None:
            return None, []
        return self.ago_sql(), self.ago_params(older_than)

    @staticmethod
    def _status_and_age(
        statuses: Sequence[str],
        cutoff: str | None,
        cutoff_params: list,
        table: str = "",
    ) -> tuple[str, list]:
        """The condition (and its parameters) for jobs in ``statuses`` that finished
        before ``cutoff``, if given (columns of ``table``, if named)."""
        column = f"{table}." if table else ""
        sql = f"{column}status IN ({', '.join(['%s'] * len(statuses))})"
        if cutoff is None:
            return sql, [*statuses]
        return f"{sql} AND {column}finished_at < {cutoff}", [*statuses, *cutoff_params]


class MySQLControl(Control):
    """Lock the batch's ids (``_chosen``), write by id, read back what the caller needs."""

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
            f"SELECT queue_name, concurrency_key FROM stalwart_job WHERE id IN ({marks(ids)})",
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
                f"{MYSQL_NO_WAITING_TWIN} {NO_LIVE_OWNER}",
                [status, *([self.uuid_param(after)] if after is not None else []), *params],
                limit,
            )
            if not ids:
                return []
            cursor.execute(
                "UPDATE stalwart_job SET status = CASE WHEN concurrency_key IS NULL "
                "THEN 'ready' ELSE 'blocked' END, "
                f"finished_at = NULL, owner = NULL, available_at = {MYSQL_NOW}{attempts} "
                f"WHERE status = %s AND id IN ({marks(ids)})",
                [status, *ids],
            )
            cursor.execute(
                "SELECT queue_name, concurrency_key, id FROM stalwart_job "
                f"WHERE id IN ({marks(ids)}) AND status IN ('ready', 'blocked')",
                ids,
            )
            return [(queue, key, self._uuid(job_id)) for queue, key, job_id in cursor.fetchall()]

    def count_requeueable(self, cursor: Any, *, status: str, conditions: str, params: list) -> int:
        cursor.execute(
            f"SELECT count(*) FROM stalwart_job AS candidate "
            f"WHERE status = %s {conditions} {MYSQL_NO_WAITING_TWIN} {NO_LIVE_OWNER}",
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
                f"UPDATE stalwart_job SET status = 'cancelled', finished_at = {MYSQL_NOW}, "
                f"owner = NULL WHERE status IN ({_CANCELLABLE}) AND id IN ({marks(ids)})",
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
                f"UPDATE stalwart_job SET cancel_requested_at = {MYSQL_NOW} "
                "WHERE status = 'running' AND cancel_requested_at IS NULL "
                f"AND id IN ({marks(ids)})",
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
        cutoff, cutoff_params = self._cutoff(older_than)
        chosen, chosen_params = self._status_and_age(statuses, cutoff, cutoff_params)
        with self._atomic():
            ids = self._chosen(
                cursor,
                f"{chosen} {conditions} {kept_for_dependants('candidate', cutoff)}",
                [*chosen_params, *params, *cutoff_params],
                limit,
            )
            if not ids:
                return 0
            cursor.execute(
                f"DELETE FROM stalwart_job WHERE {chosen} AND id IN ({marks(ids)})",
                [*chosen_params, *ids],
            )
            count = cursor.rowcount
            self._forget_links(cursor, ids)
            return count
