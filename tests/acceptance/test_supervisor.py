"""``manage.py queue supervise``: real forks, real signals, real deaths.

Every wait is bounded and polls a condition; every process started is reaped (the ``Child``
helper kills the whole process group if a test fails). Each test ends by checking that the
process table is empty and no job is left claimed.
"""

import signal

import psutil
import pytest
from django.tasks import TaskResultStatus

from stalwart import Call, enqueue_many
from stalwart.db import Outcome
from stalwart.jobs import JobStore
from stalwart.models import Job, Process
from stalwart.serialization import dumps
from tests.acceptance.supervision import (
    assert_nothing_left_behind,
    executions_per_job,
    gone,
    owner_pid,
    running,
    start_supervisor,
    stop,
)
from tests.helpers import wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_worker_killed_mid_job_is_replaced_and_the_job_runs_again_exactly_once(reaped):
    supervisor = start_supervisor("--processes", "2", "--threads", "1", children=4)
    reaped.append(supervisor)
    result = tasks.record.enqueue(label="victim", sleep=2)
    wait_for(lambda: running(result.id), message="the job to start")
    victim = owner_pid(result.id)
    psutil.Process(victim).kill()

    wait_for(
        lambda: Job.objects.get(pk=result.id).status == "successful",
        timeout=30,
        message="the job to run again",
    )
    result.refresh()
    assert result.attempts == 2
    assert len(set(result.worker_ids)) == 2
    assert result.errors[0].exception_class_path == "stalwart.exceptions.ProcessDied"
    assert f"(pid {victim} " in result.errors[0].traceback
    assert "killed by SIGKILL" in result.errors[0].traceback
    assert Execution.objects.filter(label="victim").count() == 1
    # The dead worker was replaced: two live workers again.
    wait_for(lambda: Process.objects.filter(kind="worker").count() == 2, message="a replacement")
    assert stop(supervisor) == 0, supervisor.output
    assert "action=process_replaced" in supervisor.output
    assert_nothing_left_behind()


# 2 -------------------------------------------------------------------------------------------


def test_children_of_a_killed_supervisor_stop_on_their_own(reaped):
    supervisor = start_supervisor("--processes", "2", "--threads", "2", children=4)
    reaped.append(supervisor)
    children = list(Process.objects.exclude(kind="supervisor").values_list("pid", flat=True))
    results = enqueue_many(tasks.record, [Call(label="orphaned", sleep=0.5) for _ in range(8)])
    wait_for(lambda: Job.objects.filter(status="running").exists(), message="jobs to start")

    psutil.Process(supervisor.pid).kill()  # only the supervisor: its children live on...
    # ...until they notice, drain, and exit by themselves.
    wait_for(
        lambda: all(gone(pid) for pid in children),
        timeout=15,
        message="the orphaned children to exit",
    )
    # The dead supervisor's row is left; the next supervisor prunes it.
    assert Process.objects.filter(kind="supervisor").count() == 1
    successor = start_supervisor(
        "--processes", "1", children=3, STALWART_HEARTBEAT="0.25", STALWART_ALIVE="2"
    )
    reaped.append(successor)
    wait_for(
        lambda: not Process.objects.filter(pid=supervisor.pid).exists(),
        timeout=15,
        message="the dead supervisor to be pruned",
    )
    wait_for(
        lambda: Job.objects.filter(status="successful").count() == len(results),
        timeout=30,
        message="every job to succeed",
    )
    assert set(executions_per_job().values()) == {1}
    assert stop(successor) == 0, successor.output
    assert "action=process_pruned" in successor.output
    assert_nothing_left_behind()


def test_jobs_of_a_whole_dead_process_tree_are_released_by_the_next_supervisors_prune(reaped):
    supervisor = start_supervisor("--processes", "2", "--threads", "2", children=4)
    reaped.append(supervisor)
    results = enqueue_many(tasks.record, [Call(label="tree", sleep=1) for _ in range(4)])
    wait_for(lambda: Job.objects.filter(status="running").count() == 4, message="jobs to start")
    supervisor.kill()  # SIGKILL to the whole process group: nobody releases anything
    supervisor.wait()
    assert Job.objects.filter(status="running").count() == 4

    successor = start_supervisor(
        "--processes", "2", children=4, STALWART_HEARTBEAT="0.25", STALWART_ALIVE="2"
    )
    reaped.append(successor)
    wait_for(
        lambda: Job.objects.filter(status="successful").count() == len(results),
        timeout=30,
        message="the released jobs to run again",
    )
    assert set(executions_per_job().values()) == {1}
    assert set(Job.objects.values_list("attempt", flat=True)) == {2}
    assert stop(successor) == 0, successor.output
    assert successor.output.count("action=process_pruned") == 5  # 4 children and the supervisor
    assert_nothing_left_behind()


