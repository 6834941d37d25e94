"""What a reviewer broke: twins leaving together, orphans, unstorable errors, lost claims."""

import logging

import pytest
from django.tasks import TaskResultStatus

from stalwart import Call, control, enqueue_many
from stalwart.control import Selection
from stalwart.db import Outcome
from stalwart.jobs import JobStore
from stalwart.models import Job, Process
from stalwart.processes.registry import release_orphans
from stalwart.queues import QueueSelector
from tests.helpers import drain, make_worker, register_processes, wait_for, worker_thread
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

EVERYTHING = QueueSelector.parse("*")


def two_running_twins():
    """Two jobs of one unique task with one key, both running (each enqueued while the
    other ran, as plain unique=True allows)."""
    register_processes(21)
    store = JobStore("default")
    first = tasks.unique_report.enqueue("same")
    store.claim(owner=21, worker_name="w", selector=EVERYTHING, limit=1)
    second = tasks.unique_report.enqueue("same")
    store.claim(owner=21, worker_name="w", selector=EVERYTHING, limit=1)
    assert Job.objects.filter(status="running").count() == 2
    return store, first, second


def keys() -> dict:
    return {str(pk): key for pk, key in Job.objects.values_list("id", "unique_key")}


def test_twins_retried_in_one_batch_do_not_collide():
    store, first, second = two_running_twins()
    written = store.finish(
        owner=21,
        outcomes=[
            Outcome(id=job.id, attempt=1, status="scheduled", retry_in=0)
            for job in Job.objects.all()
        ],
    )
    assert len(written) == 2
    assert sorted(key is None for key in keys().values()) == [False, True]
    assert keys()[min(first.id, second.id)] is not None  # the first keeps the key


def test_twins_released_together_do_not_collide():
    store, _, _ = two_running_twins()
    held = list(Job.objects.values_list("id", "attempt"))
    assert len(store.release(owner=21, jobs=held)) == 2
    assert sorted(key is None for key in keys().values()) == [False, True]


def test_twins_of_a_dead_process_do_not_collide():
    store, _, _ = two_running_twins()
    released = store.release_owner(owner=21, error_class="x.Died", error_text="gone")
    assert [job.status for job in released] == ["ready", "ready"]
    assert sorted(key is None for key in keys().values()) == [False, True]


def test_failed_twins_retried_together_move_one_at_a_time():
    enqueue_many(tasks.unique_report, [Call("a")])
    Job.objects.update(status="failed")
    enqueue_many(tasks.unique_report, [Call("a")])
    Job.objects.update(status="failed")
    assert Job.objects.filter(status="failed").count() == 2
    assert control.retry_failed(Selection(everything=True), dry_run=True) == 1
    assert control.retry_failed(Selection(everything=True)) == 1
    assert control.retry_failed(Selection(everything=True)) == 0  # its twin now waits
    assert Job.objects.filter(status="ready").count() == 1


def test_running_jobs_whose_owner_row_is_gone_are_released():
    register_processes(31)
    result = tasks.add.enqueue(1, 2)
    JobStore("default").claim(owner=31, worker_name="w", selector=EVERYTHING, limit=1)
    Process.objects.filter(pk=31).delete()  # gone without giving its job back
    released = release_orphans("default")
    assert [str(job.id) for job in released] == [result.id]
    job = Job.objects.get(pk=result.id)
    assert (job.status, job.owner) == ("ready", None)
    assert "that held this job is gone" in job.errors[-1]["traceback"]
    assert release_orphans("default") == []


def test_a_claim_the_worker_lost_track_of_is_given_back_and_run():
    worker = make_worker(threads=1)
    with worker_thread(worker):
        control.pause("lost")  # so the worker cannot claim it the ordinary way first
        wait_for(lambda: "lost" in worker._paused, message="the worker to honour the pause")
        result = tasks.add.using(queue_name="lost").enqueue(20, 22)
        # As if a claim had committed but its answer never reached the worker.
        Job.objects.filter(pk=result.id).update(
            status="running", owner=worker.registration.id, attempt=1
        )
        control.resume("lost")
        wait_for(
            lambda: Job.objects.get(pk=result.id).status == "successful",
            timeout=15,
            message="the lost claim to be reconciled and run",
        )
    job = Job.objects.get(pk=result.id)
    assert job.return_value == 42
    assert job.attempt == 2


def test_an_error_text_the_database_refuses_is_stored_escaped():
    bad = tasks.raises_unstorable.enqueue()
    good = tasks.add.enqueue(1, 1)
    # Django's own receiver logs the exception as it is, lone surrogate included, which
    # pytest-xdist cannot send between its processes: not that logger, here.
    django_tasks = logging.getLogger("django.tasks")
    django_tasks.disabled = True
    try:
        drain(threads=1)
    finally:
        django_tasks.disabled = False
    bad.refresh()
    good.refresh()
    assert bad.status == TaskResultStatus.FAILED
    assert "nul \\x00 and \\udcff" in bad.errors[0].traceback
    assert good.status == TaskResultStatus.SUCCESSFUL


def test_a_broken_backoff_ends_the_retries_instead_of_holding_the_job(recorded_events):
    result = tasks.broken_backoff.enqueue()
    drain(threads=1)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    assert any(action == "backoff_failed" for action, _ in recorded_events)


def test_equal_calls_get_equal_unique_keys():
    by_position = tasks.unique_report.unique_key_for(["d"], {})
    by_name = tasks.unique_report.unique_key_for([], {"day": "d"})
    assert by_position == by_name
    assert tasks.sync_account.unique_key_for([7], {}) == tasks.sync_account.unique_key_for(
        [], {"account": 7, "full": True}
    )  # its key is the account alone
