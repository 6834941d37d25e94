"""Attacks on batches (issue 20) and on what finishes them: the dispatcher's look
(``JobStore.promote_due`` -> ``finish_batches`` -> ``_finish_batch``), retention, unique
tasks, and ``Batch.cancel``.

Each test states what it shows: "FAILS on a8cb2de: ..." for a defect it reproduces,
"Holds: ..." for a promise it checks and that stands.
"""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

import stalwart
from stalwart import Call
from stalwart.control import prune_finished
from stalwart.exceptions import InvalidBatch
from stalwart.jobs import JobStore
from stalwart.models import Batch as BatchRow
from stalwart.models import BatchJob, Job
from tests.helpers import at_once, drain, wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def callbacks_of(batch) -> dict[str, Job]:
    links = BatchJob.objects.filter(batch=batch.id).exclude(role="member")
    return {link.role: Job.objects.get(pk=link.job) for link in links}


def due_scheduled_job() -> str:
    """A plain job, scheduled and due: what every look of a dispatcher must promote."""
    result = tasks.noop.enqueue()
    Job.objects.filter(pk=result.id).update(
        status="scheduled", available_at=timezone.now() - timedelta(seconds=5)
    )
    return result.id


def test_a_callback_the_dispatcher_cannot_resolve_stops_every_look():
    """FAILS on a8cb2de: a closed batch whose callback's task path no longer resolves in
    the dispatcher (the task renamed or removed by a deploy after the batch was made, or a
    dispatcher started without that task module) makes ``_finish_batch``'s ``resolve_task``
    raise ``TaskNotFound``. Nothing catches it: ``finish_batches`` runs first in every
    ``promote_due``, so the look raises before the dependencies are resolved and the due
    jobs promoted, at every look, forever; in a dispatcher process ``step`` lets anything
    but a database failure propagate, so it crashes and crash-loops. Every other batch, every
    scheduled job and every dependant waits behind this one batch."""
    with stalwart.batch(on_success=tasks.noop, label="poisoned") as poisoned:
        pass
    BatchRow.objects.filter(pk=poisoned.id).update(
        callbacks={
            "on_success": {
                "task_path": "tests.testapp.tasks.renamed_in_a_deploy",
                "queue_name": "default",
                "priority": 0,
                "args": [],
                "kwargs": {},
            }
        }
    )
    with stalwart.batch(on_success=tasks.noop, label="healthy") as healthy:
        pass
    due = due_scheduled_job()

    store = JobStore("default")
    store.promote_due()  # raises TaskNotFound today

    assert Job.objects.get(pk=due).status == "ready", "a due job was not promoted"
    assert set(callbacks_of(healthy)) == {"on_success"}, "a healthy batch did not finish"


def test_a_unique_callback_is_refused_and_a_unique_members_twin_is_not_counted():
    """FAILED on a8cb2de: a unique task's enqueue may answer with a twin, which is not a job
    of the batch: as two callbacks of one batch, or one callback of two batches, the second
    link broke ``stalwart_batch_job_once`` at every look (IntegrityError, and nothing
    promoted); as a member, the twin was counted or raised a raw IntegrityError. A unique
    task is refused as a callback, and nothing is stored; as a member (issue 20), a call
    whose key a twin holds returns the twin, which is neither linked nor counted."""
    before = (BatchRow.objects.count(), Job.objects.count())
    with pytest.raises(InvalidBatch, match="is unique"):
        stalwart.batch(
            on_success=(tasks.unique_report, Call(day="monday")),
            on_finish=(tasks.unique_report, Call(day="monday")),
        )
    assert (BatchRow.objects.count(), Job.objects.count()) == before
    twin = tasks.unique_report.enqueue("wednesday")
    batch = stalwart.batch()
    assert batch.enqueue(tasks.unique_report, "wednesday").id == twin.id
    assert BatchRow.objects.get(pk=batch.id).total == 0
    assert not BatchJob.objects.filter(batch=batch.id).exists()
    assert Job.objects.count() == before[1] + 1