# 3 -------------------------------------------------------------------------------------------


def test_term_lets_short_jobs_finish_once(reaped):
    supervisor = start_supervisor("--processes", "2", "--threads", "2", children=4)
    reaped.append(supervisor)
    results = enqueue_many(tasks.record, [Call(label="short", sleep=1) for _ in range(4)])
    wait_for(lambda: Job.objects.filter(status="running").count() == 4, message="jobs to start")
    supervisor.signal(signal.SIGTERM)
    supervisor.signal(signal.SIGTERM)  # a second TERM does not cut the drain short
    assert supervisor.wait(timeout=30) == 0, supervisor.output
    assert Job.objects.filter(status="successful").count() == len(results)
    assert Execution.objects.filter(label="short").count() == 4
    assert_nothing_left_behind()


def test_term_releases_jobs_longer_than_the_timeout_and_they_run_once_after_restart(reaped):
    supervisor = start_supervisor(
        "--processes", "1", "--threads", "2", "--shutdown-timeout", "0.5", children=3
    )
    reaped.append(supervisor)
    results = enqueue_many(tasks.record, [Call(label="long", sleep=3) for _ in range(2)])
    wait_for(lambda: Job.objects.filter(status="running").count() == 2, message="jobs to start")
    assert stop(supervisor) == 0, supervisor.output
    assert Job.objects.filter(status="ready", attempt=1, owner=None).count() == 2
    assert Execution.objects.filter(label="long").count() == 0
    assert not Process.objects.exists()

    again = start_supervisor("--processes", "1", "--threads", "2", children=3)
    reaped.append(again)
    wait_for(
        lambda: Job.objects.filter(status="successful").count() == len(results),
        timeout=30,
        message="the released jobs to run",
    )
    assert stop(again) == 0, again.output
    assert set(executions_per_job().values()) == {1}
    assert set(Job.objects.values_list("attempt", flat=True)) == {2}
    assert_nothing_left_behind()


def test_quit_releases_running_jobs_and_exits_at_once(reaped):
    supervisor = start_supervisor("--processes", "1", "--shutdown-timeout", "60", children=3)
    reaped.append(supervisor)
    result = tasks.record.enqueue(label="quit", sleep=60)
    wait_for(lambda: running(result.id), message="the job to start")
    assert stop(supervisor, signal.SIGQUIT, timeout=15) == 0, supervisor.output
    assert Job.objects.get(pk=result.id).status == "ready"
    assert not Process.objects.exists()


def test_a_second_ctrl_c_stops_at_once_as_the_first_one_says(reaped):
    supervisor = start_supervisor("--processes", "1", "--shutdown-timeout", "60", children=3)
    reaped.append(supervisor)
    result = tasks.record.enqueue(label="interrupted", sleep=60)
    wait_for(lambda: running(result.id), message="the job to start")
    supervisor.signal(signal.SIGINT)
    wait_for(
        lambda: "Press Ctrl-C again to stop now" in supervisor.output,
        message="the first Ctrl-C to say how to stop now",
    )
    assert "waiting up to 60 s for the workers' running jobs to finish" in supervisor.output
    assert supervisor.process.poll() is None  # draining
    assert stop(supervisor, signal.SIGINT, timeout=45) == 0, supervisor.output
    # As QUIT: its worker ended at once, and the supervisor gave the job back.
    assert Job.objects.get(pk=result.id).status == "ready"
    assert not Process.objects.exists()


# 4 -------------------------------------------------------------------------------------------


def test_a_stalled_worker_is_pruned_its_job_runs_elsewhere_and_its_late_result_is_ignored(reaped):
    supervisor = start_supervisor(
        "--processes",
        "2",
        "--threads",
        "1",
        children=4,
        STALWART_HEARTBEAT="0.2",
        STALWART_ALIVE="2",
    )
    reaped.append(supervisor)
    result = tasks.record.enqueue(label="stalled", sleep=3)
    wait_for(lambda: running(result.id), message="the job to start")
    stale = Job.objects.get(pk=result.id)
    stalled = owner_pid(result.id)
    psutil.Process(stalled).suspend()  # SIGSTOP
    try:
        wait_for(
            lambda: not Process.objects.filter(pid=stalled).exists(),
            timeout=15,
            message="the stalled worker to be pruned",
        )
        wait_for(
            lambda: Job.objects.get(pk=result.id).attempt == 2,
            timeout=15,
            message="the job to be claimed again by the other worker",
        )
        # The stalled worker's late result, written as it would write it on waking: through
        # the worker's own outcome-writing statement, with its owner and attempt. While the
        # second attempt runs, it changes nothing...
        late_finish(stale, return_value=stalled)
        wait_for(
            lambda: Job.objects.get(pk=result.id).status == "successful",
            timeout=30,
            message="the job to run on the other worker",
        )
        # ...nor once that attempt has finished.
        late_finish(stale, return_value=stalled)
    finally:
        psutil.Process(stalled).resume()  # SIGCONT
    job = Job.objects.get(pk=result.id)
    assert (job.status, job.attempt) == ("successful", 2)
    second = Execution.objects.get(label="stalled", attempt=2)
    assert second.pid != stalled
    assert job.return_value == second.pid  # the result written is the second worker's
    wait_for(lambda: gone(stalled), timeout=15, message="the stale worker to stop")
    assert Job.objects.get(pk=result.id).return_value == second.pid
    assert 1 <= Execution.objects.filter(label="stalled").count() <= 2
    assert stop(supervisor) == 0, supervisor.output
    # Its heartbeat deadline passed while it was stopped: the kernel ended it on SIGCONT.
    assert f'pid={stalled} how="was killed by SIGALRM"' in supervisor.output, supervisor.output
    assert_nothing_left_behind()


