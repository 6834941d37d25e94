"""Cancelling jobs: waiting ones at once, running ones on request, in bounded batches."""

import uuid
from datetime import timedelta

import pytest
from django.tasks import TaskResultStatus, default_task_backend
from django.utils import timezone

import stalwart
from stalwart import control
from stalwart.control import Cancelled
from stalwart.exceptions import JobCancelled
from stalwart.models import Job, JobStatus
from tests.helpers import drain, wait_for, worker_thread
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def status(result) -> str:
    return Job.objects.get(pk=result.id).status


def test_ready_scheduled_and_blocked_jobs_are_cancelled_and_never_run():
    ready = tasks.record.enqueue("ready")
    later = tasks.record.using(run_after=timezone.now() + timedelta(hours=1)).enqueue("later")
    holder = tasks.one_at_a_time.enqueue("k")
    blocked = tasks.one_at_a_time.enqueue("k")
    default_task_backend.store.unblock(["k"])
    assert [status(job) for job in (ready, later, holder, blocked)] == [
        "ready",
        "scheduled",
        "ready",
        "blocked",
    ]
    done = stalwart.cancel(ready, later.id, holder, blocked)
    assert done == Cancelled(cancelled=4, requested=0)
    for job in (ready, later, holder, blocked):
        row = Job.objects.get(pk=job.id)
        assert row.status == JobStatus.CANCELLED
        assert row.finished_at is not None
        assert row.owner is None
    drain()
    assert not Execution.objects.exists()


def test_a_cancelled_job_reads_as_a_finished_failure():
    result = tasks.add.enqueue(1, 2)
    stalwart.cancel(result)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.is_finished
    assert result.finished_at is not None
    assert result.errors == []  # it never ran: no attempt, no error
    with pytest.raises(ValueError, match="Task failed"):
        _ = result.return_value


def test_finished_jobs_are_left_alone_and_a_second_cancel_does_nothing():
    done = tasks.add.enqueue(1, 1)
    drain()
    waiting = tasks.add.enqueue(2, 2)
    assert stalwart.cancel(done, waiting) == Cancelled(cancelled=1)
    assert status(done) == "successful"
    assert not stalwart.cancel(done, waiting)


def test_cancel_by_task_or_queue_works_in_batches_and_dry_runs_change_nothing():
    for number in range(5):
        tasks.add.enqueue(number, number)
    for number in range(3):
        tasks.add.using(queue_name="other").enqueue(number, 0)
    tasks.noop.enqueue()
    assert stalwart.cancel(task=tasks.add, dry_run=True) == Cancelled(cancelled=8)
    assert Job.objects.filter(status="cancelled").count() == 0
    assert stalwart.cancel(queue="other", batch_size=2) == Cancelled(cancelled=3)
    assert stalwart.cancel(task="tests.testapp.tasks.add", batch_size=2).cancelled == 5
    assert Job.objects.filter(status="ready").count() == 1  # the noop


def test_cancel_refuses_what_selects_nothing_or_is_not_an_id():
    with pytest.raises(ValueError, match="Say which jobs"):
        stalwart.cancel()
    with pytest.raises(ValueError, match="is not a job id"):
        stalwart.cancel("not-an-id")
    assert not stalwart.cancel(str(uuid.uuid4()))


def test_cancelling_frees_the_unique_key():
    first = tasks.unique_report.enqueue("2026-12-01")
    assert tasks.unique_report.enqueue("2026-12-01").id == first.id
    stalwart.cancel(first)
    again = tasks.unique_report.enqueue("2026-12-01")
    assert again.id != first.id
    assert status(again) == "ready"


def test_cancelling_a_slot_holder_hands_its_slot_on():
    holder = tasks.one_at_a_time.enqueue("key")
    waiting = tasks.one_at_a_time.enqueue("key")
    default_task_backend.store.unblock(["key"])
    assert (status(holder), status(waiting)) == ("ready", "blocked")
    stalwart.cancel(holder)
    assert status(waiting) == "ready"


