"""A crash is charged to the job that crashed: jobs that ran beside it run alone next time."""

import threading

import pytest
from django.db import connections

from stalwart import Call, enqueue_many
from stalwart.db import Death, Outcome
from stalwart.jobs import JobStore
from stalwart.models import Job
from stalwart.queues import QueueSelector
from tests.helpers import register_processes, wait_for, worker_thread
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

EVERYTHING = QueueSelector.parse("*")


@pytest.fixture
def store():
    register_processes(51, 52)
    return JobStore("default")


def claim(store, owner: int, limit: int = 10, *, isolated_first: bool = False) -> list:
    return store.claim(
        owner=owner,
        worker_name=f"w{owner}",
        selector=EVERYTHING,
        limit=limit,
        isolated_first=isolated_first,
    )


def errors(job_id) -> int:
    return len(Job.objects.get(pk=job_id).errors)


def test_a_death_beside_other_jobs_charges_none_and_isolates_each(store):
    enqueue_many(tasks.add, [Call(n, n) for n in range(3)])
    held = claim(store, 51)
    released = store.release_owner(
        owner=51, error_class="x.Died", error_text="SIGKILL", process="worker-a"
    )
    assert sorted(job.status for job in released) == ["ready"] * 3
    for job in held:
        row = Job.objects.get(pk=job.id)
        assert (row.status, row.isolated, row.errors) == ("ready", True, [])
        # Not charged, but recorded: which attempt ended, why, where.
        (entry,) = row.interruptions
        assert (entry["attempt"], entry["cause"], entry["process"]) == (1, "SIGKILL", "worker-a")


def test_a_death_alone_is_charged_to_that_job(store):
    result = tasks.add.enqueue(1, 1)
    claim(store, 51)
    store.release_owner(owner=51, error_class="x.Died", error_text="SIGKILL", process="worker-a")
    row = Job.objects.get(pk=result.id)
    assert (row.status, row.isolated, row.interruptions) == ("ready", True, [])
    (error,) = row.errors
    assert (error["exception_class_path"], error["traceback"], error["attempt"]) == (
        "x.Died",
        "SIGKILL",
        1,
    )
    assert error["process"] == "worker-a"


def test_a_process_that_ended_on_its_own_gives_its_jobs_back_uncharged(store):
    enqueue_many(tasks.add, [Call(n, n) for n in range(2)])
    claim(store, 51)
    store.release_owner(owner=51, error_class="x.Died", error_text="gone", death=Death.INTERRUPTED)
    rows = Job.objects.all()
    assert {(row.status, row.isolated, len(row.errors)) for row in rows} == {("ready", False, 0)}
    assert {len(row.interruptions) for row in rows} == {1}


def test_an_isolated_job_is_claimed_only_alone_and_never_blocks_the_others(store):
    first, suspect, last = (tasks.add.using(priority=p).enqueue(p, p) for p in (3, 2, 1))
    Job.objects.filter(pk=suspect.id).update(isolated=True)
    # An ordinary claim passes it over, and takes the others...
    assert [str(job.id) for job in claim(store, 51)] == [first.id, last.id]
    assert JobStore("default").isolated_waiting(selector=EVERYTHING)
    # ...and a worker that runs nothing takes it first, and it alone.
    (alone,) = claim(store, 52, isolated_first=True)
    assert (str(alone.id), alone.isolated) == (suspect.id, True)
    assert not JobStore("default").isolated_waiting(selector=EVERYTHING)


def test_an_isolated_job_that_finishes_is_no_longer_isolated(store):
    result = tasks.add.enqueue(2, 3)
    Job.objects.filter(pk=result.id).update(isolated=True)
    (job,) = claim(store, 51, isolated_first=True)
    store.finish(owner=51, outcomes=[Outcome(id=job.id, attempt=1, status="successful")])
    assert Job.objects.get(pk=result.id).isolated is False


