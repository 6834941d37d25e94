"""MySQL and MariaDB only: what stands in for PostgreSQL's partial indexes.

Migration 0010 gives MySQL a generated column, ``unique_holder``, with a UNIQUE index (the
partial unique index on waiting jobs' keys), and indexes whose leading columns are their
condition's. These tests hold the database itself to them: the index refuses a second
holder of a key whatever writes it, and the claim's plan reads an index range in claim
order, never sorting.
"""

import threading
import uuid

import pytest
from django.db import IntegrityError, connection, connections, transaction
from django.utils import timezone

from stalwart import Call, enqueue_many
from stalwart.models import Job
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


@pytest.mark.parametrize("status", ["scheduled", "blocked", "ready"])
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
    from stalwart.db.session import bookkeeping

    # MariaDB bounds every statement (seconds), MySQL its SELECTs (milliseconds).
    timeout = "max_statement_time" if connection.mysql_is_mariadb else "max_execution_time"
    seen: dict[str, tuple] = {}

    def bookkeeping_thread() -> None:
        try:
            bookkeeping(
                "default",
                application_name="stalwart:worker:4242",
                statement_timeout=1.25,
                lock_timeout=0.5,
            )
            with connections["default"].cursor() as cursor:
                cursor.execute(f"SELECT @@SESSION.innodb_lock_wait_timeout, @@SESSION.{timeout}")
                seen["queue"] = cursor.fetchone()
        finally:
            connections.close_all()

    thread = threading.Thread(target=bookkeeping_thread)
    thread.start()
    thread.join(10)
    # InnoDB counts lock waits in whole seconds: half a second is one.
    assert seen["queue"] == (1, 1.25 if connection.mysql_is_mariadb else 1250)
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


def _outcomes() -> list:
    from stalwart.db import Outcome

    return [Outcome(id=uuid.uuid4(), attempt=1, status="successful") for _ in range(10)]


@pytest.mark.parametrize(
    "step",
    [
        pytest.param(lambda s, c: s.finish(c, owner=1, outcomes=_outcomes()), id="finish"),
        pytest.param(
            lambda s, c: s.release_rows(c, owner=1, jobs=[(uuid.uuid4(), 1)]), id="release"
        ),
        pytest.param(
            lambda s, c: s.release_owner_rows(c, owner=1, error_class="x", error_text="y"),
            id="release_owner",
        ),
        pytest.param(
            lambda s, c: s.delete_batch(
                c, statuses=["failed"], conditions="", params=[], limit=1000, older_than=60
            ),
            id="retention",
        ),
        pytest.param(
            lambda s, c: s.requeue_batch(
                c, status="failed", conditions="", params=[], limit=1000, grant_attempt=True
            ),
            id="retry",
        ),
        pytest.param(
            lambda s, c: s.cancel_batch(c, conditions="", params=[], limit=1000), id="cancel"
        ),
    ],
)
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