def test_a_running_job_is_asked_to_stop_and_stops_when_its_task_checks():
    with worker_thread() as worker:
        result = tasks.until_cancelled.enqueue(seconds=20)
        wait_for(lambda: Execution.objects.filter(job_id=result.id).exists(), message="start")
        assert stalwart.cancel(result) == Cancelled(requested=1)
        assert stalwart.cancel(result) == Cancelled()  # asked once is enough
        # The worker learns of the request within a heartbeat interval (0.5 s here).
        wait_for(lambda: status(result) == "cancelled", timeout=10, message="the job to stop")
        # The worker writes the outcome, then lets the job go: the test may look in between.
        wait_for(lambda: worker.held == {}, message="the worker to let the job go")
    row = Job.objects.get(pk=result.id)
    assert row.cancel_requested_at is not None
    assert row.errors[-1]["exception_class_path"] == "stalwart.exceptions.JobCancelled"
    assert "raise_if_cancelled" in row.errors[-1]["traceback"]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED


def test_a_task_without_context_asked_to_stop_is_cancelled_when_it_fails_not_retried():
    # Its worker makes the stop flag only when asked (the task reads no context): the
    # failure must still find it, and cancel the job rather than retry it.
    tasks.GATE.clear()
    try:
        with worker_thread() as worker:
            result = tasks.fails_at_gate.enqueue()
            job_id = uuid.UUID(result.id)
            wait_for(lambda: status(result) == "running", message="the job to start")
            assert job_id not in worker.cancellations  # nobody asked: no flag made
            assert stalwart.cancel(result) == Cancelled(requested=1)
            wait_for(
                lambda: job_id in worker.cancellations and worker.cancellations[job_id].is_set(),
                timeout=10,
                message="the worker to learn of the request",
            )
            tasks.GATE.set()  # now it fails
            wait_for(lambda: status(result) == "cancelled", timeout=10, message="the outcome")
        row = Job.objects.get(pk=result.id)
        assert row.errors[-1]["exception_class_path"] == "builtins.ConnectionError"
        assert row.attempt == 1
    finally:
        tasks.GATE.clear()


def test_a_job_asked_to_stop_that_goes_back_to_waiting_is_not_run_again():
    result = tasks.record.enqueue("released")
    # As if its attempt was running when the cancel came, and was then given back.
    Job.objects.filter(pk=result.id).update(cancel_requested_at=timezone.now())
    drain()
    assert status(result) == "cancelled"
    assert not Execution.objects.filter(job_id=result.id).exists()


def test_a_task_may_cancel_itself():
    result = tasks.cancels_itself.enqueue()
    drain()
    row = Job.objects.get(pk=result.id)
    assert row.status == "cancelled"
    assert row.errors[-1]["exception_class_path"] == "stalwart.exceptions.JobCancelled"


def test_retention_deletes_cancelled_jobs_like_finished_ones():
    old = tasks.add.enqueue(1, 1)
    new = tasks.add.enqueue(2, 2)
    stalwart.cancel(old, new)
    Job.objects.filter(pk=old.id).update(finished_at=timezone.now() - timedelta(days=8))
    assert control.prune_finished(older_than=timedelta(days=7), dry_run=True) == 1
    deleted = control.delete_expired_jobs(default_task_backend.config)
    assert deleted == 1
    assert list(Job.objects.values_list("id", flat=True)) == [uuid.UUID(new.id)]


def test_job_cancelled_raised_by_a_task_ends_its_job_at_once_whatever_attempts_are_left():
    assert default_task_backend.config.max_attempts > 1  # a failure would be retried
    result = tasks.cancels_itself.enqueue()
    drain()
    row = Job.objects.get(pk=result.id)
    assert (row.status, row.attempt) == ("cancelled", 1)
    assert [error["exception_class_path"] for error in row.errors] == [
        "stalwart.exceptions.JobCancelled"
    ]
    assert "JobCancelled: nothing left to do" in row.errors[0]["traceback"]
    # A task's own `except Exception` around its steps sees it too (to clean up).
    assert isinstance(JobCancelled(), Exception)
    assert str(JobCancelled()) == "The job was cancelled while it ran."
