"""Retention for batches (issue 20): a batch and its jobs are pruned together, never half a
batch.

A job of a batch is kept while its batch is unfinished, or finished more recently than the
cutoff the delete uses; a finished batch older than the cutoff goes once no job of it is
left, with its leftover links. By the retention chore (``delete_expired_jobs``), by
``queue prune`` (and its dry run) and by ``stalwart.control``, on the database under test.
Batches are made, run and finished by real workers; only times are moved back, by hand.
"""

import json
import uuid
from dataclasses import replace
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.tasks import default_task_backend
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

import stalwart
from stalwart import Call, control
from stalwart.control import Selection
from stalwart.db import statements_for
from stalwart.exceptions import InvalidBatch
from stalwart.ids import uuid7
from stalwart.jobs import JobStore
from stalwart.models import Batch as BatchRow
from stalwart.models import BatchJob, Job
from tests.helpers import at_once, drain, wait_for, worker_thread
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

DAY = timedelta(days=1)


def finished_batch(*, succeeding: int = 2, failing: int = 0, **callbacks) -> stalwart.Batch:
    """A closed batch run to its end by a worker: its members and its callbacks done."""
    with stalwart.batch(**(callbacks or {"on_finish": tasks.noop})) as batch:
        batch.enqueue_many(tasks.add, [Call(n, n) for n in range(succeeding)])
        failures = batch.enqueue_many(tasks.fail, [Call("bad row")] * failing) if failing else []
    Job.objects.filter(pk__in=[result.id for result in failures]).update(max_attempts=1)
    drain(threads=2)
    assert batch.finished
    return batch


def jobs_of(batch: stalwart.Batch):
    return Job.objects.filter(pk__in=BatchJob.objects.filter(batch=batch.id).values("job"))


def age(batch: stalwart.Batch, *, days: float, jobs: bool = True) -> None:
    """Move the batch's end (and, with ``jobs``, its finished jobs' ends) ``days`` back."""
    then = timezone.now() - timedelta(days=days)
    if jobs:
        jobs_of(batch).filter(finished_at__isnull=False).update(finished_at=then)
    BatchRow.objects.filter(pk=batch.id).update(finished_at=then)


def left(batch: stalwart.Batch) -> tuple[bool, int, int]:
    """What is left of a batch: its row, its jobs, its links."""
    return (
        BatchRow.objects.filter(pk=batch.id).exists(),
        jobs_of(batch).count(),
        BatchJob.objects.filter(batch=batch.id).count(),
    )


def retention(*, successful=DAY, failed=7 * DAY, cancelled=7 * DAY):
    return replace(
        default_task_backend.config,
        keep_successful=successful,
        keep_failed=failed,
        keep_cancelled=cancelled,
    )


def queue(*args: str) -> str:
    out = StringIO()
    call_command("queue", *args, stdout=out)
    return out.getvalue()


def test_half_a_batch_is_never_pruned_while_the_batch_is_unfinished():
    still_open = stalwart.batch(on_finish=tasks.noop)
    still_open.enqueue_many(tasks.add, [Call(1, 1), Call(2, 2)])
    waiting = stalwart.batch(on_finish=tasks.noop)
    waiting.enqueue_many(tasks.add, [Call(1, 1), Call(2, 2)])
    drain(threads=2)
    waiting.enqueue(tasks.add, 3, 3)  # still to run
    waiting.close()
    month_ago = timezone.now() - timedelta(days=30)
    Job.objects.filter(status="successful").update(finished_at=month_ago)

    assert control.prune_finished(older_than=DAY, dry_run=True) == 0
    assert control.prune_batches(older_than=DAY, dry_run=True) == 0
    assert control.prune_finished(older_than=DAY) == 0
    assert control.delete_expired_jobs(retention(successful=timedelta(0))) == 0
    assert control.prune_batches(older_than=timedelta(0)) == 0
    assert left(still_open) == (True, 2, 2)
    assert left(waiting) == (True, 3, 3)
    assert waiting.progress().succeeded == 2


def test_half_a_batch_is_never_pruned_while_the_batch_finished_recently():
    batch = finished_batch(succeeding=3)
    age(batch, days=30)
    # Its jobs are a month old, but it finished twelve hours ago (a long batch).
    BatchRow.objects.filter(pk=batch.id).update(finished_at=timezone.now() - timedelta(hours=12))

    assert control.prune_finished(older_than=DAY) == 0
    assert control.prune_batches(older_than=DAY) == 0
    assert left(batch) == (True, 4, 4)

    age(batch, days=2, jobs=False)
    assert control.prune_finished(older_than=DAY) == 4
    assert control.prune_batches(older_than=DAY) == 1
    assert left(batch) == (False, 0, 0)


