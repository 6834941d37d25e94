"""The scheduler's tick against a real database: catch-up after downtime, races, bad tasks."""

import threading
from dataclasses import replace
from datetime import timedelta

import pytest
from django.tasks import task_backends
from django.utils import timezone

from stalwart.conf import SchedulerOptions
from stalwart.models import Job, RecurringRun
from stalwart.processes import scheduler as scheduler_module
from stalwart.processes.scheduler import Scheduler
from stalwart.recurring import read_recurring
from stalwart.ticks import database_now, last_runs
from tests.helpers import at_once

pytestmark = pytest.mark.django_db(transaction=True)


def scheduler_for(**entries) -> Scheduler:
    config = task_backends["default"].config
    recurring = read_recurring(entries, "recurring", "UTC")
    return Scheduler(config=replace(config, recurring=recurring), scheduler=SchedulerOptions())


def test_after_downtime_only_the_latest_missed_tick_runs():
    scheduler = scheduler_for(
        minutely={
            "task": "tests.testapp.tasks.add",
            "schedule": "* * * * *",
            "args": [1, 2],
            "queue_name": "reports",
            "priority": 7,
        }
    )
    an_hour_ago = (database_now("default") - timedelta(hours=1)).replace(second=0, microsecond=0)
    RecurringRun.objects.create(
        key="minutely", run_at=an_hour_ago, job_id="0" * 32, created_at=timezone.now()
    )
    scheduler.tick()
    scheduler.tick()  # a second look enqueues nothing more
    runs = list(RecurringRun.objects.order_by("run_at"))
    assert len(runs) == 2
    latest = runs[1]
    now = database_now("default")
    assert now - timedelta(minutes=1) < latest.run_at <= now
    job = Job.objects.get(pk=latest.job_id)
    assert (job.task_path, job.args, job.queue_name, job.priority) == (
        "tests.testapp.tasks.add",
        [1, 2],
        "reports",
        7,
    )


def test_two_schedulers_ticking_together_enqueue_once(monkeypatch, recorded_events):
    entries = {"minutely": {"task": "tests.testapp.tasks.noop", "schedule": "* * * * *"}}
    first, second = scheduler_for(**entries), scheduler_for(**entries)
    start = database_now("default") - timedelta(minutes=3)
    first.started_at = second.started_at = start
    # A pause point between each scheduler's read of the latest ticks and its insert: both
    # read before either writes, so both find the same tick due and both try to record it.
    # One must learn from the unique (key, run_at) record that the other got there first.
    both_read = threading.Barrier(2)

    def read_then_wait(database: str) -> dict:
        latest = last_runs(database)
        both_read.wait(timeout=10)
        return latest

    monkeypatch.setattr(scheduler_module, "last_runs", read_then_wait)
    at_once(2, lambda number: (first, second)[number].tick())
    enqueued = [fields for action, fields in recorded_events if action == "recurring_enqueued"]
    assert len(enqueued) == 1
    run = RecurringRun.objects.get()
    assert str(run.job_id).replace("-", "") == enqueued[0]["job"].replace("-", "")
    assert list(Job.objects.values_list("id", flat=True)) == [run.job_id]


def test_a_task_that_does_not_exist_is_reported_and_skipped(recorded_events):
    scheduler = scheduler_for(
        broken={"task": "tests.testapp.tasks.nope", "schedule": "* * * * * *"},
        fine={"task": "tests.testapp.tasks.noop", "schedule": "* * * * * *"},
    )
    scheduler.request_stop()  # main() checks the tasks, then returns at once
    scheduler.main()
    assert "broken" in scheduler.broken
    assert ("recurring_task_invalid", "broken") in [
        (action, fields.get("key")) for action, fields in recorded_events
    ]
    scheduler.started_at = database_now("default") - timedelta(seconds=5)
    scheduler.tick()
    assert set(RecurringRun.objects.values_list("key", flat=True)) == {"fine"}


def test_an_entry_the_backend_refuses_is_skipped_not_a_crash_loop():
    config = task_backends["limited"].config  # QUEUES: default, other; 1 KiB of arguments
    recurring = read_recurring(
        {
            "wrong-queue": {
                "task": "tests.testapp.tasks.noop",
                "schedule": "* * * * * *",
                "queue_name": "elsewhere",
            },
            "too-big": {
                "task": "tests.testapp.tasks.echo",
                "schedule": "* * * * * *",
                "args": ["x" * 5000],
            },
            "fine": {"task": "tests.testapp.tasks.noop", "schedule": "* * * * * *"},
        },
        "recurring",
        "UTC",
    )
    scheduler = Scheduler(config=replace(config, recurring=recurring), scheduler=SchedulerOptions())
    scheduler.request_stop()
    scheduler.main()
    assert set(scheduler.broken) == {"wrong-queue", "too-big"}
    assert "Queue 'elsewhere' is not valid" in scheduler.broken["wrong-queue"]
    assert "over the limit of 1024 bytes" in scheduler.broken["too-big"]
    scheduler.started_at = database_now("default") - timedelta(seconds=5)
    scheduler.tick()
    assert set(RecurringRun.objects.values_list("key", flat=True)) == {"fine"}