def test_the_named_suspects_of_a_death_are_isolated_and_the_others_interrupted(store):
    a, b, c = (result.id for result in enqueue_many(tasks.add, [Call(n, n) for n in range(3)]))
    claim(store, 51)
    store.release_owner(
        owner=51, error_class="x.Died", error_text="memory", death=Death.CRASH, suspects=[a, b]
    )
    rows = {str(row.id): row for row in Job.objects.all()}
    assert [
        (rows[j].isolated, len(rows[j].errors), len(rows[j].interruptions)) for j in (a, b, c)
    ] == [
        (True, 0, 1),
        (True, 0, 1),
        (False, 0, 1),
    ]


def test_the_one_named_suspect_of_a_death_is_charged_beside_interrupted_neighbours(store):
    a, b = (result.id for result in enqueue_many(tasks.add, [Call(n, n) for n in range(2)]))
    claim(store, 51)
    store.release_owner(
        owner=51, error_class="x.Died", error_text="memory", death=Death.CRASH, suspects=[a]
    )
    rows = {str(row.id): row for row in Job.objects.all()}
    assert [
        (rows[j].isolated, len(rows[j].errors), len(rows[j].interruptions)) for j in (a, b)
    ] == [
        (True, 1, 0),
        (False, 0, 1),
    ]


def test_a_job_charged_for_a_death_goes_behind_the_jobs_that_ran_beside_it(store):
    poison, innocent = (tasks.add.enqueue(n, n) for n in (1, 2))
    claim(store, 51)
    store.release_owner(owner=51, error_class="x.Died", error_text="SIGKILL")
    # Both isolated: the first in line runs alone, and kills its worker again.
    (first,) = claim(store, 52, isolated_first=True)
    assert str(first.id) == poison.id
    store.release_owner(owner=52, error_class="x.Died", error_text="SIGKILL")
    # Charged, it goes to the back: its batch-mate runs next.
    (second,) = claim(store, 51, isolated_first=True)
    assert str(second.id) == innocent.id


def test_a_job_that_keeps_killing_its_process_alone_is_failed_at_its_cap(store):
    result = tasks.add.enqueue(4, 4)
    Job.objects.filter(pk=result.id).update(max_attempts=2)
    for _ in range(2):
        claim(store, 51, isolated_first=True)
        store.release_owner(owner=51, error_class="x.Died", error_text="SIGKILL")
    row = Job.objects.get(pk=result.id)
    assert (row.status, len(row.errors)) == ("failed", 2)


def test_an_isolated_job_neither_starves_nor_blocks_its_queue():
    """A worker always busy with its first queue still runs the second: the isolated job at
    the head of that queue is neither claimed beside others, nor in their way, nor left for
    ever (the worker stops topping up until it runs nothing, then takes it)."""
    suspect = tasks.record.using(queue_name="low").enqueue(label="suspect")
    Job.objects.filter(pk=suspect.id).update(isolated=True)
    enqueue_many(tasks.record.using(queue_name="low"), [Call(label="low") for _ in range(5)])
    stop = threading.Event()

    def keep_the_first_queue_busy() -> None:
        try:
            while not stop.is_set():
                job = tasks.record.using(queue_name="high").enqueue(label="high", sleep=0.3)
                # The next is enqueued once this one runs: there is always one to claim.
                wait_for(
                    lambda job=job: stop.is_set() or Job.objects.get(pk=job.id).status != "ready",
                    timeout=10,
                )
        finally:
            connections.close_all()

    feeder = threading.Thread(target=keep_the_first_queue_busy)
    feeder.start()
    try:
        with worker_thread(queues="high,low", threads=4):
            wait_for(
                lambda: Execution.objects.filter(label__in=["low", "suspect"]).count() == 6,
                timeout=15,
                message="the second queue, isolated job included, to run",
            )
    finally:
        stop.set()
        feeder.join(15)
    suspect_run = Execution.objects.get(label="suspect")
    overlapping = Execution.objects.exclude(label="suspect").filter(
        started_at__lt=suspect_run.finished_at, finished_at__gt=suspect_run.started_at
    )
    assert not overlapping.exists(), "the isolated job ran beside another job"
