"""Who pays when an attempt ends without an outcome: every re-run charged, or counted.

An attempt the queue or its environment interrupted (a stop, a lost claim answer, a lost
connection, a crash it was not alone in) is free, but recorded, up to the job's
``max_interruptions``; past those it is charged. So a job is never claimed more than
``max_attempts + max_interruptions`` times, whatever keeps interrupting it.
"""

import pytest

from stalwart.db import Death, Interruption
from stalwart.jobs import JobStore
from stalwart.models import Job
from stalwart.queues import QueueSelector
from tests.helpers import register_processes
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

EVERYTHING = QueueSelector.parse("*")
OWNER = 61


@pytest.fixture
def store():
    register_processes(OWNER)
    return JobStore("default")


def claim(store, limit: int = 10) -> list:
    return store.claim(owner=OWNER, worker_name="w61", selector=EVERYTHING, limit=limit)


def test_a_job_given_back_at_a_stop_is_not_charged_but_the_interruption_is_recorded(store):
    result = tasks.add.enqueue(1, 2)
    (job,) = claim(store)
    assert store.release(
        owner=OWNER, jobs=[(job.id, job.attempt)], cause="its worker stopped", process="w61"
    ) == [job.id]
    row = Job.objects.get(pk=result.id)
    assert (row.status, row.errors, row.owner) == ("ready", [], None)
    (entry,) = row.interruptions
    assert (entry["attempt"], entry["cause"], entry["process"]) == (1, "its worker stopped", "w61")
    assert entry["at"]


def test_past_its_free_interruptions_an_interruption_is_charged_and_the_claims_are_bounded(store):
    result = tasks.add.enqueue(1, 2)
    Job.objects.filter(pk=result.id).update(max_attempts=2, max_interruptions=3)
    claims = 0
    while Job.objects.get(pk=result.id).status == "ready":
        (job,) = claim(store)
        claims += 1
        assert claims <= 5, "claimed more than max_attempts + max_interruptions times"
        store.release(owner=OWNER, jobs=[(job.id, job.attempt)], cause="deploy")
    row = Job.objects.get(pk=result.id)
    assert (row.status, claims, row.attempt) == ("failed", 5, 5)
    assert len(row.interruptions) == 3
    assert [error["exception_class_path"] for error in row.errors] == [
        "stalwart.exceptions.JobInterrupted"
    ] * 2
    assert [error["attempt"] for error in row.errors] == [4, 5]
    assert row.finished_at is not None


def test_an_interruption_charged_past_the_budget_carries_the_jobs_own_error(store):
    result = tasks.add.enqueue(1, 2)
    Job.objects.filter(pk=result.id).update(max_interruptions=0)
    (job,) = claim(store)
    store.release(
        owner=OWNER,
        jobs=[
            Interruption(
                job.id,
                job.attempt,
                cause="its database connection was lost",
                error_class="django.db.utils.OperationalError",
                error_text="Traceback ...\nOperationalError: terminating connection",
            )
        ],
    )
    row = Job.objects.get(pk=result.id)
    assert (row.status, row.interruptions) == ("ready", [])
    (error,) = row.errors
    assert error["exception_class_path"] == "django.db.utils.OperationalError"
    assert error["traceback"].endswith("terminating connection")


def test_a_crash_past_the_budget_charges_each_job_that_ran_together(store):
    first, second = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
    Job.objects.filter(pk__in=[first.id, second.id]).update(max_interruptions=1)
    for _ in range(2):
        claim(store)
        store.release_owner(owner=OWNER, error_class="x.Died", error_text="SIGKILL")
        Job.objects.update(isolated=False)  # as if they kept being claimed together
    rows = Job.objects.order_by("id")
    # The first crash was free for both (isolated, interrupted); the second, past their
    # budget, is charged to each.
    assert [(len(row.interruptions), len(row.errors)) for row in rows] == [(1, 1), (1, 1)]


def test_an_interrupted_death_records_its_cause_on_every_job(store):
    first, second = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
    claim(store)
    store.release_owner(
        owner=OWNER,
        error_class="stalwart.exceptions.ProcessDied",
        error_text="its heartbeats failed for 9.1 s",
        death=Death.INTERRUPTED,
        process="worker-x",
    )
    for row in Job.objects.filter(pk__in=[first.id, second.id]):
        assert (row.status, row.isolated, row.errors) == ("ready", False, [])
        assert [entry["cause"] for entry in row.interruptions] == [
            "its heartbeats failed for 9.1 s"
        ]


def test_a_release_that_matches_no_attempt_of_ours_records_nothing(store):
    result = tasks.add.enqueue(1, 2)
    (job,) = claim(store)
    assert store.release(owner=OWNER, jobs=[(job.id, job.attempt + 1)], cause="stale") == []
    row = Job.objects.get(pk=result.id)
    assert (row.status, row.interruptions) == ("running", [])