def test_a_hundred_batches_still_running_hold_up_every_newer_batch():
    """FAILS on a8cb2de: ``finish_batches`` reads the 100 oldest closed, unfinished batches
    (``db/batches.py`` ``waiting(limit=100)``, ordered by ``closed_at``) and skips those with
    a member still to finish. With 100 older batches still running (long imports), a newer
    batch whose members have all finished is never even looked at: its callbacks wait until
    one of the hundred finishes, however long that takes."""
    for n in range(100):
        with stalwart.batch(on_finish=tasks.noop, label=f"long {n}") as long_running:
            long_running.enqueue(tasks.noop)  # stays ready: still to finish
    with stalwart.batch(on_finish=tasks.noop, label="done") as done:
        member = done.enqueue(tasks.add, 1, 1)
    Job.objects.filter(pk=member.id).update(status="successful", finished_at=timezone.now())

    assert JobStore("default").finish_batches() == 1
    assert set(callbacks_of(done)) == {"on_finish"}


def test_retention_turns_a_batch_with_a_failed_member_into_a_success():
    """FAILS on a8cb2de: a batch kept open (or one with a long member) outlives its failed
    member's retention. ``prune_finished`` deletes the failed member and its
    ``stalwart_batch_job`` row (``db/control.py`` ``_forget_links``), nothing keeps a member
    of an unfinished batch, and ``_finish_batch`` counts a deleted member as finished and not
    failed: ``on_success`` runs ("every member succeeded") and ``on_failure`` never does, and
    the callback's ``progress()`` says failed=0."""
    batch = stalwart.batch(on_success=tasks.batch_report, on_failure=tasks.batch_report)
    failing = batch.enqueue(tasks.fail, "row 3 is malformed")
    Job.objects.filter(pk=failing.id).update(max_attempts=1)
    drain(threads=1)
    assert Job.objects.get(pk=failing.id).status == "failed"
    # Retention runs while the batch is still open (the failure is older than keep_failed):
    # it keeps the member of a batch not finished.
    Job.objects.filter(pk=failing.id).update(finished_at=timezone.now() - timedelta(days=8))
    assert prune_finished(older_than=timedelta(days=7), statuses=["failed"]) == 0
    assert Job.objects.filter(pk=failing.id).exists()
    batch.enqueue(tasks.add, 1, 1)
    batch.close()
    drain(threads=1)

    assert batch.finished
    assert set(callbacks_of(batch)) == {"on_failure"}, (
        f"a batch with a failed member ran {sorted(callbacks_of(batch))}"
    )
    # Its batch finished, the member goes with the batch: once the batch is older than
    # the retention too (tests/integration/test_batch_retention.py).
    assert prune_finished(older_than=timedelta(days=7), statuses=["failed"]) == 0
    BatchRow.objects.filter(pk=batch.id).update(finished_at=timezone.now() - timedelta(days=8))
    assert prune_finished(older_than=timedelta(days=7), statuses=["failed"]) == 1


def test_cancelling_a_batch_of_many_members_fails_on_sqlite():
    """FAILS on a8cb2de (SQLite as SQLite's own build limits it): ``Batch.cancel`` reads every
    member id and passes them all to ``stalwart.cancel(*ids)``, whose selection is one
    ``id IN (%s, ...)`` with a parameter per member, repeated in every statement of the
    bulk cancel (``db/control.py`` ``selection_sql``). SQLite refuses a statement with more
    than SQLITE_MAX_VARIABLE_NUMBER parameters: 32,766 by default since 3.32 (Debian's build
    raises it to 250,000; this test sets the stock limit on its connection). The cancel of
    a big batch (the docs' one job per row of an upload) fails with "too many SQL
    variables" and cancels nothing. (PostgreSQL and MariaDB pass: psycopg and mysqlclient
    bind parameters client-side.)"""
    import sqlite3

    if connection.vendor != "sqlite":
        pytest.skip("client-side parameter binding: no limit on the parameters")
    size = 33_000
    batch = stalwart.batch(on_failure=tasks.noop)
    batch.enqueue_many(tasks.noop, [Call() for _ in range(size)])
    connection.ensure_connection()
    connection.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 32_766)

    counts = batch.cancel()

    assert counts.cancelled == size
    assert batch.closed


def test_a_rolled_back_enqueue_in_an_application_transaction_leaves_the_count_alone():
    """Holds: ``enqueue_many`` inside an application's ``transaction.atomic`` that rolls
    back leaves neither the jobs, nor their memberships, nor the batch's count; the batch
    then finishes with what it really has."""
    batch = stalwart.batch(on_success=tasks.batch_report, on_failure=tasks.batch_report)
    batch.enqueue(tasks.add, 1, 1)

    def roll_back() -> None:
        with transaction.atomic():
            batch.enqueue_many(tasks.add, [Call(n, n) for n in range(5)])
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        roll_back()
    assert BatchRow.objects.get(pk=batch.id).total == 1
    assert BatchJob.objects.filter(batch=batch.id).count() == 1
    batch.close()
    drain(threads=1)
    report = callbacks_of(batch)["on_success"].return_value
    assert (report["total"], report["succeeded"]) == (1, 1)
    assert batch.progress().deleted == 0


