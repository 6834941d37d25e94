"""A claim's rows, decoded from a plain cursor: the same values the ORM reads, on every
database (the JSON columns, the times, the ids)."""

import pytest

from stalwart.db.rows import CLAIM_COLUMNS
from stalwart.jobs import JobStore
from stalwart.models import Job
from stalwart.queues import QueueSelector
from tests.helpers import register_processes
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_claimed_jobs_hold_what_the_orm_reads_and_each_empty_value_is_its_own():
    register_processes(3)
    results = [
        tasks.echo.enqueue(),
        tasks.echo.enqueue(),
        tasks.echo.enqueue([1, {"nested": [None, True, 2.5]}], "ünïcode", b={"c": []}),
    ]
    claimed = JobStore("default").claim(
        owner=3, worker_name="w3", selector=QueueSelector.parse("*"), limit=10
    )
    assert sorted(str(job.id) for job in claimed) == sorted(result.id for result in results)
    for job in claimed:
        row = Job.objects.get(pk=job.id)
        for name in CLAIM_COLUMNS:
            assert getattr(job, name) == getattr(row, name), name
    # Jobs without arguments share no list or dict: a task that changes its own changes
    # no other job's.
    empty = [job for job in claimed if not job.args]
    assert len(empty) == 2
    assert empty[0].args is not empty[1].args
    assert empty[0].kwargs is not empty[1].kwargs
    assert empty[0].errors is not empty[1].errors
