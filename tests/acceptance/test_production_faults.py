"""What production does to a supervised tree, done for real: sessions terminated, answers
late and links cut, a main loop stuck, a poison job among innocent ones, a claim left by a
crash, grandchildren, a table gone, a task that holds the GIL.

Each test fails on a queue that does not survive it; each wait is bounded and polls, and
every process is reaped (the ``reaped`` fixture kills whole trees).
"""

import itertools
import os
import re
import sqlite3
import time
from collections import Counter
from pathlib import Path

import psutil
import pytest
from django.db import OperationalError, connection, connections

from stalwart import Call, enqueue_many
from stalwart.models import Job, Process
from tests.acceptance.supervision import gone, owner_pid, running, start_supervisor, stop
from tests.helpers import Child, child_env, wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ALIVE = float(os.environ.get("STALWART_ALIVE", "5"))  # the suite's alive threshold


def children_of(supervisor: Child) -> dict[str, int]:
    row = Process.objects.get(pid=supervisor.pid, kind="supervisor")
    return dict(Process.objects.filter(supervisor=row.id).values_list("name", "pid"))


def hold(seconds: float, still_fine, message: str) -> None:
    """Watch for ``seconds`` that ``still_fine()`` stays true (holding a fault open)."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        assert still_fine(), message
        time.sleep(0.1)  # a watch over a fixed span, not a synchronisation


def lines_per_pid(output: str, action: str) -> Counter:
    return Counter(re.findall(rf" (\d+) \w+ stalwart action={action}\b", output))


def outage_events(output: str) -> dict[str, list[str]]:
    """Each process's outage events (unavailable, recovered), in the order it logged them."""
    found: dict[str, list[str]] = {}
    pattern = r" (\d+) \w+ stalwart action=(database_unavailable|database_recovered)\b"
    for pid, action in re.findall(pattern, output):
        found.setdefault(pid, []).append(action)
    return found


def assert_gone_before_retaken(pid: int, job_id: str, *, timeout: float) -> None:
    """Wait for the job to be taken again (its attempt 2), and check that its worker
    ``pid`` was gone by then. Read in the order the events must happen: the job retaken,
    then (just after that read) whether its worker is gone. Polled apart, two conditions
    seen in one round would be stamped in the order of the polls, not of the events."""
    deadline = time.monotonic() + timeout
    while True:
        retaken = Job.objects.get(pk=job_id).attempt >= 2
        died = gone(pid)
        if retaken:
            assert died, "the job was taken while its worker was still alive"
            return
        assert time.monotonic() < deadline, f"the job was not taken again within {timeout} s"
        time.sleep(0.005)  # polling the two conditions


@pytest.fixture
def postgresql(vendor):
    if vendor != "postgresql":
        pytest.skip(
            "the link's faults are injected through psycopg (SQLite is a file; MySQL's "
            "sessions are terminated by the test above)"
        )


# 1: a restart or a failover ends every session --------------------------------------------


def terminate_every_other_session() -> int:
    """End every other session on the test database, as a restart or a failover does."""
    with connection.cursor() as cursor:
        if connection.vendor != "mysql":
            cursor.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0]
        cursor.execute(
            "SELECT id FROM information_schema.PROCESSLIST "
            "WHERE db = DATABASE() AND id <> CONNECTION_ID()"
        )
        killed = 0
        for (session,) in cursor.fetchall():
            try:
                cursor.execute(f"KILL CONNECTION {int(session)}")
                killed += 1
            except OperationalError:
                pass  # it ended on its own meanwhile (1094, unknown thread id)
        return killed


