"""Fencing: a claim records owner and attempt; only the current holder's writes land."""

from dataclasses import replace

import pytest
from django.tasks import TaskResultStatus

from stalwart.db import Outcome
from stalwart.jobs import JobStore
from stalwart.models import Job, Process
from stalwart.queues import QueueSelector
from tests.helpers import make_worker, register_processes, wait_for, worker_thread
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

EVERYTHING = QueueSelector.parse("*")


@pytest.fixture(autouse=True)
def processes():
    register_processes(1, 2, 7, 101, 202)


def claim_one(store, owner):
    claimed = store.claim(
        owner=owner, worker_name=f"w{owner}", selector=EVERYTHING, limit=1, isolated_first=True
    )
    assert len(claimed) == 1
    return claimed[0]


def test_after_release_and_reclaim_the_first_owners_finish_changes_nothing():
    store = JobStore("default")
    result = tasks.add.enqueue(1, 2)
    first = claim_one(store, owner=101)
    # The first owner is declared dead: its jobs are taken back...
    released = store.release_owner(owner=101, error_class="x.Died", error_text="pruned")
    assert [job.status for job in released] == ["ready"]
    # ...and another process claims the job again.
    second = claim_one(store, owner=202)
    assert (first.id, first.attempt, second.attempt) == (second.id, 1, 2)

    late = store.finish(
        owner=101, outcomes=[Outcome(id=first.id, attempt=first.attempt, status="successful")]
    )
    assert late == {}
    row = Job.objects.get(pk=first.id)
    assert (row.status, row.owner, row.attempt) == ("running", 202, 2)

    current = store.finish(
        owner=202,
        outcomes=[Outcome(id=second.id, attempt=2, status="successful", return_value="3")],
    )
    assert set(current) == {second.id}
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert result.worker_ids == ["w101", "w202"]
    assert [error.exception_class_path for error in result.errors] == ["x.Died"]


def test_the_same_owner_with_a_stale_attempt_cannot_finish_either():
    store = JobStore("default")
    tasks.add.enqueue(1, 2)
    first = claim_one(store, owner=7)
    store.release(owner=7, jobs=[(first.id, first.attempt)])
    second = claim_one(store, owner=7)
    assert second.attempt == 2
    stale = store.finish(owner=7, outcomes=[Outcome(id=first.id, attempt=1, status="failed")])
    assert stale == {}
    assert Job.objects.get(pk=first.id).status == "running"


def test_release_only_touches_jobs_the_caller_holds():
    store = JobStore("default")
    tasks.add.enqueue(1, 2)
    job = claim_one(store, owner=1)
    assert store.release(owner=2, jobs=[(job.id, job.attempt)]) == []
    assert Job.objects.get(pk=job.id).owner == 1
    assert store.release(owner=1, jobs=[(job.id, job.attempt)]) == [job.id]
    assert Job.objects.get(pk=job.id).status == "ready"


def test_a_worker_whose_job_was_taken_discards_its_late_result(backend, recorded_events):
    result = tasks.record.enqueue(label="slow", sleep=0.5)
    # Heartbeats too rare to notice the prune before the job ends: its write does.
    patient = replace(backend.config, heartbeat_interval=30, process_alive_threshold=120)
    worker = make_worker(threads=1, config=patient)
    with worker_thread(worker):
        wait_for(lambda: Job.objects.filter(status="running").exists(), message="the claim")
        # A prune takes the job over while it runs: the row goes, the job with it...
        Process.objects.filter(pk=worker.registration.id).delete()
        JobStore("default").release_owner(
            owner=worker.registration.id, error_class="x.Died", error_text="taken over"
        )
        # ...and another process claims it.
        Job.objects.filter(pk=result.id).update(status="running", owner=999, attempt=2)
        wait_for(
            lambda: any(action == "job_result_discarded" for action, _ in recorded_events),
            message="the late result to be discarded",
        )
    row = Job.objects.get(pk=result.id)
    assert (row.status, row.owner, row.attempt) == ("running", 999, 2)
    discarded = [fields for action, fields in recorded_events if action == "job_result_discarded"]
    assert discarded[0]["job"] == row.id


def test_a_process_whose_row_is_gone_claims_nothing():
    store = JobStore("default")
    result = tasks.add.enqueue(1, 2)
    Process.objects.filter(pk=7).delete()  # pruned as dead
    assert store.claim(owner=7, worker_name="w7", selector=EVERYTHING, limit=5) == []
    job = Job.objects.get(pk=result.id)
    assert (job.status, job.owner, job.attempt) == ("ready", None, 0)


def test_a_stale_outcome_written_with_a_claim_changes_nothing_but_the_claim_goes_on(vendor):
    if vendor != "postgresql":
        pytest.skip("only PostgreSQL writes outcomes and claims in one statement")
    store = JobStore("default")
    tasks.add.enqueue(1, 2)
    first = claim_one(store, owner=7)
    store.release_owner(owner=7, error_class="x.Died", error_text="pruned")
    claim_one(store, owner=202)  # the job now belongs to 202, attempt 2
    fresh = tasks.add.enqueue(3, 4)
    written, claimed = store.finish_and_claim(
        owner=7,
        outcomes=[Outcome(id=first.id, attempt=1, status="successful", return_value="3")],
        worker_name="w7",
        selector=EVERYTHING,
        limit=5,
    )
    assert written == {}
    assert [str(job.id) for job in claimed] == [fresh.id]
    row = Job.objects.get(pk=first.id)
    assert (row.status, row.owner, row.attempt) == ("running", 202, 2)
