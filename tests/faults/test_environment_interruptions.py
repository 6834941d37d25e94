"""The queue's environment interrupts it: a poison job where no supervisor watches, the
database's sessions ended or the server restarted, and a death or an exit the counters must
still see (issue 18, items 6, 7 and 9).

- Item 6: a standalone ``queue work`` (no supervisor), restarted whenever it dies as a
  process manager would, runs a job that holds the GIL past the kernel's deadline beside two
  sleepers. Its deaths are seen only as prunes: the sleepers are isolated, not charged, and
  succeed; the poison alone is charged, and fails after ``max_attempts``; no job is claimed
  more than ``max_attempts + max_interruptions`` times.
- Item 7: jobs that each INSERT one row, under ``queue supervise``, while every session of
  the database is terminated twice, while the server restarts mid-drain, and after it
  restarted while the tree was idle: every job succeeds, once. A job cut mid-body is an
  interruption that says why; a job never starts on a connection that died.
- Item 9: a job failed by its worker's death counts in ``stalwart_jobs_failed_total``; a
  short command that enqueues and exits leaves its ``stalwart_jobs_enqueued_total``.
"""

import re
import time

from stalwart import Call
from tests.faults.manager import KeptRunning
from tests.faults.target import ALIVE
from tests.faults.workload import (
    all_finished,
    back_from_outage,
    backend_with,
    exposed_counters,
    insert_jobs,
    inserted_rows,
    jobs_by_id,
    some_ended,
    stored_counters,
    successful,
    watch_tree,
)
from tests.testapp import tasks

# -- item 6: a poison job without a supervisor ------------------------------------------------

# Long enough to be running still when the poison's worker dies: it claims the poison once
# both run, and the kernel ends it ALIVE - margin (3.5 s) after its last beat.
SLEEPER = 8.0
# The poison holds the GIL far past that deadline (the kernel's timer ends it first).
HOLD = int(3 * ALIVE)
POISON_ATTEMPTS = 2


def _ledger_started(scenario, ids):
    return lambda: (
        {fields[1] for fields in scenario.ledger.lines() if fields[0] == "start"} >= set(ids)
    )


def test_a_gil_holding_poison_beside_two_sleepers_in_a_standalone_worker(pg):
    strict = backend_with(max_attempts=POISON_ATTEMPTS)
    sleepers = [
        result.id for result in strict.enqueue_many(tasks.ledger, [Call(seconds=SLEEPER)] * 2)
    ]
    with KeptRunning(pg, "--threads", "3") as manager:
        pg.wait(_ledger_started(pg, sleepers), timeout=30, what="both sleepers to start")
        # Claimed into the third thread, beside the two sleepers.
        poison = strict.enqueue(tasks.hold_the_gil, [HOLD], {}).id
        enqueued = time.monotonic()
        # Its first death isolates all three (not charged); each then runs alone: the
        # sleepers to their end, the poison to its death, charged, twice. About 35 s idle.
        pg.recover(
            all_finished([poison, *sleepers]),
            since=enqueued,
            bound=90,
            what="the poison and both sleepers to end",
        )
    jobs = jobs_by_id([poison, *sleepers])
    for job in sleepers:
        row = jobs.get(job)
        if row is None:
            continue
        pg.expect(
            not row["errors"],
            f"sleeper {job} was charged for the poison's death ({len(row['errors'])} error(s): "
            f"{[error.get('exception_class_path') for error in row['errors']]})",
        )
        pg.expect(
            row["interruptions"] and all(entry.get("cause") for entry in row["interruptions"]),
            f"sleeper {job} has no interruption saying why its first attempt ended: "
            f"{row['interruptions']}",
        )
    row = jobs.get(poison)
    if row is not None:
        pg.expect(
            len(row["errors"]) == POISON_ATTEMPTS,
            f"the poison ended {row['status']} with {len(row['errors'])} error(s), expected "
            f"{POISON_ATTEMPTS} (its max_attempts)",
        )
    for job, row in jobs.items():
        most = row["max_attempts"] + row["max_interruptions"]
        pg.expect(
            row["attempt"] <= most,
            f"job {job} was claimed {row['attempt']} times, more than max_attempts + "
            f"max_interruptions ({most})",
        )
    # The first run of each sleeper was cut by the poison's death (else nothing was tested).
    cut = {
        fields[1] for fields in pg.ledger.lines() if fields[0] == "start" and fields[2] == "1"
    } - {fields[1] for fields in pg.ledger.lines() if fields[0] == "end" and fields[2] == "1"}
    pg.expect(
        cut == set(sleepers),
        f"the poison's first death did not cut both sleepers short (cut: {sorted(cut)}); "
        f"worker deaths: {manager.deaths}",
    )
    pg.stop(manager.current)
    pg.conclude({poison: "failed", **successful(sleepers)})


