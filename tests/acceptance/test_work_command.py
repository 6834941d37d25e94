"""``manage.py queue work`` as a real process, stopped with real signals."""

import signal

import pytest
from django.tasks import TaskResultStatus

from stalwart.models import Job, Process
from tests import processes
from tests.helpers import Child, child_env, wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def start_worker(*extra: str, may_exit: bool = False, **env: str) -> Child:
    return processes.start_worker(
        "--threads", "2", "--poll-interval", "0.05", *extra, may_exit=may_exit, **env
    )


def running(job_id: str) -> bool:
    return Job.objects.filter(pk=job_id, status="running").exists()


def test_term_lets_a_job_shorter_than_the_timeout_finish_once():
    result = tasks.record.enqueue(label="short", sleep=1.0)
    with start_worker("--shutdown-timeout", "20") as worker:
        wait_for(lambda: running(result.id), message="the job to start")
        worker.signal(signal.SIGTERM)
        worker.signal(signal.SIGTERM)  # a repeated TERM does not cut the drain short
        assert worker.wait(timeout=30) == 0, worker.output
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert Execution.objects.filter(label="short").count() == 1
    assert not Process.objects.exists()
    # Started again, a worker finds nothing to re-run.
    with start_worker("--stop-when-empty", may_exit=True) as again:
        assert again.wait(timeout=30) == 0
    assert Execution.objects.filter(label="short").count() == 1


def left_with_the_ended_process(job_id: str) -> bool:
    """The job still runs for a process that ended while its thread ran it: no one gives it
    back until that process is surely gone."""
    job = Job.objects.get(pk=job_id)
    owner = Process.objects.filter(pk=job.owner).first()
    return job.status == "running" and owner is not None and owner.metadata.get("leaving") is True


def taken_back_and_run_once(result, label: str) -> None:
    """Another worker prunes the ended one once its heartbeat is old enough, and runs the job
    again: once, and uncharged for the stop."""
    with start_worker() as again:
        wait_for(
            lambda: Job.objects.get(pk=result.id).status == "successful",
            timeout=30,
            message="the job to be taken back and run again",
        )
        again.signal(signal.SIGTERM)
        assert again.wait(timeout=30) == 0, again.output
    assert "action=process_pruned" in again.output
    result.refresh()
    assert result.attempts == 2
    assert result.errors == []  # a stop is not a failed attempt
    assert Execution.objects.filter(label=label).count() == 1
    assert not Process.objects.exists()


def test_term_past_the_timeout_never_gives_back_a_job_its_thread_may_still_run():
    result = tasks.record.enqueue(label="long", sleep=3.0)
    with start_worker("--shutdown-timeout", "0.5") as worker:
        wait_for(lambda: running(result.id), message="the job to start")
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output
    assert left_with_the_ended_process(result.id)
    assert "action=jobs_released" not in worker.output
    # The abandoned thread died with its process: it never recorded an execution.
    assert Execution.objects.filter(label="long").count() == 0
    taken_back_and_run_once(result, "long")


def test_quit_ends_at_once_and_leaves_running_jobs_to_whoever_prunes_it():
    result = tasks.record.enqueue(label="quit", sleep=30)
    with start_worker("--shutdown-timeout", "60") as worker:
        wait_for(lambda: running(result.id), message="the job to start")
        worker.signal(signal.SIGQUIT)
        assert worker.wait(timeout=15) == 0, worker.output
    assert left_with_the_ended_process(result.id)
    Job.objects.filter(pk=result.id).update(kwargs={"label": "quit", "sleep": 0})
    taken_back_and_run_once(result, "quit")


def test_a_second_ctrl_c_stops_at_once_as_the_first_one_says():
    result = tasks.record.enqueue(label="interrupted", sleep=30)
    with start_worker("--shutdown-timeout", "60") as worker:
        wait_for(lambda: running(result.id), message="the job to start")
        worker.signal(signal.SIGINT)
        wait_for(
            lambda: "Press Ctrl-C again to stop now" in worker.output,
            message="the first Ctrl-C to say how to stop now",
        )
        assert "Stopping: waiting up to 60 s for 1 running job to finish." in worker.output
        assert worker.process.poll() is None  # draining
        worker.signal(signal.SIGINT)
        assert worker.wait(timeout=15) == 0, worker.output
    # As QUIT: the job its thread was running goes back once the process has ended.
    assert left_with_the_ended_process(result.id)
    Job.objects.filter(pk=result.id).update(kwargs={"label": "interrupted", "sleep": 0})
    taken_back_and_run_once(result, "interrupted")


