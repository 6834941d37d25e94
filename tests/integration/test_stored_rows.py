"""Rows a worker did not write itself: changed by hand, by a migration gone wrong, by an
attacker with database access. Each fails on its own, at once, and runs nothing it names."""

import pytest
from django.db import IntegrityError, transaction

from stalwart.models import Job
from tests.helpers import drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def failure(job_id: str) -> tuple[str, int, list[str], str]:
    job = Job.objects.get(pk=job_id)
    errors = [error["exception_class_path"] for error in job.errors]
    return job.status, job.attempt, errors, job.errors[-1]["traceback"] if job.errors else ""


# -- arguments of the wrong shape ----------------------------------------------------------


def test_stored_args_that_are_an_object_fail_instead_of_passing_their_keys():
    result = tasks.echo.enqueue()
    Job.objects.filter(pk=result.id).update(args={"surprise": 1})
    fine = tasks.echo.enqueue(1, b=2)
    drain(threads=1)
    status, attempt, errors, traceback = failure(result.id)
    assert (status, attempt, errors) == (
        "failed",
        1,
        ["stalwart.exceptions.InvalidStoredArguments"],
    )
    assert "args must be a JSON array, not an object" in traceback
    fine.refresh()
    assert fine.return_value == {"args": [1], "kwargs": {"b": 2}}


def test_stored_kwargs_that_are_an_array_fail_at_once_without_retries():
    result = tasks.echo_with_retries.enqueue()
    assert tasks.echo_with_retries.max_attempts == 5
    Job.objects.filter(pk=result.id).update(kwargs=[1])
    drain(threads=1)
    status, attempt, errors, traceback = failure(result.id)
    assert (status, attempt, errors) == (
        "failed",
        1,
        ["stalwart.exceptions.InvalidStoredArguments"],
    )
    assert "kwargs must be a JSON object, not an array" in traceback
    assert "no retry can fix it" in traceback


@pytest.mark.parametrize(("column", "value"), [("args", "1, 2"), ("kwargs", 7)])
def test_stored_arguments_that_are_not_even_containers_fail_too(column, value):
    result = tasks.echo_with_retries.enqueue()
    Job.objects.filter(pk=result.id).update(**{column: value})
    drain(threads=1)
    status, attempt, errors, _ = failure(result.id)
    assert (status, attempt, errors) == (
        "failed",
        1,
        ["stalwart.exceptions.InvalidStoredArguments"],
    )


# -- columns the database checks itself ----------------------------------------------------


@pytest.mark.parametrize("priority", [101, -101, 32000])
def test_a_priority_outside_djangos_range_is_refused_by_the_database(priority):
    result = tasks.noop.enqueue()
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=result.id).update(priority=priority)
    for fine in (100, -100, 0):
        Job.objects.filter(pk=result.id).update(priority=fine)
    assert Job.objects.get(pk=result.id).priority == 0
