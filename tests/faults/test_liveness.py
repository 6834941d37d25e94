"""Never kill healthy work, never loop a job (issue 18, items 1 to 4).

- A job that takes its worker down (it holds the GIL past the kill deadline, it grows past
  ``max_memory_mb``) is charged for it, and ends; a job beside it runs alone and finishes.
- Application code never holds up the loop that proves a worker alive: a task module slow
  to import, a ``task_finished`` receiver slow to return.
- A database slow to answer heartbeats (but answering) kills no worker; settings under which
  a slow one would are refused, naming the values that hold.

Each scenario bounds the claims: no job is claimed more than ``max_attempts +
max_interruptions`` times.
"""

import json
import time

from stalwart.models import Job
from tests.faults.hooks import SLOW_RECEIVER
from tests.faults.target import ALIAS, ALIVE
from tests.faults.workload import all_finished, ledger_jobs, successful, watch_tree
from tests.testapp import slow_import, tasks

MAX_INTERRUPTIONS = 10  # the tests' settings


def rows(ids: list[str]) -> dict[str, Job]:
    return {str(job.id): job for job in Job.objects.using(ALIAS).filter(pk__in=ids)}


def check_claims_bounded(scenario, ids: list[str]) -> None:
    for job_id, job in rows(ids).items():
        scenario.expect(
            job.attempt <= job.max_attempts + MAX_INTERRUPTIONS,
            f"job {job_id} was claimed {job.attempt} times (max_attempts {job.max_attempts})",
        )


def check_uncharged(scenario, ids: list[str]) -> None:
    for job_id, job in rows(ids).items():
        scenario.expect(
            not job.errors,
            f"innocent job {job_id} was charged: {[e['exception_class_path'] for e in job.errors]}",
        )


def test_a_job_holding_the_gil_is_charged_and_its_neighbour_finishes(pg):
    # 3.3 s of GIL: a heartbeat goes out just before or just after the kill deadline (3.5 s
    # after the last one): the attempt either survives, or is ended by the kernel and charged.
    poison = pg.target.enqueue(tasks.ledger_holding_the_gil, seconds=3.3).id
    Job.objects.using(ALIAS).filter(pk=poison).update(max_attempts=3)
    neighbour = ledger_jobs(pg, 1, 2.0, scaled=False)
    started = time.monotonic()
    supervisor = pg.fleet.supervise("--processes", "1", "--threads", "2", children=3)
    pg.recover(
        all_finished([poison, *neighbour]),
        since=started,
        bound=60,
        what="the GIL holder to end (charged, or done) and its neighbour to finish",
    )
    check_claims_bounded(pg, [poison, *neighbour])
    check_uncharged(pg, neighbour)
    job = rows([poison])[poison]
    if job.status == "failed":
        pg.expect(
            [e["exception_class_path"] for e in job.errors]
            == ["stalwart.exceptions.ProcessDied"] * 3,
            f"the GIL holder failed with {job.errors!r}, not 3 deaths charged to it",
        )
    pg.stop(supervisor)
    pg.conclude({poison: job.status, **successful(neighbour)}, reruns=True)


def test_a_job_over_the_memory_limit_is_charged_and_its_neighbour_finishes(pg):
    hog = pg.target.enqueue(tasks.ledger_hog, megabytes=300, seconds=20).id
    Job.objects.using(ALIAS).filter(pk=hog).update(max_attempts=2)
    neighbour = ledger_jobs(pg, 1, 1.0, scaled=False)
    started = time.monotonic()
    supervisor = pg.fleet.supervise(
        "--processes", "1", "--threads", "2", "--max-memory-mb", "250", children=3
    )
    pg.recover(
        all_finished([hog, *neighbour]),
        since=started,
        bound=45,
        what="the memory hog to be failed and its neighbour to finish",
    )
    check_claims_bounded(pg, [hog, *neighbour])
    check_uncharged(pg, neighbour)
    job = rows([hog])[hog]
    pg.expect(
        len(job.errors) == 2 and all("max_memory_mb" in e["traceback"] for e in job.errors),
        f"the hog's errors do not say its memory ended its worker: {job.errors!r}",
    )
    pg.stop(supervisor)
    pg.conclude({hog: "failed", **successful(neighbour)}, reruns=True)


def test_a_task_module_slow_to_import_holds_up_no_heartbeat(pg):
    supervisor = pg.fleet.supervise(
        "--processes",
        "1",
        "--threads",
        "2",
        children=3,
        timeout=60,
        STALWART_TASK_MODULES=json.dumps([slow_import.__name__]),
        STALWART_SLOW_IMPORT=str(ALIVE * 1.5),  # past the kill deadline
    )
    tree = pg.fleet.os_children(supervisor)
    started = time.monotonic()
    ids = [pg.target.enqueue(slow_import.slowly_imported, seconds=0.5).id]
    ids += ledger_jobs(pg, 4, 0.5, scaled=False)
    pg.recover(all_finished(ids), since=started, bound=15, what="every job to finish")
    watch_tree(pg, supervisor, before=tree, since=started)
    check_uncharged(pg, ids)
    pg.stop(supervisor)
    pg.conclude(successful(ids))


