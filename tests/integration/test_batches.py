"""Batches (issue 20): members enqueued together, callbacks enqueued once when all are done.

Workers are real threads with connections of their own on the database under test; the
dispatcher's look is ``JobStore.promote_due`` (which a draining worker runs), or
``finish_batches`` called from several threads at once.
"""

import json
import uuid

import pytest
from django.db import transaction

import stalwart
from stalwart import Call
from stalwart.exceptions import InvalidBatch
from stalwart.jobs import JobStore
from stalwart.models import Batch as BatchRow
from stalwart.models import BatchJob, Job
from tests.helpers import at_once, drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def callbacks_of(batch) -> dict[str, Job]:
    links = BatchJob.objects.filter(batch=batch.id).exclude(role="member")
    return {link.role: Job.objects.get(pk=link.job) for link in links}


def test_a_batch_that_succeeds_enqueues_on_success_and_on_finish_once():
    with stalwart.batch(
        on_success=(tasks.batch_report, Call(note="all good")),
        on_failure=tasks.batch_report,
        on_finish=(tasks.batch_report, Call(note="done")),
        label="sums",
    ) as batch:
        batch.enqueue_many(tasks.add, [Call(n, 1) for n in range(5)])
        batch.enqueue(tasks.add, 10, 10)
    assert batch.closed
    assert not batch.finished
    assert batch.progress() == stalwart.BatchProgress(
        total=6, waiting=6, running=0, succeeded=0, failed=0, cancelled=0, deleted=0
    )
    drain(threads=3)
    assert batch.finished
    callbacks = callbacks_of(batch)
    assert set(callbacks) == {"on_success", "on_finish"}
    report = callbacks["on_success"].return_value
    assert report["note"] == "all good"
    assert report["batch"] == batch.id
    assert (report["total"], report["succeeded"], report["failed"]) == (6, 6, 0)
    assert report["results"] == [1, 2, 3, 4, 5, 20]
    assert callbacks["on_finish"].return_value["note"] == "done"
    assert JobStore("default").finish_batches() == 0  # never twice


def test_a_member_failing_for_good_enqueues_on_failure_not_on_success():
    with stalwart.batch(on_success=tasks.batch_report, on_failure=tasks.batch_report) as batch:
        batch.enqueue(tasks.add, 1, 1)
        failing = batch.enqueue(tasks.fail, "no")
    Job.objects.filter(pk=failing.id).update(max_attempts=1)
    drain(threads=2)
    callbacks = callbacks_of(batch)
    assert set(callbacks) == {"on_failure"}
    report = callbacks["on_failure"].return_value
    assert (report["total"], report["succeeded"], report["failed"]) == (2, 1, 1)


def test_callbacks_wait_for_the_close_and_a_member_can_grow_its_own_batch():
    batch = stalwart.batch(on_finish=tasks.batch_report)
    batch.enqueue(tasks.add_then_grow, 1, 2, more=3)
    drain(threads=2)
    assert batch.progress().succeeded == 4
    assert not batch.finished  # still open: nothing fires
    assert callbacks_of(batch) == {}
    batch.close()
    drain(threads=1)
    report = callbacks_of(batch)["on_finish"].return_value
    assert report["total"] == 4
    assert report["results"] == [3, 100, 101, 102]


def test_an_empty_closed_batch_finishes_at_once():
    with stalwart.batch(on_success=tasks.batch_report) as batch:
        pass
    assert JobStore("default").finish_batches() == 1
    assert set(callbacks_of(batch)) == {"on_success"}


def test_dispatchers_finishing_at_once_enqueue_each_callback_once():
    batches = []
    for _ in range(8):
        with stalwart.batch(on_finish=tasks.noop) as batch:
            batch.enqueue_many(tasks.noop, [Call() for _ in range(3)])
        batches.append(batch)
    Job.objects.filter(task_path="tests.testapp.tasks.noop").update(status="successful")
    finished = at_once(4, lambda _: JobStore("default").finish_batches())
    assert sum(finished) == 8
    for batch in batches:
        assert len(callbacks_of(batch)) == 1
    assert BatchJob.objects.exclude(role="member").count() == 8