# -- item 7: the database ends every session, or restarts --------------------------------------

TREE = ("--processes", "2", "--threads", "3")
CHILDREN = 4  # two workers, a dispatcher, a scheduler
# Job threads keep their connections between jobs, and Django never checks them
# (CONN_MAX_AGE None, CONN_HEALTH_CHECKS off): only Stalwart can notice one that died.
KEPT = {"STALWART_CONN_MAX_AGE": "none", "STALWART_CONN_HEALTH_CHECKS": "false"}
# The 2,000 halved: the restart cuts as many jobs either way (those running or
# connecting meanwhile); more only lengthen the drain that follows.
RESTARTED_DRAIN = 1000


def _check_inserts(scenario, ids):
    """Each job committed its row; every interruption recorded says why, when and where."""
    rows = inserted_rows(ids)
    missing = [job for job in ids if not rows.get(job)]
    scenario.expect(not missing, f"{len(missing)} job(s) never committed their row: {missing[:5]}")
    silent = [
        (job, entry)
        for job, row in jobs_by_id(ids).items()
        for entry in row["interruptions"]
        if not all(entry.get(key) for key in ("cause", "attempt", "at", "process"))
    ]
    scenario.expect(
        not silent, f"{len(silent)} interruption(s) recorded without a cause: {silent[:3]}"
    )


def _tree(scenario, supervisor):
    family = scenario.fleet.family(supervisor)
    return [supervisor.pid, *(pid for pids in family.values() for pid in pids)]


def test_every_session_terminated_twice_while_draining(pg, cluster):
    supervisor = pg.fleet.supervise(*TREE, children=CHILDREN, **KEPT)
    # The application enqueues 200 jobs over about 4 s (a drain under way all along); every
    # session of the tree is terminated after 1 s, and again 2 s later.
    ids, terminated = [], []
    for batch in range(20):
        ids += insert_jobs(pg, 10)
        if batch in (5, 15):
            terminated.append(cluster.terminate(cluster.app_backends(pg.target.name)))
        time.sleep(0.2)  # the pace of the application's enqueues
    ended = time.monotonic()
    pg.expect(all(terminated), f"sessions terminated: {terminated}, nothing to cut")
    pg.recover(all_finished(ids), since=ended, bound=20, what="every job to finish")
    _check_inserts(pg, ids)
    pg.stop(supervisor)
    pg.conclude(successful(ids))