def test_the_retention_chore_prunes_an_old_batch_whole(recorded_events):
    old = finished_batch(succeeding=3)
    age(old, days=2)
    recent = finished_batch(succeeding=3)
    lone = tasks.add.enqueue(1, 2)
    drain(threads=1)

    assert control.delete_expired_jobs(retention()) == 4  # three members and a callback
    assert left(old) == (False, 0, 0)
    assert left(recent) == (True, 4, 4)
    assert Job.objects.filter(pk=lone.id).exists()
    pruned = [fields for action, fields in recorded_events if action == "batches_pruned"]
    assert pruned == [{"count": 1, "older_than": DAY.total_seconds()}]
    with pytest.raises(InvalidBatch, match="No batch has the id"):
        stalwart.get_batch(old.id)


def test_a_running_callback_keeps_the_batch_row():
    tasks.GATE.clear()
    try:
        with stalwart.batch(on_finish=tasks.wait_at_gate) as batch:
            batch.enqueue_many(tasks.add, [Call(1, 1), Call(2, 2)])
        with worker_thread(threads=2, promote_scheduled=True):
            callback = wait_for(
                lambda: Job.objects.filter(
                    pk__in=BatchJob.objects.filter(batch=batch.id, role="on_finish").values("job"),
                    status="running",
                ).first(),
                message="the batch's callback to run",
            )
            age(batch, days=2)  # its members, and its end: the callback has not ended

            assert control.prune_finished(older_than=DAY) == 2
            assert control.prune_batches(older_than=DAY) == 0
            assert left(batch) == (True, 1, 1)
            assert batch.progress().deleted == 2
            tasks.GATE.set()
            wait_for(lambda: Job.objects.get(pk=callback.pk).status == "successful")
    finally:
        tasks.GATE.clear()
    assert control.prune_batches(older_than=DAY) == 0  # its callback just ended
    age(batch, days=2)
    assert control.prune_finished(older_than=DAY) == 1
    assert control.prune_batches(older_than=DAY) == 1
    assert left(batch) == (False, 0, 0)


def test_the_dry_run_counts_what_queue_prune_then_deletes():
    whole = finished_batch(succeeding=3)  # three members and a callback
    age(whole, days=2)
    with_failure = finished_batch(succeeding=2, failing=1)  # and its on_finish callback
    age(with_failure, days=2)
    recent = finished_batch(succeeding=2)
    age(recent, days=30)
    BatchRow.objects.filter(pk=recent.id).update(finished_at=timezone.now())
    unfinished = stalwart.batch()
    unfinished.enqueue(tasks.add, 1, 1)
    plain = [tasks.add.enqueue(n, n) for n in range(3)]
    drain(threads=2)
    month_ago = timezone.now() - timedelta(days=30)
    jobs_of(unfinished).update(finished_at=month_ago)
    Job.objects.filter(pk__in=[result.id for result in plain[:2]]).update(finished_at=month_ago)
    before = Job.objects.count(), BatchRow.objects.count(), BatchJob.objects.count()

    # Successful jobs only: the failed member keeps its batch.
    dry = queue("prune", "--older-than", "1d", "--status", "successful", "--dry-run")
    assert dry == "Would delete 9 finished jobs and 1 batch (dry run: nothing changed).\n"
    assert (Job.objects.count(), BatchRow.objects.count(), BatchJob.objects.count()) == before
    assert queue("prune", "--older-than", "1d", "--status", "successful") == (
        "Deleted 9 finished jobs and 1 batch.\n"
    )
    assert left(whole) == (False, 0, 0)
    assert left(with_failure) == (True, 1, 1)
    # Then every state: the failed member, and its batch with it.
    dry = queue("prune", "--older-than", "1d", "--dry-run", "--batch-size", "1")
    assert dry == "Would delete 1 finished job and 1 batch (dry run: nothing changed).\n"
    assert queue("prune", "--older-than", "1d", "--batch-size", "1") == (
        "Deleted 1 finished job and 1 batch.\n"
    )
    assert left(with_failure) == (False, 0, 0)
    assert queue("prune", "--older-than", "1d", "--dry-run") == (
        "Would delete 0 finished jobs and 0 batches (dry run: nothing changed).\n"
    )
    assert left(recent) == (True, 3, 3)
    assert left(unfinished) == (True, 1, 1)
    assert Job.objects.filter(pk=plain[2].id).exists()


