"""Recurring tasks: each tick enqueued exactly once by however many schedulers run."""

import itertools
import json
import signal

import pytest
from django.db import connections
from django.db.models import Count

from stalwart.models import Job, Process, RecurringRun
from tests.helpers import Child, child_env, wait_for
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EVERY_SECOND = json.dumps(
    {
        "every-second": {
            "task": "tests.testapp.tasks.record",
            "schedule": "* * * * * *",
            "timezone": "UTC",
            "kwargs": {"label": "tick"},
        }
    }
)
TICKS = 20


@pytest.mark.parametrize("schedulers", [2, 4])
def test_each_tick_is_enqueued_once_across_schedulers(schedulers):
    connections.close_all()
    env = child_env(STALWART_RECURRING=EVERY_SECOND)
    supervisors = [
        Child(
            "queue",
            "supervise",
            "--processes",
            "1",
            "--threads",
            "2",
            "--dispatchers",
            "0",
            env=env,
        )
        for _ in range(schedulers)
    ]
    try:
        wait_for(
            lambda: Process.objects.filter(kind="scheduler").count() == schedulers,
            timeout=60,
            message=f"{schedulers} schedulers",
        )
        wait_for(
            lambda: RecurringRun.objects.count() >= TICKS,
            timeout=TICKS * 3,
            message=f"{TICKS} ticks",
        )
        for supervisor in supervisors:
            supervisor.signal(signal.SIGTERM)
        codes = [supervisor.wait(timeout=40) for supervisor in supervisors]
    finally:
        for supervisor in supervisors:
            supervisor.__exit__()
    outputs = "\n".join(supervisor.output for supervisor in supervisors)
    assert codes == [0] * schedulers, outputs
    assert "Traceback" not in outputs
    assert "IntegrityError" not in outputs

    runs = list(RecurringRun.objects.order_by("run_at").values_list("run_at", "job_id"))
    ticks = [run_at for run_at, _ in runs]
    assert len(ticks) == len(set(ticks)) >= TICKS
    assert all(tick.microsecond == 0 for tick in ticks)
    # One job per tick: every job the scheduler enqueued belongs to exactly one tick.
    jobs = set(
        Job.objects.filter(task_path="tests.testapp.tasks.record").values_list("id", flat=True)
    )
    assert jobs == {job_id for _, job_id in runs}
    # Consecutive ticks are one second apart unless the machine stalled for a whole second.
    gaps = [later - earlier for earlier, later in itertools.pairwise(ticks)]
    assert min(gap.total_seconds() for gap in gaps) == 1
    # Jobs that ran, ran once.
    executed = dict(
        Execution.objects.values("job_id").annotate(n=Count("id")).values_list("job_id", "n")
    )
    assert set(executed.values()) <= {1}
    assert not Process.objects.exists()


def test_the_recurring_command_lists_last_and_next_runs():
    connections.close_all()
    env = child_env(STALWART_RECURRING=EVERY_SECOND)
    with Child("queue", "recurring", "--json", env=env) as listing:
        assert listing.wait(timeout=60) == 0, listing.output
    (row,) = json.loads(listing.output)
    assert row["key"] == "every-second"
    assert row["schedule"] == "* * * * * *"
    assert row["last_run"] is None
    assert row["next_run"] is not None
    with Child("queue", "recurring", env=env) as table:
        assert table.wait(timeout=60) == 0, table.output
    header, line = table.output.strip().splitlines()
    assert header.split() == ["KEY", "TASK", "SCHEDULE", "TIMEZONE", "LAST", "RUN", "NEXT", "RUN"]
    assert line.startswith("every-second  tests.testapp.tasks.record  * * * * * *  UTC")
    assert "never" in line
