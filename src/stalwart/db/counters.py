"""The metrics' counters: amounts added to rows keyed by (name, queue, task, bucket),
created as needed, in batches; rows taken in key order, so two processes adding at once lock
them in one order."""

from collections.abc import Sequence
from typing import Any

from stalwart.db.dialect import MYSQL_NOW, Dialect


class Counters(Dialect):
    """Add to counters with one upsert per 500 (``ON CONFLICT … DO UPDATE``)."""

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


class MySQLCounters(Counters):
    """Likewise with ``ON DUPLICATE KEY UPDATE`` (MySQL has no ``ON CONFLICT``)."""

    def add_to_counters(self, cursor: Any, counts: Sequence[tuple[tuple, float]]) -> None:
        for start in range(0, len(counts), 500):
            chunk = counts[start : start + 500]
            params: list = []
            for (name, queue, task, le), amount in chunk:
                params.extend([name, queue, task, le, amount])
            rows = ", ".join([f"(%s, %s, %s, %s, %s, {MYSQL_NOW})"] * len(chunk))
            cursor.execute(
                "INSERT INTO stalwart_counter (name, queue_name, task_path, le, value, "
                f"updated_at) VALUES {rows} ON DUPLICATE KEY UPDATE "
                "value = value + VALUES(value), updated_at = VALUES(updated_at)",
                params,
            )
