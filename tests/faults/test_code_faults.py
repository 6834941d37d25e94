"""Code the queue runs on others' behalf misbehaves: receivers, tasks, log handlers, and an
application transaction.

- A ``task_finished`` receiver that raises must not kill the worker nor strand a job (item 2).
- A poison job (``os._exit(3)``) must not fail the three innocent jobs claimed beside it
  (item 11).
- A task's own child process (``sleep 120``) must not outlive its worker (item 16).
- A worker whose main loop must wait (an application transaction holds a row it must write)
  must not hold jobs for ever while its heartbeat says it is alive (item 4): its jobs must
  get done. A log handler that blocks holds up no worker at all (issue 18).
"""

import contextlib
import os
import signal
import time

import psutil
import pytest

from stalwart import Call
from stalwart.models import Job
from tests.faults.fleet import alive
from tests.faults.hooks import BLOCKING_LOG, RAISING_RECEIVER
from tests.faults.target import ALIAS, ALIVE
from tests.faults.workload import (
    all_finished,
    ledger_jobs,
    owner_pid,
    running,
    successful,
    watch_tree,
)
from tests.testapp import tasks


def test_a_raising_task_finished_receiver(any_db):
    scenario = any_db
    supervisor = scenario.fleet.supervise(
        "--processes", "1", "--threads", "2", children=3, **{RAISING_RECEIVER: "1"}
    )
    tree = scenario.fleet.os_children(supervisor)
    started = time.monotonic()
    ids = ledger_jobs(scenario, 10, 0.1)
    scenario.recover(all_finished(ids), since=started, bound=10, what="every job to finish")
    watch_tree(scenario, supervisor, before=tree, since=started)
    errors = [
        (str(job), attempt, len(errs))
        for job, attempt, errs in Job.objects.using(ALIAS)
        .filter(pk__in=ids)
        .values_list("id", "attempt", "errors")
        if attempt != 1 or errs
    ]
    scenario.expect(
        not errors, f"jobs charged for a receiver's failure (id, attempt, errors): {errors}"
    )
    scenario.stop(supervisor)
    scenario.conclude(successful(ids))


def test_a_poison_job_beside_three_innocent_ones(any_db):
    scenario = any_db
    poison = scenario.target.enqueue(tasks.exit_at_once).id
    innocent = ledger_jobs(scenario, 3, 1.0, scaled=False)
    # Enqueued first, claimed together: one worker, four threads.
    started = time.monotonic()
    supervisor = scenario.fleet.supervise("--processes", "1", "--threads", "4", children=3)
    # The bound counts from before the supervisor starts: its start-up and its worker's, a
    # death of the four together, the innocents run alone (1 s each), and the poison's
    # deaths alone with the restart delays between them (0.5, 1, 2 s...). About 20 s on an
    # idle machine, 24 s while the other legs of scripts/test run beside it: three times
    # that is the bound (a hang, not a loaded machine, is what it catches).
    scenario.recover(
        all_finished([poison, *innocent]), since=started, bound=75, what="all four to end"
    )
    # The innocents ran again, alone, and were charged nothing for the poison's deaths.
    for job, errors in Job.objects.using(ALIAS).filter(pk__in=innocent).values_list("id", "errors"):
        scenario.expect(not errors, f"innocent job {job} was charged: {errors!r}")
    scenario.stop(supervisor)
    scenario.conclude({poison: "failed", **successful(innocent)}, reruns=True)


@pytest.mark.parametrize("ending", ["worker-killed", "supervisor-stopped"])
def test_a_tasks_child_process_dies_with_its_worker(any_db, ending):
    scenario = any_db
    supervisor = scenario.fleet.supervise("--processes", "1", "--threads", "1", children=3)
    job = scenario.target.enqueue(tasks.spawn_sleeper, seconds=30).id
    try:
        scenario.wait(scenario.ledger.spawned, timeout=15, what="the task's child")
        spawned = scenario.ledger.spawned()
        worker = owner_pid(job)
        if ending == "worker-killed" and worker:
            psutil.Process(worker).kill()
            scenario.wait(lambda: not alive(worker), timeout=5, what="the killed worker to be gone")
        else:
            scenario.stop(supervisor)
        ended = time.monotonic()
        scenario.recover(
            lambda: not any(alive(pid) for pid in spawned),
            since=ended,
            bound=5,
            what=f"the task's child process(es) {spawned} to end with their worker",
        )
        if supervisor.process.poll() is None:
            scenario.stop(supervisor)
        left = [pid for pid in scenario.ledger.spawned() if alive(pid)]
        scenario.expect(not left, f"processes started by tasks outlived the tree: {left}")
    finally:
        for pid in scenario.ledger.spawned():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    scenario.conclude({})