def test_a_slow_task_finished_receiver_holds_up_no_heartbeat(pg):
    supervisor = pg.fleet.supervise(
        "--processes",
        "1",
        "--threads",
        "2",
        children=3,
        **{SLOW_RECEIVER: str(ALIVE * 1.5)},  # past the kill deadline
    )
    tree = pg.fleet.os_children(supervisor)
    started = time.monotonic()
    quick = ledger_jobs(pg, 1, 0.1, scaled=False)
    unrelated = ledger_jobs(pg, 1, ALIVE * 2, scaled=False)
    pg.recover(all_finished(quick + unrelated), since=started, bound=ALIVE * 4, what="both jobs")
    watch_tree(pg, supervisor, before=tree, since=started)
    check_uncharged(pg, quick + unrelated)
    pg.stop(supervisor, timeout=60)
    pg.expect(
        "action=signal_receiver_slow" in supervisor.output and "hooks.py" in supervisor.output,
        "the slow receiver was not named in a warning",
    )
    pg.conclude(successful(quick + unrelated))


SLOW_HEARTBEATS = """
CREATE FUNCTION slow_heartbeat() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_sleep({seconds});
    RETURN NEW;
END $$;
CREATE TRIGGER slow_heartbeat BEFORE UPDATE ON stalwart_process
    FOR EACH ROW EXECUTE FUNCTION slow_heartbeat();
"""


def test_a_database_slow_to_answer_heartbeats_kills_no_worker(pg, cluster):
    # Each heartbeat takes 0.7 s (well inside the statement timeout).
    cluster.execute(SLOW_HEARTBEATS.format(seconds=0.7), dbname=pg.target.name)
    # Settings under which one failed beat and a slow one outlive the kill deadline are
    # refused, with the values that hold...
    refused = pg.fleet.start("queue", "supervise", STALWART_HEARTBEAT="2", STALWART_ALIVE="6")
    pg.expect(refused.wait(timeout=60) != 0, "queue supervise started with 2 s / 6 s")
    pg.expect(
        "Safe values: process_alive_threshold 6.667 s or more" in refused.output,
        f"the refusal does not name the safe values:\n{refused.output[-2000:]}",
    )
    # ...and under the values that hold, the slow database slows the tree, kills nothing.
    supervisor = pg.fleet.supervise(
        "--processes",
        "1",
        "--threads",
        "2",
        children=3,
        timeout=60,
        STALWART_HEARTBEAT="2",
        STALWART_ALIVE="6.667",
    )
    tree = pg.fleet.os_children(supervisor)
    started = time.monotonic()
    ids = ledger_jobs(pg, 1, 12.0, scaled=False) + ledger_jobs(pg, 6, 0.5, scaled=False)
    pg.recover(all_finished(ids), since=started, bound=40, what="every job to finish")
    watch_tree(pg, supervisor, before=tree, since=started)
    check_uncharged(pg, ids)
    for job_id, job in rows(ids).items():
        pg.expect(job.attempt == 1, f"job {job_id} ran {job.attempt} times")
    pg.stop(supervisor, timeout=60)
    pg.conclude(successful(ids))


def test_a_rolling_deploy_fails_no_job_of_a_task_the_old_workers_lack(pg):
    """A task added in the new release, enqueued while a worker still runs the old code: the
    old worker gives the job back for later, uncharged; the new worker runs it, once."""
    old = pg.fleet.work("--threads", "2")  # the old release: no such task module
    job = pg.target.enqueue(slow_import.slowly_imported, seconds=0.2).id
    pg.wait(
        lambda: (
            "action=task_not_found_deferred" in old.output
            and rows([job])[job].status == "scheduled"
        ),
        timeout=15,
        what="the old worker to put the job back for later",
    )
    started = time.monotonic()
    new = pg.fleet.work("--threads", "2", STALWART_TASK_MODULES=json.dumps([slow_import.__name__]))
    pg.recover(
        all_finished([job]), since=started, bound=ALIVE * 20, what="the new worker to run it"
    )
    row = rows([job])[job]
    pg.expect(
        (row.errors, row.interruptions) == ([], []),
        f"the job was charged or interrupted: {row.errors!r} {row.interruptions!r}",
    )
    pg.stop(old)
    pg.stop(new)
    pg.conclude(successful([job]))
