"""MySQL and MariaDB only: what stands in for PostgreSQL's partial indexes.

Migration 0010 gives MySQL a generated column, ``unique_holder``, with a UNIQUE index (the
partial unique index on waiting jobs' keys), and indexes whose leading columns are their
condition's. These tests hold the database itself to them: the index refuses a second
holder of a key whatever writes it, and the claim's plan reads an index range in claim
order, never sorting.
"""

import threading
import time
import uuid

import pytest
from django.db import DatabaseError, IntegrityError, connection, connections, transaction
from django.utils import timezone

from stalwart import Call, enqueue_many
from stalwart.models import Job
from tests.helpers import LOCKING_STEPS, in_a_bookkeeping_session
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def mysql_only(vendor):
    if vendor != "mysql":
        pytest.skip("MySQL's own: migration 0010's column and indexes, its session settings")


def insert(key: str, status: str, *, while_running: bool = False) -> uuid.UUID:
    """A job row written as an application (or an operator) would, past Stalwart's code."""
    job_id = uuid.uuid4()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO stalwart_job (id, task_path, backend, queue_name, priority, status, "
            "args, kwargs, available_at, enqueued_at, attempt, max_attempts, worker_ids, "
            "errors, unique_key, unique_while_running, isolated) VALUES (%s, 't', 'default', "
            "'default', 0, %s, '[]', '{}', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 0, 5, '[]', "
            "'[]', %s, %s, 0)",
            [job_id, status, key, while_running],
        )
    return job_id


@pytest.mark.parametrize("status", ["pending", "scheduled", "blocked", "ready"])
def test_the_database_refuses_a_second_waiting_holder_of_a_key(status):
    insert("k", "ready")
    with pytest.raises(IntegrityError), transaction.atomic():
        insert("k", status)


def test_a_key_is_free_again_once_its_job_runs_or_finishes():
    first = insert("k", "ready")
    Job.objects.filter(pk=first).update(status="running")
    second = insert("k", "ready")  # the running job no longer holds the key
    Job.objects.filter(pk=second).update(status="successful")
    insert("k", "ready")
    assert Job.objects.filter(unique_key="k").count() == 3


def test_a_job_unique_while_running_holds_its_key_while_it_runs():
    first = insert("k", "ready", while_running=True)
    Job.objects.filter(pk=first).update(status="running")
    with pytest.raises(IntegrityError), transaction.atomic():
        insert("k", "ready")
    Job.objects.filter(pk=first).update(status="failed")
    insert("k", "ready")


def test_twenty_transactions_inserting_one_key_at_once_leave_one_holder():
    barrier = threading.Barrier(20)
    outcomes: list[str] = []

    def racer() -> None:
        try:
            barrier.wait(10)
            with transaction.atomic():
                insert("raced", "ready")
            outcomes.append("inserted")
        except IntegrityError:
            outcomes.append("refused")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=racer) for _ in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["inserted"] + ["refused"] * 19
    assert Job.objects.filter(unique_key="raced").count() == 1


def plan(sql: str, params: list) -> list[dict]:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}", params)
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


@pytest.mark.parametrize(
    ("conditions", "params", "index"),
    [
        ("AND queue_name = %s", ["default"], "stalwart_job_claim_queue"),
        ("", [], "stalwart_job_claim_any"),
    ],
)
def test_the_claim_reads_its_index_in_claim_order_without_sorting(conditions, params, index):
    enqueue_many(tasks.noop, [Call() for _ in range(200)])
    finished = list(Job.objects.values_list("pk", flat=True)[:150])
    Job.objects.filter(pk__in=finished).update(status="successful")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE TABLE stalwart_job")
        cursor.fetchall()
    (row,) = plan(
        "SELECT id FROM stalwart_job WHERE status = 'ready' AND isolated = %s "
        f"{conditions} ORDER BY priority DESC, available_at, id LIMIT 10 "
        "FOR UPDATE SKIP LOCKED",
        [False, *params],
    )
    assert row["key"] == index, row
    assert "filesort" not in (row["Extra"] or ""), row


