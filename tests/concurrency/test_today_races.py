"""Races around a pending job that holds its unique key (the day's change): its parent
ending, its revival and its twins' enqueues and retries, each on connections of their own,
released together. Whatever the interleaving: one job at most holds the key, every call
returns a job that exists, and none raises (contention is a return value).
"""

from datetime import timedelta

import pytest
from django.utils import timezone

import stalwart
from stalwart import enqueue_after
from stalwart.control import Selection, retry_failed
from stalwart.jobs import JobStore
from stalwart.models import Job
from stalwart.models.job import UNIQUE_STATES
from tests.helpers import at_once
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

ROUNDS = range(4)


def holders(day: str) -> list[str]:
    key = tasks.unique_report.unique_key_for([day], {})
    return [
        str(pk)
        for pk in Job.objects.filter(UNIQUE_STATES, unique_key=key).values_list("pk", flat=True)
    ]


def status(job_id) -> str:
    return Job.objects.get(pk=job_id).status


def together(racers: int, work) -> list:
    """``at_once``, with what a racer raised returned (and then asserted with its repr)."""

    def guarded(number: int):
        try:
            return work(number)
        except BaseException as error:  # noqa: BLE001 - asserted below
            return error

    results = at_once(racers, guarded)
    raised = [result for result in results if isinstance(result, BaseException)]
    assert raised == [], repr(raised)
    return results


def later():
    return tasks.noop.using(run_after=timezone.now() + timedelta(hours=1)).enqueue()


@pytest.mark.parametrize("round_number", ROUNDS)
def test_a_pending_holders_parent_cancelled_while_twins_are_enqueued(round_number):
    day = f"cancelled-{round_number}"
    parent = later()
    pending = enqueue_after([parent], tasks.unique_report, day)
    other_parent = later()

    def race(number: int) -> str:
        if number == 0:
            assert stalwart.cancel(parent.id).cancelled == 1
            JobStore("default").resolve_dependencies()
            return ""
        if number == 1:
            return tasks.unique_report.enqueue(day).id
        return enqueue_after([other_parent], tasks.unique_report, day).id

    returned = [job_id for job_id in together(3, race) if job_id]
    JobStore("default").resolve_dependencies()
    assert status(pending.id) == "cancelled"
    held = holders(day)
    assert len(held) <= 1
    for job_id in returned:
        # The pending holder (cancelled since), or the job that holds the key now.
        assert job_id == pending.id or job_id in held, (job_id, held)
    assert len(set(returned) - {pending.id}) <= 1


@pytest.mark.parametrize("parent_outcome", ["successful", "failed"])
@pytest.mark.parametrize("round_number", ROUNDS)
def test_a_pending_holder_decided_while_its_failed_twin_is_retried(round_number, parent_outcome):
    day = f"decided-{parent_outcome}-{round_number}"
    failed = tasks.unique_report.enqueue(day)
    Job.objects.filter(pk=failed.id).update(status="failed", finished_at=timezone.now(), attempt=1)
    parent = tasks.noop.enqueue()
    pending = enqueue_after([parent], tasks.unique_report, day)
    # The parent ended without a worker (as a death or a cancel ends one).
    Job.objects.filter(pk=parent.id).update(status=parent_outcome, finished_at=timezone.now())

    def race(number: int) -> int:
        if number == 0:
            return sum(JobStore("default").resolve_dependencies())
        return retry_failed(Selection(ids=[failed.id]))

    together(2, race)
    JobStore("default").resolve_dependencies()
    if parent_outcome == "successful":
        assert status(pending.id) == "ready"
        assert status(failed.id) == "failed", "the key was held all along"
        assert holders(day) == [pending.id]
    else:
        assert status(pending.id) == "cancelled"
        assert holders(day) in ([], [failed.id])
        assert status(failed.id) == ("ready" if holders(day) else "failed")


@pytest.mark.parametrize("round_number", ROUNDS)
def test_a_revival_racing_a_new_enqueue_of_the_same_key(round_number):
    day = f"revived-{round_number}"
    parent = tasks.noop.enqueue()
    dependant = enqueue_after([parent], tasks.unique_report, day)
    Job.objects.filter(pk=parent.id).update(status="failed", finished_at=timezone.now(), attempt=1)
    JobStore("default").resolve_dependencies()
    assert status(dependant.id) == "cancelled"

    def race(number: int) -> str:
        if number == 0:
            assert retry_failed(Selection(ids=[parent.id])) == 1
            return ""
        return tasks.unique_report.enqueue(day).id

    (enqueued,) = [job_id for job_id in together(2, race) if job_id]
    assert holders(day) == [enqueued]
    assert status(dependant.id) == ("pending" if enqueued == dependant.id else "cancelled")