def test_an_application_transaction_holds_a_row_the_worker_must_write(pg, cluster):
    supervisor = pg.fleet.supervise("--processes", "1", "--threads", "4", children=3)
    victim = ledger_jobs(pg, 1, 1.0, scaled=False)
    pg.wait(running(victim, 1), timeout=15, what="the victim job to run")
    with cluster.session(pg.target.name) as session, session.transaction():
        # The application locks the victim's row: the worker's finish must wait for it.
        session.execute("SELECT 1 FROM stalwart_job WHERE id = %s FOR UPDATE", [victim[0]])
        held = time.monotonic()
        # Its body ends: the worker's main loop now writes the outcome, and waits on the lock.
        pg.wait(lambda: pg.ledger.ended_count() == 1, timeout=10, what="the victim to end")
        ids = ledger_jobs(pg, 4, 0.2, scaled=False)
        pg.recover(
            all_finished(ids),
            since=held,
            bound=ALIVE + 4,
            what="4 new jobs to run while an application transaction holds another job's row",
        )
        # Hold it a while more, then let go (the transaction ends with the block).
        while time.monotonic() < held + ALIVE + 4:
            time.sleep(0.2)  # holding the lock for a stated time
    pg.wait(all_finished(victim), timeout=10, what="the victim job to finish")
    pg.stop(supervisor)
    pg.conclude(successful(victim + ids), reruns=True)


def test_a_blocked_log_handler_never_stalls_a_worker(pg, workdir):
    """Log lines go to the handlers from a thread of their own: a handler that blocks (a log
    pipe nobody reads) holds up no loop, no heartbeat, no job."""
    flag = workdir / f"blocked-log-{pg.target.name}"
    supervisor = pg.fleet.supervise(
        "--processes", "2", "--threads", "2", children=4, **{BLOCKING_LOG: str(flag)}
    )
    tree = pg.fleet.os_children(supervisor)
    stuck = pg.fleet.family(supervisor)["worker"][0]
    flag.write_text(str(stuck))  # from now on, its log handler blocks
    try:
        started = time.monotonic()
        ids = ledger_jobs(pg, 20, 0.2)
        pg.recover(
            all_finished(ids),
            since=started,
            bound=10,
            what="every job to finish while one worker's log handler is blocked",
        )
        watch_tree(pg, supervisor, before=tree, since=started)
    finally:
        flag.unlink()
    pg.stop(supervisor)
    pg.conclude(successful(ids))


def test_bad_rows_inserted_by_hand(any_db):
    """Item 13: a task path is never imported from a row; item 14: arguments of the wrong
    shape fail at once, without retries."""
    scenario = any_db
    now = scenario.target.now()
    bad = {}
    for label, task_path, args, kwargs in [
        ("imports this", "this.s", [], {}),
        ("args is a dict", "tests.testapp.tasks.echo", {"surprise": 1}, {}),
        ("kwargs is a list", "tests.testapp.tasks.flaky", [], [1]),
    ]:
        row = scenario.target.enqueue(tasks.ledger)
        Job.objects.using(ALIAS).filter(pk=row.id).update(
            task_path=task_path, args=args, kwargs=kwargs, available_at=now
        )
        bad[row.id] = label
    good = scenario.target.enqueue_many(tasks.ledger, [Call(seconds=0.1)] * 3)
    # No grace for a task another release might have (a rolling deploy): these rows name
    # tasks no release has, and fail at once (test_rolling_deploys.py has the grace).
    worker = scenario.fleet.work("--threads", "2", STALWART_TASK_NOT_FOUND_GRACE="0")
    started = time.monotonic()
    scenario.recover(all_finished([*bad, *good]), since=started, bound=10, what="every row to end")
    for job, status, attempt, errors in (
        Job.objects.using(ALIAS)
        .filter(pk__in=list(bad))
        .values_list("id", "status", "attempt", "errors")
    ):
        label = bad[str(job)]
        scenario.expect(
            status == "failed" and attempt == 1 and len(errors) == 1,
            f"the row whose {label} ended {status} after {attempt} attempt(s) with "
            f"{len(errors)} error(s): it must fail at once, without retries",
        )
        if label == "imports this" and errors:
            scenario.expect(
                errors[0]["exception_class_path"].endswith("TaskNotFound"),
                f"task_path 'this.s' failed with {errors[0]['exception_class_path']}",
            )
    scenario.stop(worker)
    scenario.expect(
        "Beautiful is better than ugly" not in worker.output,
        "the worker imported the module 'this' named by a row (the Zen of Python was printed)",
    )
    scenario.conclude({**dict.fromkeys(bad, "failed"), **successful(good)})


@pytest.mark.parametrize("how", ["alarm", "setitimer"])
def test_a_task_that_changes_the_kernel_timer_is_named_and_the_timer_restored(pg, how):
    """``signal.alarm(0)`` would take away the kill deadline that ends a silent worker before
    anyone may prune it; a timer of the task's own would end the worker at its own time. The
    heartbeat finds either at its next beat, names the task, and sets the deadline back."""
    supervisor = pg.fleet.supervise("--processes", "1", "--threads", "1", children=3)
    job = pg.target.enqueue(tasks.change_the_kernel_timer, how=how).id
    pg.wait(all_finished([job]), timeout=20, what="the job to end")
    row = Job.objects.using(ALIAS).get(pk=job)
    pg.expect(
        isinstance(row.return_value, int) and row.return_value > 0,
        f"the kernel timer was not set back while the task waited ({row.status}, "
        f"returned {row.return_value!r})",
    )
    said = [
        line for line in supervisor.output.splitlines() if "action=kernel_timer_tampered" in line
    ]
    pg.expect(
        said and all("tests.testapp.tasks.change_the_kernel_timer" in line for line in said),
        f"no kernel_timer_tampered line naming the task: {said}",
    )
    pg.stop(supervisor)
    pg.conclude({job: "successful"})