def test_terminating_every_session_never_stops_a_healthy_tree(reaped, vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite has no sessions to terminate (it is a file)")
    supervisor = start_supervisor("--processes", "2", children=4)
    reaped.append(supervisor)
    before = children_of(supervisor)
    assert terminate_every_other_session() >= 5  # the supervisor's and each child's, at least
    hold(
        2 * ALIVE,
        lambda: supervisor.process.poll() is None and children_of(supervisor) == before,
        "the tree changed after its sessions were terminated",
    )
    results = enqueue_many(tasks.add, [Call(n, n) for n in range(20)])
    wait_for(
        lambda: Job.objects.filter(status="successful").count() == len(results),
        timeout=20,
        message="jobs enqueued after the outage to run",
    )
    assert stop(supervisor) == 0, supervisor.output
    output = supervisor.output
    assert "action=process_fenced" not in output
    for action in ("database_unavailable", "heartbeat_failed"):
        assert max(lines_per_pid(output, action).values(), default=0) <= 1, output


# 3: a late answer, then a cut link: the worker is gone before its job is taken ------------


def test_a_worker_whose_heartbeat_answers_late_is_gone_before_its_job_is_taken(
    reaped, postgresql, tmp_path
):
    flag = tmp_path / "late"
    supervisor = start_supervisor(
        "--processes",
        "2",
        "--threads",
        "1",
        children=4,
        STALWART_FAULT_LATE_HEARTBEAT=f"{flag}:{ALIVE * 0.6}",
    )
    reaped.append(supervisor)
    result = tasks.record.enqueue(label="late", sleep=ALIVE * 4)
    wait_for(lambda: running(result.id), message="the job to start")
    slow = owner_pid(result.id)
    flag.write_text(str(slow))
    assert_gone_before_retaken(slow, result.id, timeout=6 * ALIVE)
    stop(supervisor, timeout=6 * ALIVE)


# 4: a stuck main loop is a dead process ------------------------------------------------------


def test_a_worker_whose_main_loop_is_stuck_ends_and_is_replaced_charging_nobody(reaped, tmp_path):
    flag = tmp_path / "stuck"
    supervisor = start_supervisor(
        "--processes", "1", "--threads", "1", children=3, STALWART_FAULT_STUCK_LOOP=str(flag)
    )
    reaped.append(supervisor)
    stuck = next(pid for name, pid in children_of(supervisor).items() if "worker" in name)
    first = tasks.record.enqueue(label="stuck", sleep=0.5)
    wait_for(lambda: running(first.id), message="the job to start")
    # Its next statement hangs: no heartbeat vouches for its loop any more, and the kernel
    # ends it before it may be taken for dead.
    flag.write_text(str(stuck))
    wait_for(lambda: gone(stuck), timeout=4 * ALIVE, message="the stuck worker to end")
    flag.unlink()
    wait_for(
        lambda: Job.objects.get(pk=first.id).status == "successful",
        timeout=4 * ALIVE,
        message="the replacement to run the job again",
    )
    assert stop(supervisor) == 0, supervisor.output
    assert "action=process_stalled" in supervisor.output
    assert f'pid={stuck} how="was killed by SIGALRM"' in supervisor.output
    # The stall was the queue's, not the job's: given back free, said why.
    job = Job.objects.get(pk=first.id)
    assert (job.errors, job.attempt) == ([], 2)
    assert "its main loop" in job.interruptions[0]["cause"]


def test_a_log_handler_that_blocks_never_stalls_a_worker(reaped, tmp_path):
    flag = tmp_path / "blocked"
    supervisor = start_supervisor(
        "--processes", "1", "--threads", "2", children=3, STALWART_FAULT_BLOCKING_LOG=str(flag)
    )
    reaped.append(supervisor)
    worker = next(pid for name, pid in children_of(supervisor).items() if "worker" in name)
    flag.write_text(str(worker))  # from now on, its log handler blocks
    try:
        results = [tasks.add.enqueue(n, n) for n in range(20)]
        started = time.monotonic()
        while time.monotonic() < started + 2 * ALIVE:  # past any deadline it could miss
            assert not gone(worker), "the worker ended while its log handler was blocked"
            time.sleep(0.2)  # watching the worker for a stated time, not synchronising
        for result in results:
            assert Job.objects.get(pk=result.id).status == "successful"
    finally:
        flag.unlink()
    assert stop(supervisor) == 0, supervisor.output
    assert not Job.objects.exclude(attempt=1).exists()


# 11: a poison job fails alone -----------------------------------------------------------------


def test_a_poison_job_fails_alone_and_its_batch_mates_succeed(reaped):
    supervisor = start_supervisor("--processes", "1", "--threads", "4", children=3)
    reaped.append(supervisor)
    poison = tasks.exit_at_once.enqueue()
    Job.objects.filter(pk=poison.id).update(max_attempts=3)
    innocent = enqueue_many(tasks.record, [Call(label="innocent", sleep=1) for _ in range(3)])
    wait_for(
        lambda: not Job.objects.exclude(status__in=["successful", "failed"]).exists(),
        timeout=60,
        message="every job to end",
    )
    assert stop(supervisor) == 0, supervisor.output
    for result in innocent:
        job = Job.objects.get(pk=result.id)
        assert (job.status, job.errors) == ("successful", []), job.errors
    assert Execution.objects.filter(label="innocent").count() == 3
    job = Job.objects.get(pk=poison.id)
    assert job.status == "failed"
    assert [error["exception_class_path"] for error in job.errors] == [
        "stalwart.exceptions.ProcessDied"
    ] * 3


# 6: no job stays running for want of a dispatcher --------------------------------------------


def test_a_supervisor_without_dispatchers_takes_back_orphaned_claims(reaped):
    supervisor = start_supervisor("--dispatchers", "0", "--processes", "1", children=2)
    reaped.append(supervisor)
    result = tasks.add.enqueue(20, 22)
    # A claim whose process row is gone, as a crash between the two would leave.
    Job.objects.filter(pk=result.id).update(status="running", owner=987_654, attempt=1)
    wait_for(
        lambda: Job.objects.get(pk=result.id).status == "successful",
        timeout=4 * ALIVE,
        message="the orphaned job to be taken back and run",
    )
    assert stop(supervisor) == 0, supervisor.output
    assert "action=orphans_released" in supervisor.output


# 16: what a job starts does not outlive its worker ------------------------------------------


def grandchild(pidfile: Path) -> int:
    return int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), message="a pid"))