def test_a_fast_restart_while_draining(pg, cluster):
    # Django's default connections (CONN_MAX_AGE 0): each job connects anew, so the jobs that
    # start while the server restarts lose their connection, as well as those it cuts.
    supervisor = pg.fleet.supervise(*TREE, children=CHILDREN)
    tree = pg.fleet.os_children(supervisor)
    ids = insert_jobs(pg, RESTARTED_DRAIN)
    pg.wait(some_ended(pg, RESTARTED_DRAIN // 10), timeout=30, what="the drain to be under way")
    cluster.restart("fast")
    pg.target.reconnect()
    ended = time.monotonic()
    pg.recover(all_finished(ids), since=ended, bound=60, what="every job to finish")
    watch_tree(pg, supervisor, before=tree, since=ended)
    _check_inserts(pg, ids)
    pg.stop(supervisor)
    pg.conclude(successful(ids))


def test_jobs_claimed_after_a_restart_while_idle(pg, cluster):
    supervisor = pg.fleet.supervise(*TREE, children=CHILDREN, **KEPT)
    warm = insert_jobs(pg, 60)  # every job thread has a connection of its own now
    pg.wait(all_finished(warm), timeout=20, what="the first jobs to finish")
    roles = _tree(pg, supervisor)
    cluster.restart("fast")
    pg.target.reconnect()
    restarted = time.monotonic()
    pg.wait(
        lambda: all(back_from_outage(supervisor, pid) for pid in roles),
        timeout=20,
        what=f"every role ({roles}) to log the end of the outage it saw",
    )
    ids = insert_jobs(pg, 200)
    pg.recover(all_finished(ids), since=restarted, bound=30, what="every job to finish")
    # None of them started on a connection that died with the restart: none failed, none
    # was even retried or interrupted.
    touched = {
        job: (row["attempt"], len(row["errors"]), len(row["interruptions"]))
        for job, row in jobs_by_id(ids).items()
        if row["attempt"] != 1 or row["errors"] or row["interruptions"]
    }
    pg.expect(
        not touched,
        f"{len(touched)} job(s) claimed after the restart did not succeed at their first "
        f"attempt (id: attempt, errors, interruptions): {dict(list(touched.items())[:5])}",
    )
    _check_inserts(pg, ids)
    pg.stop(supervisor)
    pg.conclude(successful(warm + ids))


# -- item 9: counters that see deaths and exits ------------------------------------------------

METRICS = {"STALWART_METRICS": "true"}
FLUSH_BOUND = 5.0 + 5.0  # the tally's flush interval, and then some


def test_a_job_failed_by_its_workers_death_is_counted(pg):
    supervisor = pg.fleet.supervise("--processes", "1", "--threads", "1", children=3, **METRICS)
    poison = backend_with(max_attempts=1).enqueue(tasks.exit_at_once, [], {}).id
    pg.wait(all_finished([poison]), timeout=30, what="the poison to end")
    key = ("failed", "default", "tests.testapp.tasks.exit_at_once")
    failed = time.monotonic()
    pg.recover(
        lambda: stored_counters().get(key) == 1,
        since=failed,
        bound=FLUSH_BOUND,
        what="stalwart_counter to count the failure",
    )
    pg.stop(supervisor)
    exposed = exposed_counters(pg)
    shown = exposed.get(("stalwart_jobs_failed_total", *key[1:]))
    pg.expect(
        shown == 1,
        f"queue metrics shows stalwart_jobs_failed_total {shown} for the poison, expected 1",
    )
    pg.conclude({poison: "failed"})


ENQUEUE_TWELVE = (
    "from tests.testapp import tasks\n"
    "for _ in range(12):\n"
    "    print('enqueued', tasks.ledger.enqueue(seconds=0.1).id)\n"
)


def test_a_short_command_that_enqueues_and_exits_leaves_its_counts(pg):
    command = pg.fleet.start("shell", "--command", ENQUEUE_TWELVE, **METRICS)
    code = command.wait(timeout=60)
    pg.expect(code == 0, f"the command exited {code}")
    ids = re.findall(r"^enqueued (\S+)$", command.output, flags=re.MULTILINE)
    pg.expect(len(ids) == 12, f"the command enqueued {len(ids)} jobs, not 12")
    key = ("default", "tests.testapp.tasks.ledger")
    # Nothing else runs: what the table holds is what the command left as it exited.
    enqueued = stored_counters().get(("enqueued", *key))
    pg.expect(enqueued == 12, f"stalwart_counter holds {enqueued} enqueued, expected 12")
    worker = pg.fleet.work("--threads", "4", **METRICS)
    pg.recover(all_finished(ids), since=time.monotonic(), bound=15, what="every job to finish")
    pg.stop(worker)
    exposed = exposed_counters(pg)
    for name in ("enqueued", "succeeded"):
        shown = exposed.get((f"stalwart_jobs_{name}_total", *key))
        pg.expect(shown == 12, f"queue metrics shows stalwart_jobs_{name}_total {shown}, not 12")
    pg.conclude(successful(ids))