def test_stop_when_empty_drains_and_exits():
    results = [tasks.add.enqueue(i, i) for i in range(20)]
    with start_worker("--stop-when-empty", may_exit=True) as worker:
        assert worker.wait(timeout=30) == 0, worker.output
    for result in results:
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL


@pytest.mark.parametrize(("threads", "max_jobs"), [(1, 2), (4, 3)])
def test_max_jobs_runs_that_many_jobs_whatever_the_threads_then_exits_4(threads, max_jobs):
    for number in range(10):
        tasks.record.enqueue(label=f"job-{number}", sleep=0.05)
    with start_worker(
        "--threads", str(threads), "--max-jobs", str(max_jobs), may_exit=True
    ) as worker:
        assert worker.wait(timeout=30) == 4, worker.output
    assert Execution.objects.count() == max_jobs
    assert Job.objects.filter(status="successful").count() == max_jobs
    assert Job.objects.filter(status="ready").count() == 10 - max_jobs
    assert "action=worker_recycling process=" in worker.output
    assert f"reason=max_jobs jobs_done={max_jobs}" in worker.output


@pytest.mark.any_database
@pytest.mark.parametrize("args", [("--help",), ("work", "--help")])
def test_help_works(args):
    with Child("queue", *args) as child:
        assert child.wait() == 0
    assert "usage:" in child.output


@pytest.mark.any_database
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("work", "--threads", "0"), "'0' must be at least 1"),
        (("work", "--threads", "many"), "'many' is not a whole number"),
        (("work", "--queues", "bad name"), "may contain only ASCII letters"),
        (("work", "--poll-interval", "0"), "'0' must be between 0.01 and 3600 seconds"),
        (("work", "--threads", "5000"), "'5000' must be at most 1000"),
        (("work", "--backend", "nope"), "TASKS['nope'] cannot be loaded"),
        (("work", "--backend", "immediate"), "not stalwart.backend.StalwartBackend"),
        (("frobnicate",), "invalid choice: 'frobnicate'"),
        ((), "the following arguments are required: SUBCOMMAND"),
    ],
)
def test_bad_arguments_fail_clearly(args, message):
    with Child("queue", *args) as child:
        assert child.wait() != 0
    assert message in child.output
    assert "Traceback" not in child.output


def test_a_standalone_worker_prunes_dead_processes_and_runs_their_jobs():
    from datetime import timedelta

    from django.db.models import F

    from stalwart.jobs import JobStore
    from stalwart.processes.registry import Registration
    from stalwart.queues import QueueSelector

    dead = Registration("default", kind="worker", name="worker-gone-1", supervisor=None)
    dead.register({})
    result = tasks.record.enqueue(label="orphan")
    JobStore("default").claim(
        owner=dead.id, worker_name=dead.name, selector=QueueSelector.parse("*"), limit=1
    )
    Process.objects.filter(pk=dead.id).update(
        last_heartbeat_at=F("last_heartbeat_at") - timedelta(seconds=60)
    )
    with start_worker(STALWART_HEARTBEAT="0.25", STALWART_ALIVE="2") as worker:
        wait_for(
            lambda: Job.objects.get(pk=result.id).status == "successful",
            timeout=30,
            message="the orphaned job to run",
        )
        worker.signal(signal.SIGTERM)
        assert worker.wait(timeout=30) == 0, worker.output
    assert "action=process_pruned process=worker-gone-1" in worker.output
    assert not Process.objects.exists()


def test_invalid_configuration_stops_start_up_naming_the_setting():
    with Child(
        "queue", "supervise", env=child_env(STALWART_HEARTBEAT="10", STALWART_ALIVE="5")
    ) as child:
        assert child.wait(timeout=60) != 0
    assert "TASKS['default']['OPTIONS']['process_alive_threshold'] (5 s) is too short" in (
        child.output
    )
    assert not Process.objects.exists()