def test_a_batch_with_failed_members_is_kept_as_long_as_keep_failed_says():
    batch = finished_batch(succeeding=2, failing=1, on_failure=tasks.noop, on_finish=tasks.noop)
    config = retention(successful=DAY, failed=7 * DAY)
    age(batch, days=3)
    # The successful members and both callbacks go; the failed member, and the batch, stay.
    assert control.delete_expired_jobs(config) == 4
    assert left(batch) == (True, 1, 1)
    progress = batch.progress()
    assert (progress.total, progress.failed, progress.deleted) == (3, 1, 2)
    age(batch, days=6.5)
    assert control.delete_expired_jobs(config) == 0
    assert left(batch) == (True, 1, 1)
    age(batch, days=8)
    assert control.delete_expired_jobs(config) == 1
    assert left(batch) == (False, 0, 0)

    # Failed jobs kept for ever: such a batch is kept for ever.
    kept = finished_batch(succeeding=1, failing=1)
    age(kept, days=1000)
    assert control.delete_expired_jobs(retention(failed=None)) == 2
    assert left(kept) == (True, 1, 1)


def test_a_batch_left_without_jobs_goes_once_it_is_old():
    # No job ever: empty, and its only callback is for a failure.
    with stalwart.batch(on_failure=tasks.noop) as empty:
        pass
    assert JobStore("default").finish_batches() == 1
    # Its failed member discarded by hand while the batch was recent (no on_success then).
    discarded = finished_batch(succeeding=0, failing=1, on_success=tasks.noop)
    assert control.discard_failed(Selection(ids=[j.pk for j in jobs_of(discarded)])) == 1
    # A link whose job was deleted some other way keeps nothing.
    linked = finished_batch(succeeding=0, on_success=tasks.noop)
    BatchJob.objects.filter(batch=linked.id).update(job=uuid.uuid4())

    assert [left(batch) for batch in (empty, discarded, linked)] == [
        (True, 0, 0),
        (True, 0, 0),
        (True, 0, 1),
    ]
    assert control.prune_batches(older_than=DAY, dry_run=True) == 0
    assert control.prune_batches(older_than=DAY) == 0
    for batch in (empty, discarded, linked):
        age(batch, days=2)
    assert control.prune_batches(older_than=DAY, dry_run=True) == 3
    assert control.prune_batches(older_than=DAY) == 3
    assert [left(batch) for batch in (empty, discarded, linked)] == [(False, 0, 0)] * 3


def test_batches_are_pruned_in_bounded_transactions_each_looked_at_once():
    kept, empty = [], []
    for n in range(7):
        if n % 2:
            kept.append(finished_batch(succeeding=1))
        else:
            with stalwart.batch(on_failure=tasks.noop) as batch:
                pass
            JobStore("default").finish_batches()
            empty.append(batch)
    for batch in kept + empty:
        age(batch, days=2, jobs=False)  # the kept ones' jobs are recent

    with CaptureQueriesContext(connection) as sent:
        assert control.prune_batches(older_than=DAY, batch_size=2) == 4
    looks = [query for query in sent if "ORDER BY id LIMIT" in query["sql"]]
    assert len(looks) == 4  # 2 + 2 + 2 + 1 batches looked at: each once
    assert [left(batch)[0] for batch in kept + empty] == [True] * 3 + [False] * 4


def test_pruners_at_once_delete_each_batch_once():
    batches = []
    for _ in range(5):
        with stalwart.batch(on_failure=tasks.noop) as batch:
            pass
        batches.append(batch)
    assert JobStore("default").finish_batches() == 5
    for batch in batches:
        age(batch, days=2)

    deleted = at_once(3, lambda _: control.prune_batches(older_than=DAY, batch_size=2))
    assert sum(deleted) == 5
    assert not BatchRow.objects.exists()


# -- plans -------------------------------------------------------------------------------

# What a batch's links and jobs are read as in the statements: each must be read by index,
# per row, never whole (a sequential scan, a full index scan, or a set built up front).
_PER_ROW = {"link", "membership", "job", "kept_batch", "stalwart_batch_job"}