def test_dependants_of_a_bulk_cancel_beyond_a_few_looks_wait_for_the_sweep():
    """FAILS on a8cb2de: the dispatcher's look reads at most ``limit`` pending dependants
    of the jobs finished since its last look (``_RECENT_CHILDREN ... LIMIT``, the
    dispatcher's batch_size, 500 by default) and moves its ``since`` on regardless
    (jobs.py ``resolve_dependencies``: ``since, self._resolved_until = ...``). Only
    ``RECENT_MARGIN`` (5 s) of overlap lets a later look read the rest. Parents that no worker
    finishes (cancelled by hand, ``queue cancel --task ...``; failed by a death) with more
    dependants than about 6 looks x limit leave the others pending until the next sweep
    (SWEEP_INTERVAL, 60 s, then a page per look through every pending job). Here: limit 5,
    looks every second (the default polling_interval), 60 cancelled parents with a
    run-on-failure dependant each; after 10 s of looks, dependants are still pending."""
    from stalwart import After, enqueue_after
    from stalwart.ticks import database_now

    parents = [tasks.noop.enqueue() for _ in range(60)]
    children = [enqueue_after([After(parent, on_failure="run")], tasks.noop) for parent in parents]
    store = JobStore("default")
    # The first looks sweep every pending job (nothing to release yet); then the sweep
    # rests for SWEEP_INTERVAL.
    for _ in range(30):
        store.resolve_dependencies(limit=5)
        if store._sweep_after is None:
            break
    assert stalwart.cancel(*parents).cancelled == 60

    last = database_now("default")
    for _ in range(10):  # ten looks, one per polling_interval (1 s)
        store.resolve_dependencies(limit=5)
        previous = last
        last = wait_for(
            lambda previous=previous: (
                (now := database_now("default")) >= previous + timedelta(seconds=1) and now
            ),
            timeout=5,
            message="the next look's time",
        )

    still_pending = Job.objects.filter(pk__in=[c.id for c in children], status="pending")
    assert still_pending.count() == 0, (
        f"{still_pending.count()} of 60 dependants still pending 10 s after their parents "
        "were cancelled (left to the sweep, 60 s away)"
    )


def test_an_add_racing_the_finish_is_either_refused_or_counted():
    """Holds: a job added to a closed batch (its one member done) while two dispatchers
    finish it: either the add wins (the batch waits for it) or the finish does (the add
    raises ``InvalidBatch`` and stores nothing), never a member linked to a finished batch
    nor a callback enqueued twice. Twenty rounds, two dispatchers and one adder at once."""
    for _ in range(20):
        with stalwart.batch(on_finish=tasks.noop) as batch:
            first = batch.enqueue(tasks.noop)
        Job.objects.filter(pk=first.id).update(status="successful", finished_at=timezone.now())
        jobs_before = Job.objects.count()

        def race(n: int, batch_id: str = batch.id) -> tuple[str, object]:
            if n == 2:
                try:
                    return "add", stalwart.get_batch(batch_id).enqueue(tasks.noop).id
                except InvalidBatch:
                    return "add", "refused"
            return f"finish {n}", JobStore("default").finish_batches()

        outcomes = dict(at_once(3, race))
        row = BatchRow.objects.get(pk=batch.id)
        members = BatchJob.objects.filter(batch=batch.id, role="member").count()
        callbacks = BatchJob.objects.filter(batch=batch.id).exclude(role="member").count()
        if outcomes["add"] == "refused":
            assert row.finished_at is not None
            assert (row.total, members, callbacks) == (1, 1, 1)
            assert Job.objects.count() == jobs_before + 1  # the callback alone
        else:
            assert row.finished_at is None, f"a member was added to a finished batch: {outcomes}"
            assert (row.total, members, callbacks) == (2, 2, 0)
            assert outcomes["finish 0"] == outcomes["finish 1"] == 0
            Job.objects.filter(pk=outcomes["add"]).update(
                status="successful", finished_at=timezone.now()
            )
            assert JobStore("default").finish_batches() == 1
