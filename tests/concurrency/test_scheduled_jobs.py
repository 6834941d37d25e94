"""Delayed jobs under contention: two dispatchers, several workers, none early, none twice."""

import random
import signal
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.db.models import Count
from django.utils import timezone

from stalwart import Call, enqueue_many
from stalwart.models import Job, Process
from tests.helpers import Child, child_env, wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

JOBS = {"postgresql": 3000, "mysql": 3000, "sqlite": 1000}


def test_delayed_jobs_run_exactly_once_and_never_early():
    total = JOBS[connection.vendor]
    connections.close_all()
    supervisor = Child(
        "queue",
        "supervise",
        "--processes",
        "3",
        "--threads",
        "4",
        "--dispatchers",
        "2",
        "--no-scheduler",
        env=child_env(),
    )
    with supervisor:
        wait_for(
            lambda: (
                Process.objects.filter(kind="dispatcher").count() == 2
                and Process.objects.filter(kind="worker").count() == 3
            ),
            timeout=30,
            message="the supervisor's children",
        )
        rng = random.Random(7)
        enqueued = 0
        while enqueued < total:
            batch = min(rng.randint(20, 150), total - enqueued)
            delay = timedelta(milliseconds=rng.randint(0, 50))
            task = tasks.record.using(run_after=timezone.now() + delay)
            enqueue_many(task, [Call(label="delayed")] * batch)
            enqueued += batch
        wait_for(
            lambda: Job.objects.filter(status="successful").count() == total,
            timeout=120,
            message=f"{total} delayed jobs to run",
        )
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=40) == 0, supervisor.output
    for word in ("Traceback", "IntegrityError", "deadlock"):
        assert word not in supervisor.output
    per_job = dict(
        Execution.objects.values("job_id").annotate(n=Count("id")).values_list("job_id", "n")
    )
    assert len(per_job) == total
    assert set(per_job.values()) == {1}
    run_after = {str(pk): when for pk, when in Job.objects.values_list("id", "run_after")}
    # Each early one with how early it was (seconds), so that a failure tells a job made
    # due too soon from a clock stepped back between two readings of it.
    early_claims = [
        (str(pk), (run_after[str(pk)] - started).total_seconds())
        for pk, started in Job.objects.values_list("id", "started_at")
        if started < run_after[str(pk)]
    ]
    early_runs = [
        (job_id, (run_after[job_id] - started).total_seconds())
        for job_id, started in Execution.objects.values_list("job_id", "started_at")
        if started < run_after[job_id]
    ]
    assert early_claims == early_runs == [], supervisor.output[-3000:]
    assert not Process.objects.exists()