def test_a_member_added_while_a_dispatcher_looks_keeps_the_batch_open():
    with stalwart.batch(on_finish=tasks.noop) as batch:
        first = batch.enqueue(tasks.noop)
    Job.objects.filter(pk=first.id).update(status="successful")
    # A member (running) adds one more before the dispatcher's lock: the batch waits for it.
    late = stalwart.get_batch(batch.id).enqueue(tasks.noop)
    assert JobStore("default").finish_batches() == 0
    Job.objects.filter(pk=late.id).update(status="successful")
    assert JobStore("default").finish_batches() == 1
    with pytest.raises(InvalidBatch, match="has finished"):
        batch.enqueue(tasks.noop)
    assert Job.objects.count() == 3  # two members, one callback: the refused one not stored


def test_bad_batches_are_refused_and_nothing_is_stored():
    before = (BatchRow.objects.count(), Job.objects.count())
    with pytest.raises(InvalidBatch, match="is not a task"):
        stalwart.batch(on_success=(print, Call()))
    with pytest.raises(InvalidBatch, match="a callback is a task"):
        stalwart.batch(on_failure="tests.testapp.tasks.noop")
    with pytest.raises(InvalidBatch, match="uses backend 'limited'"):
        stalwart.batch(on_finish=tasks.noop.using(backend="limited"))
    with pytest.raises(TypeError):
        stalwart.batch(on_finish=(tasks.add, Call(1)))  # add takes two arguments
    assert (BatchRow.objects.count(), Job.objects.count()) == before
    with pytest.raises(InvalidBatch, match="is not a batch id"):
        stalwart.get_batch("nope")
    with pytest.raises(InvalidBatch, match="No batch has the id"):
        stalwart.get_batch(uuid.UUID(int=5))
    batch = stalwart.batch()
    batch.close()
    with pytest.raises(InvalidBatch, match="closed already"):
        batch.close()
    with pytest.raises(InvalidBatch, match="uses backend 'limited'"):
        batch.enqueue(tasks.noop.using(backend="limited"))


def test_a_batch_block_that_raises_leaves_the_batch_open_and_a_rolled_back_one_is_gone():
    def fail_inside() -> None:
        with stalwart.batch(on_finish=tasks.noop) as batch:
            batch.enqueue(tasks.noop)
            raise RuntimeError("half-built")

    with pytest.raises(RuntimeError):
        fail_inside()
    row = BatchRow.objects.get()
    assert row.closed_at is None
    assert row.total == 1

    def roll_back() -> None:
        with transaction.atomic(), stalwart.batch(on_finish=tasks.noop) as batch:
            batch.enqueue(tasks.noop)
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        roll_back()
    assert BatchRow.objects.count() == 1
    assert Job.objects.count() == 1


def test_queue_batches_lists_each_batch_with_its_members_by_state():
    from io import StringIO

    from django.core.management import call_command

    def queue(*args: str) -> str:
        out = StringIO()
        call_command("queue", *args, stdout=out)
        return out.getvalue()

    assert queue("batches") == "No batches.\n"
    with stalwart.batch(on_finish=tasks.noop, label="done") as done:
        done.enqueue(tasks.add, 1, 1)
    drain(threads=1)
    still_open = stalwart.batch(label="open")
    still_open.enqueue(tasks.noop)
    listed = json.loads(queue("batches", "--json"))["batches"]
    assert [(b["id"], b["state"], b["total"]) for b in listed] == [
        (still_open.id, "open", 1),
        (done.id, "finished", 1),
    ]
    assert listed[1]["succeeded"] == 1
    assert listed[1]["callbacks"] == ["on_finish"]
    assert listed[0]["waiting"] == 1
    unfinished = json.loads(queue("batches", "--unfinished", "--json"))["batches"]
    assert [b["id"] for b in unfinished] == [still_open.id]
    table = queue("batches")
    assert "LABEL" in table
    assert "finished" in table


def test_cancelling_a_batch_cancels_its_waiting_members_and_ends_it_as_failed():
    batch = stalwart.batch(on_success=tasks.batch_report, on_failure=tasks.batch_report)
    done = batch.enqueue(tasks.add, 2, 2)
    drain(threads=1)
    waiting = batch.enqueue_many(tasks.noop, [Call() for _ in range(3)])
    counts = batch.cancel()
    assert (counts.cancelled, counts.requested) == (3, 0)
    assert batch.closed
    assert {job(result).status for result in waiting} == {"cancelled"}
    assert job(done).status == "successful"
    assert JobStore("default").finish_batches() == 1
    assert set(callbacks_of(batch)) == {"on_failure"}
    with pytest.raises(InvalidBatch, match="has finished"):
        batch.enqueue(tasks.noop)


def job(result) -> Job:
    return Job.objects.get(pk=result.id)
