"""A crash is charged to the job that crashed: jobs that ran beside it run alone next time."""

import pytest

from stalwart import Call, enqueue_many
from stalwart.db import Death, Outcome
from stalwart.jobs import JobStore
from stalwart.models import Job
from stalwart.queues import QueueSelector
from tests.helpers import register_processes
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

EVERYTHING = QueueSelector.parse("*")


@pytest.fixture
def store():
    register_processes(51, 52)
    return JobStore("default")


def claim(store, owner: int, limit: int = 10, *, alone: bool = True) -> list:
    return store.claim(
        owner=owner, worker_name=f"w{owner}", selector=EVERYTHING, limit=limit, alone=alone
    )


def errors(job_id) -> int:
    return len(Job.objects.get(pk=job_id).errors)


def test_a_death_beside_other_jobs_charges_none_and_isolates_each(store):
    enqueue_many(tasks.add, [Call(n, n) for n in range(3)])
    held = claim(store, 51)
    released = store.release_owner(owner=51, error_class="x.Died", error_text="SIGKILL")
    assert sorted(job.status for job in released) == ["ready"] * 3
    for job in held:
        row = Job.objects.get(pk=job.id)
        assert (row.status, row.isolated, row.errors) == ("ready", True, [])


def test_a_death_alone_is_charged_to_that_job(store):
    result = tasks.add.enqueue(1, 1)
    claim(store, 51)
    store.release_owner(owner=51, error_class="x.Died", error_text="SIGKILL")
    row = Job.objects.get(pk=result.id)
    assert (row.status, row.isolated) == ("ready", True)
    assert [error["exception_class_path"] for error in row.errors] == ["x.Died"]


def test_a_process_that_ended_on_its_own_gives_its_jobs_back_uncharged(store):
    enqueue_many(tasks.add, [Call(n, n) for n in range(2)])
    claim(store, 51)
    store.release_owner(owner=51, error_class="x.Died", error_text="gone", death=Death.NONE)
    rows = Job.objects.all()
    assert {(row.status, row.isolated, len(row.errors)) for row in rows} == {("ready", False, 0)}


def test_an_isolated_job_is_claimed_only_alone_and_nothing_beside_it(store):
    first, suspect, last = (tasks.add.using(priority=p).enqueue(p, p) for p in (3, 2, 1))
    Job.objects.filter(pk=suspect.id).update(isolated=True)
    # A claim stops before the isolated job...
    assert [str(job.id) for job in claim(store, 51)] == [first.id]
    # ...a worker with something running takes nothing (the isolated job comes first)...
    assert claim(store, 52, alone=False) == []
    # ...an idle one takes the isolated job, and only it...
    (alone,) = claim(store, 52)
    assert (str(alone.id), alone.isolated) == (suspect.id, True)
    # ...and the rest goes on once it is out of the way.
    assert [str(job.id) for job in claim(store, 51)] == [last.id]


def test_an_isolated_job_that_finishes_is_no_longer_isolated(store):
    result = tasks.add.enqueue(2, 3)
    Job.objects.filter(pk=result.id).update(isolated=True)
    (job,) = claim(store, 51)
    store.finish(owner=51, outcomes=[Outcome(id=job.id, attempt=1, status="successful")])
    assert Job.objects.get(pk=result.id).isolated is False


def test_a_process_that_went_silent_has_each_of_its_jobs_charged(store):
    enqueue_many(tasks.add, [Call(n, n) for n in range(2)])
    claim(store, 51)
    store.release_owner(owner=51, error_class="x.Silent", error_text="pruned", death=Death.SILENCE)
    rows = Job.objects.all()
    assert {(row.status, row.isolated, len(row.errors)) for row in rows} == {("ready", False, 1)}


def test_a_job_charged_for_a_death_goes_behind_the_jobs_that_ran_beside_it(store):
    poison, innocent = (tasks.add.enqueue(n, n) for n in (1, 2))
    claim(store, 51)
    store.release_owner(owner=51, error_class="x.Died", error_text="SIGKILL")
    # Both isolated: the first in line runs alone, and kills its worker again.
    (first,) = claim(store, 52)
    assert str(first.id) == poison.id
    store.release_owner(owner=52, error_class="x.Died", error_text="SIGKILL")
    # Charged, it goes to the back: its batch-mate runs next.
    (second,) = claim(store, 51)
    assert str(second.id) == innocent.id


def test_a_job_that_keeps_killing_its_process_alone_is_failed_at_its_cap(store):
    result = tasks.add.enqueue(4, 4)
    Job.objects.filter(pk=result.id).update(max_attempts=2)
    for _ in range(2):
        claim(store, 51)
        store.release_owner(owner=51, error_class="x.Died", error_text="SIGKILL")
    row = Job.objects.get(pk=result.id)
    assert (row.status, len(row.errors)) == ("failed", 2)
