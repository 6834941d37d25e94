"""Work done once per cluster: leases (one holder at a time, for a while, by the database's
clock) and recurring ticks (a unique ``(key, run_at)`` row per tick, so each tick is
enqueued once however many schedulers run), and the forgetting of old ticks.

Contention is a return value: taking a lease someone else holds, or a tick someone else
recorded, answers False, never raises and never waits on another transaction's lock; the
caller's transaction stays usable. PostgreSQL takes a lease in one statement (``SKIP
LOCKED``), SQLite in one upsert (one writer at a time), MySQL in a short transaction and, for
a lease never taken yet, an insert in a savepoint.
"""

import uuid
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from stalwart.db.dialect import MYSQL_DUPLICATE_KEY, MYSQL_NOW, Dialect
from stalwart.db.errors import mysql_errno


class Leases(Dialect):
    """Take, renew and let go a lease; record a tick; find each key's latest tick."""

    def acquire_lease(self, cursor: Any, *, name: str, holder: str, ttl: float) -> bool:
        """Take or renew the lease ``name`` for ``ttl`` seconds: True if ours, False if not.

        Contention is a return value: never an exception, never a wait on a lock another
        transaction holds, and the caller's transaction stays usable.
        """
        raise NotImplementedError

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

    def delete_old_ticks(self, cursor: Any, *, older_than: float) -> int:
        """Forget recurring ticks over ``older_than`` seconds old, keeping each key's latest."""
        cursor.execute(
            f"DELETE FROM stalwart_recurring_run WHERE run_at < {self.ago_sql()} AND run_at < ("
            "SELECT max(latest.run_at) FROM stalwart_recurring_run AS latest "
            "WHERE latest.key = stalwart_recurring_run.key)",
            self.ago_params(older_than),
        )
        return cursor.rowcount


# Take or renew a lease: ``renewed`` or ``created`` has a row if it is ours now. A row
# another transaction has locked is skipped: contention, never a wait. (Also the head of
# the pruner's one-statement survey, in processes.py.)
PG_TAKE_LEASE = """
            WITH takeable AS (
                SELECT name FROM stalwart_lease
                WHERE name = %s AND (expires_at < now() OR holder = %s)
                FOR UPDATE SKIP LOCKED
            ),
            renewed AS (
                UPDATE stalwart_lease AS lease
                SET acquired_at = CASE WHEN lease.holder = %s THEN lease.acquired_at
                                       ELSE now() END,
                    holder = %s,
                    expires_at = now() + make_interval(secs => %s)
                FROM takeable WHERE lease.name = takeable.name
                RETURNING 1
            ),
            created AS (
                INSERT INTO stalwart_lease (name, holder, acquired_at, expires_at)
                SELECT %s, %s, now(), now() + make_interval(secs => %s)
                WHERE NOT EXISTS (SELECT 1 FROM stalwart_lease WHERE name = %s)
                ON CONFLICT (name) DO NOTHING
                RETURNING 1
            )"""


def pg_lease_params(name: str, holder: str, ttl: float) -> list:
    """The parameters of ``PG_TAKE_LEASE``."""
    return [name, holder, holder, holder, ttl, name, holder, ttl, name]


class PostgreSQLLeases(Leases):
    """Take or renew a lease in one statement: a row another transaction holds is skipped."""

    def acquire_lease(self, cursor: Any, *, name: str, holder: str, ttl: float) -> bool:
        cursor.execute(
            f"{PG_TAKE_LEASE} "
            "SELECT (SELECT count(*) FROM renewed) + (SELECT count(*) FROM created)",
            pg_lease_params(name, holder, ttl),
        )
        return cursor.fetchone()[0] == 1

    def release_lease(self, cursor: Any, *, name: str, holder: str) -> bool:
        cursor.execute(
            "UPDATE stalwart_lease SET expires_at = now() WHERE name = %s AND holder = %s",
            [name, holder],
        )
        return cursor.rowcount == 1


class SQLiteLeases(Leases):
    """One writer at a time: the upsert is the compare-and-set (by the host's clock)."""

    def acquire_lease(self, cursor: Any, *, name: str, holder: str, ttl: float) -> bool:
        # One writer at a time: the upsert is the whole compare-and-set.
        now = timezone.now()
        cursor.execute(
            """
            INSERT INTO stalwart_lease (name, holder, acquired_at, expires_at)
            VALUES (%s, %s, %s, %s)
            ON CONFLICT (name) DO UPDATE
            SET acquired_at = CASE WHEN stalwart_lease.holder = excluded.holder
                                   THEN stalwart_lease.acquired_at
                                   ELSE excluded.acquired_at END,
                holder = excluded.holder,
                expires_at = excluded.expires_at
            WHERE stalwart_lease.expires_at < %s OR stalwart_lease.holder = excluded.holder
            """,
            [
                name,
                holder,
                self.datetime_param(now),
                self.datetime_param(now + timedelta(seconds=ttl)),
                self.datetime_param(now),
            ],
        )
        return cursor.rowcount == 1


class MySQLLeases(Leases):
    """No ``ON CONFLICT``, and no ``DELETE`` whose subquery reads the table it deletes from."""

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
                    "SET acquired_at = CASE WHEN holder = %s THEN acquired_at "
                    f"ELSE {MYSQL_NOW} END, "
                    f"holder = %s, expires_at = {MYSQL_NOW} + INTERVAL %s MICROSECOND "
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
                    f"VALUES (%s, %s, {MYSQL_NOW}, {MYSQL_NOW} + INTERVAL %s MICROSECOND)",
                    [name, holder, ttl_us],
                )
        except IntegrityError as error:
            if mysql_errno(error) == MYSQL_DUPLICATE_KEY:
                return False  # another holder created it first
            raise
        return True

    def claim_tick(self, cursor: Any, *, key: str, run_at: Any, job_id: uuid.UUID) -> bool:
        cursor.execute(
            "INSERT IGNORE INTO stalwart_recurring_run (`key`, run_at, job_id, created_at) "
            f"VALUES (%s, %s, %s, {MYSQL_NOW})",
            [key, self.datetime_param(run_at), self.uuid_param(job_id)],
        )
        return cursor.rowcount == 1

    def last_ticks(self, cursor: Any) -> list[tuple[str, Any]]:
        # One descent of the (key, run_at) unique index per key (a GROUP BY on an index
        # prefix, not a recursive CTE: see ``MySQLSlots.blocked_keys``).
        cursor.execute("SELECT `key`, MAX(run_at) FROM stalwart_recurring_run GROUP BY `key`")
        return [tuple(row) for row in cursor.fetchall()]

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