def test_the_queues_sessions_carry_timeouts_the_applications_do_not():
    # MariaDB bounds every statement (seconds), MySQL its SELECTs (milliseconds).
    timeout = "max_statement_time" if connection.mysql_is_mariadb else "max_execution_time"
    queue = in_a_bookkeeping_session(
        f"SELECT @@SESSION.innodb_lock_wait_timeout, @@SESSION.{timeout}"
    )
    # InnoDB counts lock waits in whole seconds: half a second is one.
    assert queue == (1, 1.25 if connection.mysql_is_mariadb else 1250)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT @@SESSION.innodb_lock_wait_timeout, @@SESSION.{timeout}, "
            f"@@GLOBAL.innodb_lock_wait_timeout, @@GLOBAL.{timeout}"
        )
        session_wait, session_timeout, server_wait, server_timeout = cursor.fetchone()
    # The application's session keeps the server's settings.
    assert (session_wait, session_timeout) == (server_wait, server_timeout)


def test_a_real_deadlock_is_retried_and_both_transactions_end(recorded_events):
    """Two transactions lock two rows in opposite orders: InnoDB picks one as the victim
    (error 1213), and retry_transient runs the victim's whole transaction again."""
    from django.db.transaction import atomic

    from stalwart.db.retry import retry_transient
    from stalwart.models import Lease

    for name in ("a", "b"):
        Lease.objects.create(
            name=name, holder="x", acquired_at=timezone.now(), expires_at=timezone.now()
        )
    barrier = threading.Barrier(2)
    done: list[str] = []
    errors: list[BaseException] = []

    def lock_both(first: str, second: str) -> None:
        tries = []

        def transaction_of_ours() -> None:
            tries.append(1)
            with atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM stalwart_lease WHERE name = %s FOR UPDATE", [first])
                if len(tries) == 1:
                    barrier.wait(10)  # both hold their first row: each now wants the other's
                cursor.execute("SELECT 1 FROM stalwart_lease WHERE name = %s FOR UPDATE", [second])

        try:
            retry_transient("default", transaction_of_ours, what="deadlock test")
            done.append(first)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [
        threading.Thread(target=lock_both, args=("a", "b")),
        threading.Thread(target=lock_both, args=("b", "a")),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert sorted(done) == ["a", "b"]
    retries = [fields for action, fields in recorded_events if action == "database_retry"]
    assert len(retries) == 1
    assert "1213" in retries[0]["error"]


@pytest.mark.parametrize("step", LOCKING_STEPS)
def test_steps_that_wait_for_row_locks_take_them_in_id_order(step):
    """What PostgreSQL's plans show there (tests/concurrency/test_lock_order.py), the SQL
    shows here: every locking read that may wait sorts on id, so two writers never lock two
    rows in opposite orders."""
    import re

    from django.test.utils import CaptureQueriesContext

    from stalwart.db import statements_for

    statements = statements_for(connection)
    with (
        CaptureQueriesContext(connection) as captured,
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        step(statements, cursor)
    locking = [
        " ".join(query["sql"].split())
        for query in captured.captured_queries
        if "FOR UPDATE" in query["sql"] and "FROM stalwart_job" in query["sql"]
    ]
    assert locking, "no locking read of jobs"
    for sql in locking:
        assert re.search(r"ORDER BY id (LIMIT \d+ )?FOR UPDATE$", sql), sql


# Ten thousand rows from a cross join of digits (MySQL has no generate_series, and MariaDB
# stops a recursive CTE after 1,000 rows).
_TEN_THOUSAND = (
    "(SELECT a.d + 10 * b.d + 100 * c.d + 1000 * e.d AS n FROM "
    + " CROSS JOIN ".join(
        f"(SELECT 0 AS d UNION ALL {' UNION ALL '.join(f'SELECT {i}' for i in range(1, 10))}) "
        f"AS {name}"
        for name in "abce"
    )
    + ") AS numbers"
)


@pytest.fixture
def wide_table():
    """43,000 jobs: 30,000 successful; 2,000 failed (half with a unique key); 10,000 blocked
    over 500 keys; 1,000 ready over 4 queues. 5 recurring keys of 2,000 ticks each. Analyzed."""
    # Failed jobs' ids are version 1 UUIDs whose time (first group) and node (last) are in
    # different orders: MariaDB's UUID type sorts them by the node, Python by the time.
    scrambled = (
        "CONCAT(LPAD(HEX(n), 8, '0'), '-0000-1000-8000-', LPAD(HEX(MOD(n * 7919, 10007)), 12, '0'))"
    )
    shapes = [
        ("UUID()", "successful", "NULL", "NULL", 10_000),
        ("UUID()", "successful", "NULL", "NULL", 10_000),
        ("UUID()", "successful", "NULL", "NULL", 10_000),
        (scrambled, "failed", "NULL", "CASE WHEN MOD(n, 2) = 0 THEN CONCAT('u-', n) END", 2_000),
        ("UUID()", "blocked", "CONCAT('k-', MOD(n, 500))", "NULL", 10_000),
        ("UUID()", "ready", "NULL", "NULL", 1_000),
    ]
    with connection.cursor() as cursor:
        for job_id, status, key, unique, count in shapes:
            cursor.execute(
                "INSERT INTO stalwart_job (id, task_path, backend, queue_name, priority, "
                "status, args, kwargs, available_at, enqueued_at, attempt, max_attempts, "
                "worker_ids, errors, concurrency_key, concurrency_limit, unique_key, "
                "unique_while_running, isolated) "
                f"SELECT {job_id}, 't', 'default', CONCAT('q-', MOD(n, 4)), 0, %s, '[]', '{{}}', "
                "UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 1, 1, '[]', '[\"boom\"]', "
                f"{key}, 1, {unique}, 0, 0 FROM {_TEN_THOUSAND} WHERE n < %s",
                [status, count],
            )
        cursor.execute(
            "INSERT INTO stalwart_recurring_run (`key`, run_at, job_id, created_at) "
            "SELECT CONCAT('tick-', MOD(n, 5)), UTC_TIMESTAMP(6) - INTERVAL n MINUTE, UUID(), "
            f"UTC_TIMESTAMP(6) FROM {_TEN_THOUSAND}"
        )
        for table in ("stalwart_job", "stalwart_recurring_run"):
            cursor.execute(f"ANALYZE TABLE {table}")
            cursor.fetchall()


def sent(call) -> tuple[object, list[tuple[str, list]]]:
    """Run ``call(cursor)`` in a transaction that is rolled back; its result, and the
    statements it sent."""
    statements: list[tuple[str, list]] = []

    def record(execute, sql, params, many, context):
        statements.append((sql, list(params or [])))
        return execute(sql, params, many, context)

    with transaction.atomic(), connection.execute_wrapper(record):
        with connection.cursor() as cursor:
            result = call(cursor)
        transaction.set_rollback(True)
    return result, statements


def explained(statements: list[tuple[str, list]], starts: str) -> list[list[dict]]:
    return [plan(sql, params) for sql, params in statements if sql.lstrip().startswith(starts)]


def test_keys_queues_and_ticks_are_listed_by_loose_index_scans(wide_table):
    from stalwart import ticks
    from stalwart.db import statements_for

    statements = statements_for(connection)
    keys, sql = sent(lambda cursor: statements.blocked_keys(cursor, after="k-1", limit=100))
    assert keys == sorted(f"k-{n}" for n in range(500))[2:102]
    queues, more = sent(statements.waiting_queues)
    assert queues == ["q-0", "q-1", "q-2", "q-3"]
    latest, most = sent(lambda cursor: ticks.last_runs("default"))
    assert sorted(latest) == [f"tick-{n}" for n in range(5)]
    # One index descent per group (MySQL's own loose index scan), not a read of every job.
    for (row,) in explained(sql + more + most, "SELECT"):
        assert "Using index for group-by" in (row["Extra"] or ""), row


def test_the_slot_sweep_hands_out_each_keys_slot_reading_only_its_head(wide_table):
    from stalwart.db import statements_for

    statements = statements_for(connection)
    Job.objects.filter(status="ready").delete()  # every key's slot is free
    (handed_out, last), sql = sent(
        lambda cursor: statements.unblock_sweep(cursor, after=None, limit=1000, notify=False)
    )
    assert (handed_out, last) == (500, "k-99")
    # 500 keys: three statements (200 keys each at most), one index range per key.
    chunks = explained(sql, "(SELECT id FROM stalwart_job")
    assert len(chunks) == 3
    heads = [row for chunk in chunks for row in chunk if row["table"] == "stalwart_job"]
    assert {row["key"] for row in heads} == {"stalwart_job_blocked"}
    assert not any("filesort" in (row["Extra"] or "") for row in heads)


def test_a_retry_batch_reads_failed_jobs_by_id_and_twins_by_the_holder_index(wide_table):
    from stalwart.db import statements_for

    statements = statements_for(connection)
    conditions, params = statements.selection_sql()
    moved, sql = sent(
        lambda cursor: statements.requeue_batch(
            cursor,
            status="failed",
            conditions=conditions,
            params=params,
            limit=500,
            grant_attempt=True,
        )
    )
    assert len(moved) == 500
    # The next batch goes on after the last one's last id.
    with connection.cursor() as cursor:  # the last in the database's order of ids
        cursor.execute(
            f"SELECT max(id) FROM stalwart_job WHERE id IN ({', '.join(['%s'] * len(moved))})",
            [job_id for _, _, job_id in moved],
        )
        after = cursor.fetchone()[0]
    later, more = sent(
        lambda cursor: statements.requeue_batch(
            cursor,
            status="failed",
            conditions=conditions,
            params=params,
            limit=500,
            grant_attempt=True,
            after=after,
        )
    )
    assert len(later) == 500
    assert not {job_id for _, _, job_id in moved} & {job_id for _, _, job_id in later}
    for chosen, *checks in explained(sql + more, "SELECT id FROM stalwart_job AS candidate"):
        assert chosen["key"] == "stalwart_job_failed_id", chosen
        assert "filesort" not in (chosen["Extra"] or ""), chosen
        twin = next(row for row in checks if row["table"] == "twin")
        assert twin["key"] == "stalwart_job_unique_waiting", twin


def test_retrying_in_batches_moves_every_failed_job_whatever_the_uuid_order(wide_table):
    # The failed jobs' ids sort one way in MariaDB's UUID type, another in Python: a batch
    # goes on after an id of the last one, and none is left behind.
    from stalwart.control import Selection, retry_failed

    assert retry_failed(Selection(everything=True), batch_size=300) == 2_000
    assert not Job.objects.filter(status="failed").exists()


def test_an_update_waiting_on_a_table_lock_gives_up_at_the_lock_timeout():
    """MySQL 8's ``max_execution_time`` bounds only SELECTs, and ``innodb_lock_wait_timeout``
    only row locks: an UPDATE waiting for a metadata lock (``LOCK TABLES``, an ``ALTER
    TABLE``) would wait for a year. The queue's sessions set ``lock_wait_timeout`` too: with
    a 30 s statement timeout and a 1 s lock timeout, the blocked UPDATE fails in about 1 s."""
    from stalwart.db.session import bookkeeping

    outcome: dict = {}

    def blocked_update() -> None:
        try:
            bookkeeping(
                "default",
                application_name="stalwart:worker:4242",
                statement_timeout=30,
                lock_timeout=1,
            )
            started = time.monotonic()
            try:
                with connections["default"].cursor() as cursor:
                    cursor.execute("UPDATE stalwart_job SET priority = 0 WHERE priority > 1000")
            except DatabaseError as error:
                outcome["error"] = error
            outcome["took"] = time.monotonic() - started
        finally:
            connections.close_all()

    holder = connections.create_connection("default")
    thread = threading.Thread(target=blocked_update)
    try:
        with holder.cursor() as cursor:
            cursor.execute("LOCK TABLES stalwart_job WRITE")
        thread.start()
        thread.join(10)
    finally:
        with holder.cursor() as cursor:
            cursor.execute("UNLOCK TABLES")
        holder.close()
        thread.join(40)
    assert "error" in outcome, f"the UPDATE was not stopped: {outcome}"
    assert outcome["took"] < 5, outcome
    with connection.cursor() as cursor:
        cursor.execute("SELECT @@GLOBAL.lock_wait_timeout")
        (server_wait,) = cursor.fetchone()
    assert server_wait > 5  # the application's sessions keep the server's setting


def test_the_queues_sessions_bound_every_answer_on_the_client():
    """MySQL 8 bounds no UPDATE or DELETE that runs long: the client gives up on an answer
    after the statement timeout and a margin (the application's connections keep theirs)."""
    from stalwart.db.session import CLIENT_MARGIN, bookkeeping

    seen: dict = {}

    def bookkeeping_thread() -> None:
        try:
            bookkeeping(
                "default",
                application_name="stalwart:worker:4242",
                statement_timeout=1.25,
                lock_timeout=0.5,
            )
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT @@SESSION.lock_wait_timeout")
                seen["wait"] = cursor.fetchone()[0]
            options = connections["default"].settings_dict["OPTIONS"]
            seen["read"], seen["write"] = options["read_timeout"], options["write_timeout"]
        finally:
            connections.close_all()

    thread = threading.Thread(target=bookkeeping_thread)
    thread.start()
    thread.join(10)
    assert seen == {"wait": 1, "read": 2 + CLIENT_MARGIN, "write": 2 + CLIENT_MARGIN}
    options = connections["default"].settings_dict.get("OPTIONS") or {}
    assert "read_timeout" not in options


def test_the_look_at_dependants_of_jobs_just_ended_reads_only_jobs_with_dependants(wide_table):
    """30,000 jobs just ended, none with dependants: the dispatcher's look at the
    dependants of jobs ended since its last look reads the parents' index, not them."""
    from datetime import timedelta

    from django.db.models.functions import Now
    from django.utils import timezone

    from stalwart.db import dependencies

    Job.objects.filter(status="successful").update(finished_at=Now())
    # And 10,000 jobs waiting for blocked parents, none of which has ended.
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO stalwart_dependency (child, parent, position, on_failure) "
            f"SELECT UUID(), parent.id, 0, 'cancel' FROM {_TEN_THOUSAND} "
            "JOIN stalwart_job parent ON parent.status = 'blocked' AND MOD(n, 10) = 0 "
            "WHERE n < 10 LIMIT 10000"
        )
        cursor.execute("UPDATE stalwart_job SET has_dependants = TRUE WHERE status = 'blocked'")
        cursor.execute("ANALYZE TABLE stalwart_dependency")
        cursor.fetchall()
        cursor.execute("ANALYZE TABLE stalwart_job")
        cursor.fetchall()
    since = timezone.now() - timedelta(hours=1)
    children, sql = sent(
        lambda cursor: dependencies.recent_children("default", since=since, limit=1000)
    )
    assert children == []
    (rows,) = explained(sql, "SELECT")
    parents = [row for row in rows if row["table"] == "parent"]
    assert [row["key"] for row in parents] == ["stalwart_job_parents"], rows