def test_a_grandchild_of_a_worker_that_dies_is_ended(reaped, tmp_path):
    supervisor = start_supervisor("--processes", "1", children=3)
    reaped.append(supervisor)
    pidfile = tmp_path / "sleep.pid"
    result = tasks.start_grandchild.enqueue(str(pidfile), then="die")
    Job.objects.filter(pk=result.id).update(max_attempts=1)
    sleeper = grandchild(pidfile)
    wait_for(lambda: gone(sleeper), timeout=10, message="the grandchild to be ended")
    assert stop(supervisor) == 0, supervisor.output


def test_grandchildren_end_with_a_stopped_supervisor_and_a_stopped_worker(reaped, tmp_path):
    supervisor = start_supervisor("--processes", "1", "--shutdown-timeout", "0.5", children=3)
    reaped.append(supervisor)
    first = tmp_path / "first.pid"
    tasks.start_grandchild.enqueue(str(first), then="sleep")
    sleeper = grandchild(first)
    assert stop(supervisor) == 0, supervisor.output
    wait_for(lambda: gone(sleeper), timeout=10, message="the supervisor's grandchild to end")

    connections.close_all()
    second = tmp_path / "second.pid"
    result = tasks.start_grandchild.enqueue(str(second), then="return")
    with Child("queue", "work", "--poll-interval", "0.05", env=child_env()) as worker:
        reaped.append(worker)
        wait_for(lambda: Job.objects.get(pk=result.id).status == "successful", message="job")
        left_behind = grandchild(second)
        worker.signal(15)
        assert worker.wait(timeout=30) == 0, worker.output
    wait_for(lambda: gone(left_behind), timeout=10, message="the worker's grandchild to end")


# 17: a database that refuses everything is waited out, not crash-looped --------------------


def test_a_missing_table_is_waited_out_inside_each_process(reaped):
    supervisor = start_supervisor("--processes", "1", children=3)
    reaped.append(supervisor)
    before = children_of(supervisor)
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE stalwart_job RENAME TO stalwart_job_away")
    try:
        hold(
            ALIVE,
            lambda: supervisor.process.poll() is None,
            "the supervisor ended while the table was missing",
        )
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE stalwart_job_away RENAME TO stalwart_job")
    results = enqueue_many(tasks.add, [Call(n, n) for n in range(5)])
    wait_for(
        lambda: Job.objects.filter(status="successful").count() == len(results),
        timeout=20,
        message="jobs to run once the table is back",
    )
    assert children_of(supervisor) == before  # nothing crashed, nothing was forked again
    assert stop(supervisor) == 0, supervisor.output
    output = supervisor.output
    assert "action=process_crashed" not in output
    assert "Traceback" not in output
    unavailable = lines_per_pid(output, "database_unavailable")
    assert unavailable, output  # the workers and the dispatcher noticed...
    # ...and each said so once per outage: never twice before its own statements worked
    # again. (The supervisor's heartbeat, on the process table, works while the job table
    # is away: its outage ends there, and its next look at jobs starts another.)
    for pid, events in outage_events(output).items():
        repeated = [a for a, b in itertools.pairwise(events) if a == b == "database_unavailable"]
        assert not repeated, f"process {pid} said so twice in one outage:\n{output}"


