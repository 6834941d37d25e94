"""Statements that lock rows other statements may lock take them in id order, as the docs
say, so they cannot deadlock each other: PostgreSQL's plan locks rows (``LockRows``) as it
reads them in id order (sorted on ``id``, or read along the primary key or
``stalwart_job_failed_id``, an index on the id alone)."""

import re

import pytest
from django.db import connection, connections

from stalwart.db import statements_for
from tests.helpers import LOCKING_STEPS

pytestmark = pytest.mark.django_db(transaction=True)


class Recording:
    """A stand-in cursor that keeps the statement it is given (run below with EXPLAIN)."""

    rowcount = 0

    def execute(self, sql: str, params: list | None = None) -> None:
        self.sql, self.params = sql, params

    def fetchall(self) -> list:
        return []

    def fetchone(self) -> tuple:
        return (0, [])


def plan_of(call) -> list[str]:
    recording = Recording()
    call(recording)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (COSTS OFF) " + recording.sql, recording.params)
        return [row[0] for row in cursor.fetchall()]


# Nodes that pass on their outer side's rows in the order they come (and their conditions):
# nested loops and anti-joins, merge or hash, keep the order of the rows they test.
ORDER_KEEPING = (
    "Nested Loop",
    "Merge Anti Join",
    "Merge Cond",
    "Hash Anti Join",
    "Hash Cond",
    "Join Filter",
    "Filter",
    "Limit",
)


def locks_in_id_order(plan: list[str]) -> bool:
    """Every LockRows node reads its rows sorted on id, or along the primary key."""
    lock_lines = [index for index, line in enumerate(plan) if "LockRows" in line]
    if not lock_lines:
        return False
    for index in lock_lines:
        below = plan[index + 1 : index + 4]
        sorted_on_id = any(re.search(r"Sort Key: (\w+\.)?id$", line.strip()) for line in below)
        # Along the primary key, or along an index whose key is the id alone; perhaps at the
        # outer end of nested loops (anti-joins), which keep the order of their outer side.
        nodes = [line.strip().removeprefix("->  ") for line in plan[index + 1 :]]
        at, first = next(
            (at, node) for at, node in enumerate(nodes) if not node.startswith(ORDER_KEEPING)
        )
        along_key = any(name in first for name in ("stalwart_job_pkey", "_failed_id "))
        # Or sorted on id at the outer end of those nested loops (an anti-join: retention
        # keeps a job that a pending job runs after).
        sorted_below = first.startswith("Sort") and bool(
            re.search(r"Sort Key: (\w+\.)?id$", nodes[at + 1] if at + 1 < len(nodes) else "")
        )
        if not (sorted_on_id or along_key or sorted_below):
            return False
    return True


@pytest.fixture
def statements(vendor):
    if vendor != "postgresql":
        pytest.skip(
            "the lock order is read from PostgreSQL's plans (SQLite has one writer; MySQL's "
            "is read from its SQL in tests/integration/test_mysql.py)"
        )
    return statements_for(connections["default"])


@pytest.mark.parametrize("statement", LOCKING_STEPS)
def test_rows_are_locked_in_id_order(statements, statement):
    plan = plan_of(lambda cursor: statement(statements, cursor))
    assert locks_in_id_order(plan), "\n".join(plan)