def late_finish(stale: Job, *, return_value: int) -> None:
    """Write a successful outcome for ``stale``'s attempt, as its owner: nothing is written,
    and the job is left to its new attempt."""
    written = JobStore("default").finish(
        owner=stale.owner,
        outcomes=[
            Outcome(
                id=stale.id,
                attempt=stale.attempt,
                status="successful",
                return_value=dumps(return_value),
            )
        ],
    )
    assert written == {}
    job = Job.objects.get(pk=stale.id)
    assert job.attempt == stale.attempt + 1
    assert job.owner != stale.owner
    assert job.return_value != return_value


# 5 -------------------------------------------------------------------------------------------


def test_a_poison_job_is_failed_after_max_attempts_with_the_cause(reaped):
    supervisor = start_supervisor("--processes", "1", "--threads", "1", children=3)
    reaped.append(supervisor)
    poison = tasks.kill_own_process.enqueue()
    # The cap is stored with each job when it is enqueued (OPTIONS['max_attempts'], 5 by
    # default); this one gets 3.
    Job.objects.filter(pk=poison.id).update(max_attempts=3)
    wait_for(
        lambda: Job.objects.get(pk=poison.id).status == "failed",
        timeout=60,
        message="the poison job to be failed",
    )
    poison.refresh()
    assert poison.status == TaskResultStatus.FAILED
    assert poison.attempts == 3
    assert len(poison.errors) == 3
    assert all("killed by SIGKILL" in error.traceback for error in poison.errors)
    # The fleet is not crash-looping: the next job runs.
    fine = tasks.add.enqueue(2, 2)
    wait_for(
        lambda: Job.objects.get(pk=fine.id).status == "successful",
        timeout=30,
        message="a healthy job to run after the poison one",
    )
    assert stop(supervisor) == 0, supervisor.output
    # Replacements came with growing delays, not in a tight loop.
    delays = [
        line.split("delay=")[1].split()[0]
        for line in supervisor.output.splitlines()
        if "action=process_replaced" in line
    ]
    assert delays[:3] == ["0.5", "1", "2"]
    assert_nothing_left_behind()


# 6 -------------------------------------------------------------------------------------------


def test_two_supervisors_share_one_database(reaped):
    first = start_supervisor("--processes", "2", "--threads", "2", children=4)
    reaped.append(first)
    second = start_supervisor("--processes", "2", "--threads", "2", children=4)
    reaped.append(second)
    table = list(Process.objects.values_list("kind", flat=True))
    assert sorted(table) == sorted(
        ["supervisor"] * 2 + ["worker"] * 4 + ["dispatcher"] * 2 + ["scheduler"] * 2
    )

    results = enqueue_many(tasks.record, [Call(label="shared", sleep=0.01) for _ in range(300)])
    wait_for(
        lambda: Job.objects.filter(status="successful").count() == len(results),
        timeout=60,
        message="every job to succeed",
    )
    assert set(executions_per_job().values()) == {1}
    workers_used = set(Execution.objects.values_list("pid", flat=True))
    first_workers = set(
        Process.objects.filter(supervisor=Process.objects.get(pid=first.pid).id).values_list(
            "pid", flat=True
        )
    )
    assert workers_used & first_workers
    assert workers_used - first_workers

    assert stop(first) == 0, first.output
    more = enqueue_many(tasks.record, [Call(label="after", sleep=0) for _ in range(50)])
    wait_for(
        lambda: Job.objects.filter(status="successful").count() == len(results) + len(more),
        timeout=30,
        message="the remaining supervisor to run new jobs",
    )
    assert stop(second) == 0, second.output
    assert set(executions_per_job().values()) == {1}
    assert_nothing_left_behind()
