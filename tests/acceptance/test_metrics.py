"""Metrics counted by real worker processes add up, whichever process ran the job."""

import signal

import pytest
from django.db.models import Sum

from stalwart import Call, enqueue_many
from stalwart.models import Counter, Job
from tests.acceptance.supervision import start_supervisor
from tests.helpers import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_counters_add_up_across_worker_processes(reaped):
    supervisor = start_supervisor(
        "--processes", "2", "--threads", "2", "--no-scheduler", children=3, STALWART_METRICS="true"
    )
    reaped.append(supervisor)
    enqueue_many(tasks.record, [Call(label="counted", sleep=0.02) for _ in range(60)])
    wait_for(
        lambda: Job.objects.filter(status="successful").count() == 60,
        timeout=60,
        message="60 jobs to succeed",
    )
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=30) == 0, supervisor.output
    workers = {job.worker_ids[0].rsplit("-", 1)[0] for job in Job.objects.all()}
    assert len(workers) == 2, "both worker processes ran jobs"
    succeeded = Counter.objects.filter(name="succeeded").aggregate(n=Sum("value"))["n"]
    assert succeeded == 60
    durations = Counter.objects.get(name="duration_count", task_path="tests.testapp.tasks.record")
    assert durations.value == 60
