"""Concurrency limits, pauses and timeouts with real supervisors, forks and signals."""

import itertools
import random
import signal
from collections import defaultdict

import psutil
import pytest
from django.db.models import Count

from stalwart import Call, enqueue_many
from stalwart.models import Job, Process
from tests.helpers import Child, child_env, wait_for
from tests.processes import start_supervisor
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def stop(supervisor: Child) -> None:
    supervisor.signal(signal.SIGTERM)
    assert supervisor.wait(timeout=40) == 0, supervisor.output


def test_a_limit_of_one_per_key_is_never_exceeded_even_when_a_worker_dies():
    keys = [f"account-{n}" for n in range(5)]
    rng = random.Random(3)
    calls = [Call(rng.choice(keys), sleep=0.002) for _ in range(500)]
    with start_supervisor(
        "--no-scheduler", "--processes", "4", "--threads", "3", workers=4
    ) as supervisor:
        enqueue_many(tasks.one_at_a_time, calls)
        wait_for(
            lambda: Job.objects.filter(status="successful").count() == len(calls),
            timeout=120,
            message=f"{len(calls)} limited jobs to run",
        )
        # Now kill a worker while it holds a slot (and runs nothing else, so no other job of
        # its can have done its work without recording it). The job goes back to ready with
        # its slot, runs again, frees the slot; nothing is left blocked for ever.
        victim_job = tasks.one_at_a_time.enqueue("account-victim", sleep=30)
        wait_for(
            lambda: Job.objects.get(pk=victim_job.id).status == "running",
            timeout=30,
            message="the slot holder to start",
        )
        queued_behind = tasks.one_at_a_time.enqueue("account-victim")
        assert Job.objects.get(pk=queued_behind.id).status == "blocked"
        owner = Process.objects.get(pk=Job.objects.get(pk=victim_job.id).owner)
        # When it runs again, let it be quick (the running attempt has its arguments already).
        Job.objects.filter(pk=victim_job.id).update(kwargs={"sleep": 0})
        psutil.Process(owner.pid).kill()
        total = len(calls) + 2
        wait_for(
            lambda: Job.objects.filter(status="successful").count() == total,
            timeout=60,
            message="the victim's key to drain",
        )
        stop(supervisor)
    assert "Traceback" not in supervisor.output

    per_job = dict(
        Execution.objects.values("job_id").annotate(n=Count("id")).values_list("job_id", "n")
    )
    assert len(per_job) == total
    assert set(per_job.values()) == {1}
    intervals = defaultdict(list)
    for label, started, finished in Execution.objects.values_list(
        "label", "started_at", "finished_at"
    ):
        intervals[label].append((started, finished))
    for key, spans in intervals.items():
        spans.sort()
        for (_, earlier_end), (later_start, _) in itertools.pairwise(spans):
            assert later_start >= earlier_end, f"two jobs of {key} overlapped"
    assert not Job.objects.exclude(status="successful").exists()
    assert not Process.objects.exists()


def test_pause_and_resume_apply_to_every_supervisor():
    with (
        start_supervisor(
            "--no-scheduler", "--processes", "1", "--threads", "2", workers=1
        ) as first,
        start_supervisor(
            "--no-scheduler", "--processes", "1", "--threads", "2", workers=1
        ) as second,
    ):
        long_job = tasks.record.using(queue_name="reports").enqueue(label="long", sleep=2)
        wait_for(
            lambda: Job.objects.get(pk=long_job.id).status == "running",
            message="a reports job to start",
        )
        with Child("queue", "pause", "reports") as pause:
            assert pause.wait(timeout=60) == 0
        assert "Paused 'reports'" in pause.output
        # Every worker, under either supervisor, says (in its heartbeat) it honours the pause.
        wait_for(
            lambda: all(
                "reports" in worker.metadata.get("paused", [])
                for worker in Process.objects.filter(kind="worker")
            ),
            timeout=15,
            message="both workers to see the pause",
        )
        held = enqueue_many(tasks.record.using(queue_name="reports"), [Call(label="held")] * 5)
        served = enqueue_many(tasks.record, [Call(label="served")] * 20)
        wait_for(
            lambda: (
                Job.objects.filter(pk__in=[r.id for r in served], status="successful").count() == 20
            ),
            message="the default queue to be served",
        )
        # The running job was left to finish; nothing new was taken from the paused queue,
        # by either supervisor, although both kept polling.
        wait_for(
            lambda: Job.objects.get(pk=long_job.id).status == "successful",
            message="the running job to finish",
        )
        assert Job.objects.filter(pk__in=[r.id for r in held], status="ready").count() == 5
        with Child("queue", "resume", "reports") as resume:
            assert resume.wait(timeout=60) == 0
        wait_for(
            lambda: Job.objects.filter(status="successful").count() == 26,
            timeout=30,
            message="the resumed queue to drain",
        )
        workers_used = set(Execution.objects.filter(label="held").values_list("pid", flat=True))
        assert workers_used
        stop(first)
        stop(second)
    assert not Process.objects.exists()


def test_a_job_past_its_timeout_is_failed_and_its_worker_replaced():
    with start_supervisor(
        "--no-scheduler", "--processes", "1", "--threads", "2", workers=1
    ) as supervisor:
        worker = Process.objects.get(kind="worker")
        stuck = tasks.overruns.enqueue(30)
        neighbour = tasks.record.enqueue(label="neighbour", sleep=1.5)
        wait_for(
            lambda: Job.objects.get(pk=stuck.id).status == "failed",
            timeout=30,
            message="the overrunning job to be failed",
        )
        wait_for(
            lambda: Process.objects.filter(kind="worker").exclude(pk=worker.id).exists(),
            timeout=30,
            message="a replacement worker",
        )
        after = tasks.add.enqueue(20, 22)
        wait_for(
            lambda: Job.objects.get(pk=after.id).status == "successful",
            timeout=30,
            message="the replacement to run jobs",
        )
        stop(supervisor)
    stuck.refresh()
    assert stuck.errors[0].exception_class_path == "stalwart.exceptions.JobTimedOut"
    assert "longer than the task's timeout of 1 s" in stuck.errors[0].traceback
    # The other job on that worker was let finish before the worker was replaced.
    assert Job.objects.get(pk=neighbour.id).status == "successful"
    assert "action=job_timed_out" in supervisor.output
    assert "action=child_exited" in supervisor.output


def test_retry_discard_and_run_now_commands_report_counts():
    enqueue_many(tasks.add, [Call(1, 2)] * 30)
    Job.objects.update(status="failed")
    env = child_env()
    with Child("queue", "retry", "--task", "tests.testapp.tasks.add", "--dry-run", env=env) as dry:
        assert dry.wait(timeout=60) == 0
    assert "Would retry 30 failed jobs (dry run: nothing changed)." in dry.output
    assert Job.objects.filter(status="failed").count() == 30
    with Child("queue", "retry", "--all", "--batch-size", "7", env=env) as retry:
        assert retry.wait(timeout=60) == 0
    assert "Retried 30 failed jobs (jobs with a concurrency key wait for a free slot)." in (
        retry.output
    )
    Job.objects.update(status="failed")
    with Child("queue", "discard", "--queue", "default", env=env) as discard:
        assert discard.wait(timeout=60) == 0
    assert "Discarded 30 failed jobs." in discard.output
    assert not Job.objects.exists()
    with Child("queue", "discard", env=env) as unsure:
        assert unsure.wait(timeout=60) != 0
    assert "Say which jobs" in unsure.output
