"""The duplicate-claim race the peers shipped, made to happen for real.

Several worker processes with several threads each claim from one table while jobs keep
arriving (a fifth of them deferred by a few milliseconds). Every job writes a row to a side
table; each must be there exactly once, and no worker may log a traceback, an IntegrityError
or a deadlock.
"""

import random
import signal
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.db.models import Count
from django.utils import timezone

from stalwart import Call, enqueue_many
from stalwart.models import Job, Process
from tests.helpers import Child, wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# PostgreSQL takes the full load; SQLite, with one writer at a time, what it can bear.
LOAD = {"postgresql": (4, 4, 5000), "mysql": (4, 4, 5000), "sqlite": (3, 3, 1500)}
FORBIDDEN = ("Traceback", "IntegrityError", "deadlock", "database is locked")


def enqueue_load(total: int) -> list[str]:
    ids: list[str] = []
    rng = random.Random(42)
    while len(ids) < total:
        batch = min(rng.randint(1, 200), total - len(ids))
        if rng.random() < 0.2:
            deferred = tasks.record.using(
                run_after=timezone.now() + timedelta(milliseconds=rng.randint(2, 20))
            )
            ids.extend(result.id for result in enqueue_many(deferred, [Call()] * batch))
        elif batch < 5:
            ids.extend(tasks.record.enqueue().id for _ in range(batch))
        else:
            ids.extend(result.id for result in enqueue_many(tasks.record, [Call()] * batch))
    return ids


def test_every_job_runs_exactly_once_under_contention():
    processes, threads, total = LOAD[connection.vendor]
    connections.close_all()
    workers = [
        Child("queue", "work", "--threads", str(threads), "--poll-interval", "0.05")
        for _ in range(processes)
    ]
    try:
        wait_for(
            lambda: Process.objects.filter(kind="worker").count() == processes,
            timeout=30,
            message="all workers to register",
        )
        ids = enqueue_load(total)
        assert len(set(ids)) == total
        try:
            wait_for(
                lambda: Job.objects.filter(status="successful").count() == total,
                timeout=120,
                message=f"{total} jobs to succeed",
            )
        except AssertionError:
            states = dict(
                Job.objects.values("status").annotate(n=Count("id")).values_list("status", "n")
            )
            for worker in workers:
                worker.__exit__()
            raise AssertionError(
                f"jobs by status: {states}\n" + "\n".join(worker.output for worker in workers)
            ) from None
        for worker in workers:
            worker.signal(signal.SIGTERM)
        codes = [worker.wait(timeout=30) for worker in workers]
    finally:
        for worker in workers:
            worker.__exit__()
    outputs = "\n".join(worker.output for worker in workers)
    assert codes == [0] * processes, outputs
    for word in FORBIDDEN:
        assert word not in outputs, outputs

    executions = dict(
        Execution.objects.values("job_id").annotate(n=Count("id")).values_list("job_id", "n")
    )
    assert len(executions) == total
    assert set(executions) == set(ids)
    assert set(executions.values()) == {1}
    assert not Job.objects.exclude(status="successful").exists()
    assert set(Job.objects.values_list("attempt", flat=True)) == {1}
    # Every worker took part, and none ran a deferred job before its time.
    assert len(set(Execution.objects.values_list("pid", flat=True))) == processes
    early = [
        job
        for job in Job.objects.exclude(run_after=None).only("run_after", "started_at")
        if job.started_at < job.run_after
    ]
    assert early == []
    assert not Process.objects.exists()
