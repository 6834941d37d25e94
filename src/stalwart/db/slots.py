"""Concurrency slots: at most ``slot_limit`` jobs of one concurrency key hold a slot at a
time (ready, or running until the task's ``concurrency_duration`` has passed); the others
wait, blocked, to be handed one.

Whoever hands out a key's slots first locks the key's row in ``stalwart_concurrency_key``
(``lock_concurrency_key``), so two hand-outs never count the same free slot; several keys
are locked in key order. A slot is handed on where one is given up: when a job finishes or
is released (``hand_on_slots``, in the same transaction), when a scheduled job falls due,
and by the dispatcher's sweep of every key with blocked jobs (``unblock_sweep``), which
catches slots that expired. Each database's differences follow the generic statements:
when a slot expires (PostgreSQL, MySQL, SQLite), and MySQL's hand-outs, written as a locking
read and then an update.
"""

from collections.abc import Callable, Sequence
from typing import Any

from stalwart.db.dialect import MYSQL_NOW, Dialect, marks
from stalwart.db.rows import Released


class Slots(Dialect):
    """Lock a key, count its free slots, hand them to its blocked jobs."""

    # Waking the workers of the queues whose jobs it made ready is the wake-ups concern's
    # (stalwart.db.wakeups), which every database's Statements puts beside this one.
    notify: Callable[[Any, Sequence[str]], None]

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


class PostgreSQLSlots(Slots):
    """A slot expires by the database's clock."""

    def slot_expired(self, job: str) -> tuple[str, list]:
        return (
            (
                f"({job}.concurrency_duration IS NOT NULL AND {job}.last_attempted_at "
                f"+ make_interval(secs => {job}.concurrency_duration) <= now())"
            ),
            [],
        )


class SQLiteSlots(Slots):
    """A slot expires by the host's clock, in Julian days (SQLite has no interval type)."""

    def slot_expired(self, job: str) -> tuple[str, list]:
        return (
            (
                f"({job}.concurrency_duration IS NOT NULL AND julianday({job}.last_attempted_at) "
                f"+ {job}.concurrency_duration / 86400.0 <= julianday(%s))"
            ),
            [self.now_param()],
        )


# One key's most urgent blocked jobs (key, how many), locked: an arm of a UNION ALL.
_BLOCKED_HEAD = (
    "(SELECT id FROM stalwart_job WHERE status = 'blocked' AND concurrency_key = %s "
    "ORDER BY priority DESC, available_at, id LIMIT %s FOR UPDATE SKIP LOCKED)"
)


class MySQLSlots(Slots):
    """No ``UPDATE … RETURNING``, no ``ON CONFLICT``, no ``UPDATE`` whose subquery reads the
    table it writes, and ``key`` is a reserved word: each hand-out is a locking read of the
    blocked jobs, then an update by id, in one short transaction."""

    def slot_expired(self, job: str) -> tuple[str, list]:
        return (
            (
                f"({job}.concurrency_duration IS NOT NULL AND {job}.last_attempted_at "
                f"+ INTERVAL ROUND({job}.concurrency_duration * 1000000) MICROSECOND "
                f"<= {MYSQL_NOW})"
            ),
            [],
        )

    def lock_concurrency_key(self, cursor: Any, *, key: str, limit: int | None) -> int:
        if limit is None:
            cursor.execute(
                f"UPDATE stalwart_concurrency_key SET updated_at = {MYSQL_NOW} WHERE `key` = %s",
                [key],
            )
            if not cursor.rowcount:
                return 0
        else:
            cursor.execute(
                "INSERT INTO stalwart_concurrency_key (`key`, slot_limit, updated_at) "
                f"VALUES (%s, %s, {MYSQL_NOW}) ON DUPLICATE KEY UPDATE "
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
                f"WHERE id IN ({marks(ids)}) AND status = 'blocked'",
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
                f"SELECT `key` FROM stalwart_concurrency_key WHERE `key` IN ({marks(keys)})", keys
            )
            missing = sorted(set(keys) - {row[0] for row in cursor.fetchall()})
            if missing:
                self._add_concurrency_keys(cursor, missing)
            cursor.execute(
                "SELECT `key`, slot_limit FROM stalwart_concurrency_key "
                f"WHERE `key` IN ({marks(keys)}) ORDER BY `key` FOR UPDATE",
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
                    f"WHERE id IN ({marks(ids)}) AND status = 'blocked'",
                    ids,
                )
                made_ready += cursor.rowcount
            return made_ready

    def _add_concurrency_keys(self, cursor: Any, keys: Sequence[str]) -> None:
        # A key another transaction has just given a row keeps it (the no-op update).
        cursor.execute(
            "INSERT INTO stalwart_concurrency_key (`key`, slot_limit, updated_at) "
            f"SELECT newest.concurrency_key, newest.concurrency_limit, {MYSQL_NOW} FROM ("
            "  SELECT concurrency_key, concurrency_limit, row_number() OVER ("
            "    PARTITION BY concurrency_key ORDER BY id DESC) AS newest_first "
            "  FROM stalwart_job WHERE status = 'blocked' AND concurrency_limit IS NOT NULL"
            f"  AND concurrency_key IN ({marks(keys)})"
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