@pytest.fixture
def history():
    """1,000 finished batches of 20 members and a callback (half of them a month old), 50
    open ones, and 10,000 jobs of no batch: links and jobs enough for the planners to
    choose. Analyzed."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite runs every subquery here per row, by the indexes it names")
    now = timezone.now()
    batches, links, jobs = [], [], []

    def job(ended, status="successful"):
        jobs.append(
            Job(
                id=uuid.uuid4(),
                task_path="t",
                status=status,
                available_at=now,
                enqueued_at=now,
                finished_at=ended,
            )
        )
        return jobs[-1].id

    for n in range(1_050):
        ended = None if n < 50 else now - timedelta(days=30 if n % 2 else 0, seconds=n)
        batch = BatchRow(
            id=uuid7(),
            backend="default",
            created_at=now,
            closed_at=now,
            finished_at=ended,
            total=20,
        )
        batches.append(batch)
        for _ in range(20):
            member = job(ended, "successful" if ended else "ready")
            links.append(BatchJob(batch=batch.id, job=member, role="member"))
        if ended:
            links.append(BatchJob(batch=batch.id, job=job(ended), role="on_finish"))
    for n in range(10_000):
        job(now - timedelta(days=n % 40))
    Job.objects.bulk_create(jobs, batch_size=5000)
    BatchRow.objects.bulk_create(batches, batch_size=5000)
    BatchJob.objects.bulk_create(links, batch_size=5000)
    with connection.cursor() as cursor:
        for table in ("stalwart_job", "stalwart_batch", "stalwart_batch_job"):
            if connection.vendor == "postgresql":
                cursor.execute(f"ANALYZE {table}")
            else:
                cursor.execute(f"ANALYZE TABLE {table}")
                cursor.fetchall()


def read_whole(sql: str, params: list, cursor) -> list[str]:
    """How the statement would read a batch's links or jobs other than by index, per row:
    one entry (alias and how) for each such read in its plan."""
    found = []
    if connection.vendor == "postgresql":
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0]

        def walk(node: dict) -> None:
            how = node["Node Type"]
            # (A Bitmap Heap Scan reads what its Bitmap Index Scan, looked at too, found.)
            by_index = how in ("Index Scan", "Index Only Scan", "Bitmap Index Scan")
            per_row = (by_index and "Index Cond" in node) or how == "Bitmap Heap Scan"
            if node.get("Alias") in _PER_ROW and not per_row and how != "ModifyTable":
                found.append(f"{node['Alias']}: {how}")
            for child in node.get("Plans", []):
                walk(child)

        walk((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
    else:
        cursor.execute(f"EXPLAIN {sql}", params)
        names = [column[0] for column in cursor.description]
        for values in cursor.fetchall():
            row = dict(zip(names, values, strict=True))
            if row["table"] in _PER_ROW and (
                row["type"] in ("ALL", "index") or row["select_type"] == "MATERIALIZED"
            ):
                found.append(f"{row['table']}: {row['select_type']} {row['type']}")
    return found


def test_the_retention_statements_read_links_and_jobs_per_row_by_index(history):
    """The chore's batches of deletes keep a batch's jobs by looking up each candidate's
    link (not by reading every link of every batch kept: MariaDB would materialise a
    NOT EXISTS), and the batch sweep reads each old batch's links by the batch."""
    month = timedelta(days=29).total_seconds()
    whole: list[tuple[str, list[str]]] = []

    def explain(execute, sql, params, many, context):
        # The statements that choose (a delete by a list of ids is planned by the list's
        # size against the table's: a small table is read whole, rightly).
        if sql.lstrip().startswith(("SELECT", "WITH")):
            whole.append((sql, read_whole(sql, params, context["cursor"].cursor)))
        return execute(sql, params, many, context)

    with transaction.atomic(), connection.execute_wrapper(explain):
        with connection.cursor() as cursor:
            statements = statements_for(connection)
            deleted = statements.delete_batch(
                cursor,
                statuses=["successful"],
                conditions="",
                params=[],
                limit=500,
                older_than=month,
            )
            looked_at, _, _ = statements.delete_finished_batches(
                cursor, older_than=month, limit=500
            )
        transaction.set_rollback(True)
    assert (deleted, looked_at) == (500, 500)
    assert len(whole) >= 3
    assert [(sql, reads) for sql, reads in whole if reads] == []