# 18: a task that holds the GIL cannot keep its process alive past its deadline -------------


def test_a_task_holding_the_gil_ends_its_process_before_its_job_is_taken(reaped):
    supervisor = start_supervisor("--processes", "2", "--threads", "1", children=4)
    reaped.append(supervisor)
    result = tasks.hold_the_gil.enqueue(int(ALIVE * 2))
    Job.objects.filter(pk=result.id).update(max_attempts=2)
    wait_for(lambda: running(result.id), message="the job to start")
    holder = owner_pid(result.id)
    assert_gone_before_retaken(holder, result.id, timeout=6 * ALIVE)
    wait_for(
        lambda: Job.objects.get(pk=result.id).status == "failed",
        timeout=6 * ALIVE,
        message="the job to fail at its cap",
    )
    assert stop(supervisor) == 0, supervisor.output
    assert f'pid={holder} how="was killed by SIGALRM"' in supervisor.output
    assert not psutil.pid_exists(holder) or gone(holder)


def test_a_supervisor_that_registered_again_still_cleans_up_after_its_children(reaped):
    supervisor = start_supervisor("--processes", "1", "--threads", "1", children=3)
    reaped.append(supervisor)
    old = Process.objects.get(pid=supervisor.pid, kind="supervisor").id
    # As a prune after a long outage would: its row is gone; its children live on.
    Process.objects.filter(pk=old).delete()
    new = wait_for(
        lambda: (
            Process.objects.filter(pid=supervisor.pid, kind="supervisor")
            .values_list("id", flat=True)
            .first()
        ),
        message="the supervisor to register again",
    )
    wait_for(lambda: Process.objects.filter(supervisor=new).count() == 3, message="children")
    result = tasks.record.enqueue(label="reaped", sleep=ALIVE * 4)
    wait_for(lambda: running(result.id), message="the job to start")
    killed = owner_pid(result.id)
    psutil.Process(killed).kill()
    wait_for(
        lambda: Job.objects.get(pk=result.id).attempt >= 2,
        timeout=ALIVE,  # reaped at once, not pruned once the threshold has passed
        message="the dead child's job to be taken back at once",
    )
    job = Job.objects.get(pk=result.id)
    assert "died: it was killed by SIGKILL" in job.errors[0]["traceback"]
    stop(supervisor, timeout=6 * ALIVE)


def test_a_long_application_write_on_sqlite_charges_no_running_job(reaped, vendor):
    if vendor != "sqlite":
        pytest.skip("SQLite's single writer: an application holding it stops every writer")
    supervisor = start_supervisor("--processes", "1", children=3)
    reaped.append(supervisor)
    result = tasks.record.enqueue(label="patient", sleep=ALIVE * 3)
    Job.objects.filter(pk=result.id).update(max_attempts=1)
    wait_for(lambda: running(result.id), message="the job to start")
    application = sqlite3.connect(connection.settings_dict["NAME"], timeout=30)
    try:
        application.execute("BEGIN IMMEDIATE")  # a migration rebuilding a table, say
        time.sleep(ALIVE + 2)  # holding the write lock past the alive threshold
    finally:
        application.rollback()
        application.close()
    try:
        wait_for(
            lambda: Job.objects.get(pk=result.id).status == "successful",
            timeout=10 * ALIVE,
            message="the job to run again and succeed",
        )
    except AssertionError as late:
        # Say what became of it, and what the tree logged (seen once under a full run).
        job = Job.objects.values("status", "attempt", "owner", "errors").get(pk=result.id)
        stop(supervisor)
        raise AssertionError(f"{late}\nthe job: {job}\nthe tree:\n{supervisor.output}") from None
    assert Job.objects.get(pk=result.id).errors == []
    assert stop(supervisor) == 0, supervisor.output
