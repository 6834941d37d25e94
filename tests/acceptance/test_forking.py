"""What a supervisor's children inherit across the fork: no pooled connection, no thread.

Real ``queue supervise`` processes, real forks: a child must build its own connection pool
(Django's ``OPTIONS["pool"]``), and work whatever threads ran in the supervisor when it
forked. Every process started is reaped; every wait is bounded.
"""

import signal

import psutil
import pytest
from django.db import connection
from django.db.models import Count
from django.tasks import TaskResultStatus

from stalwart import Call, enqueue_many
from stalwart.models import Job, Process
from tests.acceptance.supervision import start_supervisor
from tests.helpers import Child, wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TROUBLE = ("action=process_fenced", "action=process_pruned", "action=process_exited")


def start(reaped: list[Child], *args: str, children: int, **env: str) -> Child:
    """Start a supervisor (reaped whatever happens) and wait for its ``children``."""
    supervisor = start_supervisor(*args, children=children, **env)
    reaped.append(supervisor)
    return supervisor


def drain_and_stop(child: Child, count: int) -> None:
    wait_for(
        lambda: Job.objects.filter(status="successful").count() == count,
        timeout=90,
        message=f"{count} jobs to succeed",
    )
    child.signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 0, child.output
    assert not Process.objects.exists()
    assert not Job.objects.exclude(status="successful").exists()
    for trouble in TROUBLE:
        assert trouble not in child.output, child.output


def test_children_of_a_supervisor_with_django_connection_pool_build_their_own(reaped):
    if connection.vendor != "postgresql":
        pytest.skip("Django's connection pool is PostgreSQL's")
    child = start(
        reaped, "--processes", "3", "--threads", "2", children=5, STALWART_TEST_POOL="true"
    )
    probes = [tasks.connection_pool_state.enqueue() for _ in range(3)]
    results = enqueue_many(tasks.record, [Call(label="pooled") for _ in range(600)])
    drain_and_stop(child, len(results) + len(probes))
    for probe in probes:
        probe.refresh()
        assert probe.status == TaskResultStatus.SUCCESSFUL
        # The job threads really took their connections from a pool, and only they did: the
        # queue's own sessions (main loop, heartbeat, LISTEN) bypass it.
        assert probe.return_value["pooled"] is True
        assert 1 <= probe.return_value["requests"] <= 2, probe.return_value
    per_job = Execution.objects.values("job_id").annotate(n=Count("id"))
    assert sorted({row["n"] for row in per_job}) == [1]
    assert per_job.count() == len(results)
    # Three workers shared the work, each through its own pool.
    assert Execution.objects.values("pid").distinct().count() == 3


def test_a_pool_the_supervisors_own_thread_uses_is_not_shared_with_its_children(reaped):
    if connection.vendor != "postgresql":
        pytest.skip("Django's connection pool is PostgreSQL's")
    # A library's thread in the supervisor takes pooled connections and gives them back
    # all the time, so a pool is open (and may be reopened) whenever the supervisor forks.
    child = start(
        reaped,
        "--processes",
        "3",
        "--threads",
        "2",
        children=5,
        STALWART_TEST_POOL="true",
        STALWART_TEST_BACKGROUND_THREAD="database",
    )
    workers = list(Process.objects.filter(kind="worker").values_list("pid", flat=True))
    # Replacements are forked while the thread keeps using the pool.
    for pid in workers[:2]:
        psutil.Process(pid).kill()
        wait_for(
            lambda pid=pid: (
                not Process.objects.filter(pid=pid).exists()
                and Process.objects.filter(kind="worker").count() == 3
            ),
            timeout=30,
            message="a replacement worker",
        )
    probes = [tasks.background_thread_state.enqueue() for _ in range(3)]
    results = enqueue_many(tasks.record, [Call(label="shared") for _ in range(300)])
    wait_for(
        lambda: Job.objects.filter(status="successful").count() == len(results) + len(probes),
        timeout=90,
        message="every job to succeed",
    )
    child.signal(signal.SIGTERM)
    assert child.wait(timeout=30) == 0, child.output
    assert "action=process_fenced" not in child.output
    assert "action=process_pruned" not in child.output
    assert not Process.objects.exists()
    for probe in probes:
        probe.refresh()
        assert probe.return_value["lock"] is True
        assert probe.return_value["ticking"] is True  # its own thread, on its own pool
    assert Execution.objects.filter(label="shared").count() == len(results)


def test_a_supervisor_running_a_thread_forks_children_that_work(reaped):
    child = start(
        reaped,
        "--processes",
        "2",
        "--threads",
        "2",
        children=4,
        STALWART_TEST_BACKGROUND_THREAD="true",
    )
    assert psutil.Process(child.pid).num_threads() >= 2  # the ticker ran when it forked
    workers = set(Process.objects.filter(kind="worker").values_list("pid", flat=True))
    probes = [tasks.background_thread_state.enqueue() for _ in range(4)]
    results = enqueue_many(tasks.record, [Call(label="threaded") for _ in range(40)])
    drain_and_stop(child, len(results) + len(probes))
    for probe in probes:
        probe.refresh()
        state = probe.return_value
        # Each child restarted the library's thread (os.register_at_fork) and can take its
        # lock, although the supervisor's thread may have held it at the fork.
        assert state == {"pid": state["pid"], "lock": True, "ticking": True}
        assert state["pid"] in workers
    assert Execution.objects.filter(label="threaded").count() == len(results)
