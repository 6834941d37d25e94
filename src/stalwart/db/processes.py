"""The process table: processes gone silent (their heartbeat older than a threshold, by the
database's clock), a reaped child's row, owners of running jobs that have no row.

Deletions are compare-and-set: a row is deleted only if it is still silent, in the statement
that deletes it, so two pruners never both act on one process. MySQL, which has no ``DELETE
… RETURNING``, locks the rows first and deletes them by id.
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from stalwart.db.decoding import decode_json
from stalwart.db.dialect import Dialect, marks
from stalwart.db.leases import PG_TAKE_LEASE, pg_lease_params


class Processes(Dialect):
    """Find silent processes and orphaned jobs' owners; delete a row if still dead."""

    if TYPE_CHECKING:
        # From the Leases mixin, which every database's Statements class combines with this.
        def acquire_lease(self, cursor: Any, *, name: str, holder: str, ttl: float) -> bool: ...

    def dead_processes(self, cursor: Any, *, threshold: float, exclude: int | None) -> list:
        """Processes whose last heartbeat is older than ``threshold`` seconds (database clock)."""
        cursor.execute(
            "SELECT id, kind, name, pid, hostname, supervisor FROM stalwart_process "
            f"WHERE last_heartbeat_at < {self.ago_sql()} AND id <> %s ORDER BY id",
            [*self.ago_params(threshold), -1 if exclude is None else exclude],
        )
        return list(cursor.fetchall())

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


class PostgreSQLProcesses(Processes):
    """The pruner's survey in one statement: what an idle cluster's pruner sends each
    interval."""

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
        # The lease, and, if it is ours, the dead processes (one row each, or one row of
        # NULLs) and whether any running job's owner has no row.
        cursor.execute(
            f"""{PG_TAKE_LEASE},
            held AS (
                SELECT (SELECT count(*) FROM renewed) + (SELECT count(*) FROM created) = 1 AS ours
            )
            SELECT held.ours,
                   held.ours AND EXISTS (
                       SELECT 1 FROM stalwart_job AS job
                       WHERE job.status = 'running' AND job.owner IS NOT NULL
                         AND NOT EXISTS (SELECT 1 FROM stalwart_process AS process
                                         WHERE process.id = job.owner)),
                   dead.id, dead.kind, dead.name, dead.pid, dead.hostname, dead.supervisor
            FROM held LEFT JOIN stalwart_process AS dead
              ON held.ours AND dead.last_heartbeat_at < {self.ago_sql()} AND dead.id <> %s
            ORDER BY dead.id
            """,
            [*pg_lease_params(lease, holder, ttl), threshold, -1 if exclude is None else exclude],
        )
        rows = cursor.fetchall()
        ours, orphans = rows[0][:2]
        if not ours:
            return None
        return [tuple(row[2:]) for row in rows if row[2] is not None], orphans


class MySQLProcesses(Processes):
    """Lock, then delete: the rows deleted are those the locking read returned."""

    def delete_child_processes(self, cursor: Any, *, supervisors: Sequence[int], pid: int) -> list:
        where = f"supervisor IN ({marks(supervisors)}) AND pid = %s"
        with self._atomic():
            cursor.execute(
                "SELECT id, kind, name, pid, hostname, metadata FROM stalwart_process "
                f"WHERE {where} ORDER BY id FOR UPDATE",
                [*supervisors, pid],
            )
            rows = cursor.fetchall()
            if rows:
                cursor.execute(
                    f"DELETE FROM stalwart_process WHERE id IN ({marks(rows)})",
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
