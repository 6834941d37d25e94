"""Retries: errors accumulate, attempts count, the policy decides, delays are computed."""

from datetime import timedelta

import pytest
from django.tasks import TaskResultStatus, task
from django.tasks.exceptions import InvalidTask

import stalwart
from stalwart.models import Job
from stalwart.task import Exponential, Fixed, StalwartTask
from tests.helpers import drain, wait_for, worker_thread
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_retried_job_keeps_every_error_and_ends_successful():
    result = tasks.flaky.enqueue(failures=2)
    assert Job.objects.get(pk=result.id).max_attempts == 4
    drain(threads=1)
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert result.attempts == 3
    assert [error.exception_class_path for error in result.errors] == [
        "builtins.ConnectionError",
        "builtins.ConnectionError",
    ]
    assert "attempt 1 failed" in result.errors[0].traceback
    assert "attempt 2 failed" in result.errors[1].traceback


def test_a_job_that_keeps_failing_is_failed_after_max_attempts():
    result = tasks.always_fails.enqueue()
    drain(threads=1)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 3
    assert len(result.errors) == 3


def test_only_the_listed_exceptions_are_retried():
    result = tasks.fails_without_retry.enqueue()
    drain(threads=1)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    assert result.errors[0].exception_class_path == "builtins.TypeError"


def test_a_retry_waits_its_backoff_in_the_scheduled_state():
    result = tasks.fails_slowly.enqueue()
    with worker_thread(threads=1):
        wait_for(
            lambda: Job.objects.get(pk=result.id).status == "scheduled",
            message="the retry to be scheduled",
        )
    job = Job.objects.get(pk=result.id)
    assert job.status == "scheduled"
    delay = job.available_at - job.last_attempted_at
    # Never before its 30 s backoff (both times are the database's); after it by the attempt's
    # run and its outcome's write, a moment, allowed many times over on a loaded machine.
    assert timedelta(seconds=30) <= delay < timedelta(seconds=45)
    result.refresh()
    assert result.status == TaskResultStatus.READY
    assert len(result.errors) == 1


def test_tasks_without_retry_options_fail_at_once_as_django_expects():
    result = tasks.fail.enqueue()
    drain(threads=1)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1


def test_exponential_backoff_grows_and_stays_within_its_jitter():
    backoff = Exponential(base=2, maximum=60)
    for failures, middle in [(1, 2), (2, 4), (3, 8), (4, 16), (10, 60)]:
        delays = [backoff(failures) for _ in range(200)]
        assert min(delays) >= middle * 0.5
        assert max(delays) <= middle * 1.5
    assert Exponential(base=1, jitter=False)(3) == 4
    assert Fixed(7)(99) == 7


# -- declaring options ---------------------------------------------------------------------


def test_the_backend_task_class_carries_the_options():
    assert isinstance(tasks.flaky, StalwartTask)
    assert tasks.flaky.using(priority=5).max_attempts == 4  # options survive using()


def test_django_task_decorator_passes_options_on_django_6_1():
    import django

    if django.VERSION < (6, 1):
        pytest.skip("Django 6.0's @task takes no backend options; stalwart.task is the way")

    def probe() -> None:
        return None

    probe.__module__ = "tests.testapp.tasks"
    probe.__qualname__ = "probe"
    declared = task(max_attempts=2)(probe)
    assert isinstance(declared, StalwartTask)
    assert declared.max_attempts == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "option 'max_attempts' must be a whole number from 1 to 1000"),
        ({"retry_on": "ValueError"}, "option 'retry_on' must be an exception class"),
        ({"backoff": -1}, "option 'backoff' must not be negative"),
        ({"backoff": "soon"}, "option 'backoff' must be seconds or a callable"),
        ({"timeout": 0}, "option 'timeout' must be a positive number of seconds"),
        ({"concurrency_limit": 0}, "option 'concurrency_limit' must be a whole number"),
        ({"concurrency_key": "{x}"}, "option 'concurrency_key' needs concurrency_limit"),
        ({"concurrency_duration": 5}, "option 'concurrency_duration' needs concurrency_limit"),
        (
            {"concurrency_limit": 1, "concurrency_duration": 0},
            "option 'concurrency_duration' must be a positive number of seconds or a timedelta",
        ),
        (
            {"concurrency_limit": 1, "concurrency_duration": "1h"},
            "option 'concurrency_duration' must be a positive number of seconds or a timedelta",
        ),
        ({"unique": 3}, "option 'unique' must be True, a format string or a callable"),
        ({"unique_while_running": True}, "option 'unique_while_running' needs unique"),
    ],
)
def test_invalid_options_fail_at_declaration_naming_the_option(options, message):
    def probe() -> None:
        return None

    probe.__module__ = "tests.testapp.tasks"
    probe.__qualname__ = "probe"
    with pytest.raises(InvalidTask) as caught:
        stalwart.task(**options)(probe)
    assert message in str(caught.value)
    assert "Task 'tests.testapp.tasks.probe'" in str(caught.value)


def test_unknown_options_fail_at_declaration():
    def probe() -> None:
        return None

    probe.__module__ = "tests.testapp.tasks"
    probe.__qualname__ = "probe"
    with pytest.raises(TypeError, match="retries"):
        stalwart.task(retries=3)(probe)


def test_failures_a_retry_cannot_cure_are_not_retried():
    result = tasks.returns_a_set.enqueue()
    drain(threads=1)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 1
    assert result.errors[0].exception_class is TypeError
