"""Process faults, on PostgreSQL and on SQLite: SIGKILL of a worker mid-job, SIGSTOP past the
alive threshold then SIGCONT, QUIT, and a storm of TERMs.

- A killed worker is replaced; its jobs run again, once, elsewhere or in the replacement.
- A paused worker is declared dead; its jobs run elsewhere; resumed, it must stop without
  writing its stale results (the job keeps the newest attempt's result) (issue 9, item 4a).
- QUIT releases what runs and exits at once; the jobs run once after a restart.
- A TERM storm is one graceful stop: running jobs finish, nothing is left behind.
"""

import contextlib
import signal
import time

import psutil

from stalwart.models import Job
from tests.faults.fleet import alive
from tests.faults.target import ALIAS, ALIVE, SHUTDOWN_TIMEOUT
from tests.faults.workload import (
    all_finished,
    ledger_jobs,
    owner_pid,
    running,
    successful,
)
from tests.testapp import tasks


def test_sigkill_of_a_worker_mid_job(any_db):
    scenario = any_db
    supervisor = scenario.fleet.supervise("--processes", "2", "--threads", "2", children=4)
    ids = ledger_jobs(scenario, 8, 1.5)
    scenario.wait(running(ids, 4), timeout=15, what="4 jobs to run")
    victim = owner_pid(ids[0])
    scenario.expect(victim is not None, "the first job has no live owner")
    if victim:
        psutil.Process(victim).kill()
    killed = time.monotonic()

    scenario.recover(all_finished(ids), since=killed, bound=15, what="every job to finish")
    family = scenario.fleet.family(supervisor)
    scenario.expect(
        len(family["worker"]) == 2 and victim not in family["worker"],
        f"the killed worker {victim} was not replaced: workers are {family['worker']}",
    )
    scenario.stop(supervisor)
    scenario.conclude(successful(ids))


def test_sigstop_of_a_worker_past_the_threshold_then_sigcont(any_db):
    scenario = any_db
    supervisor = scenario.fleet.supervise("--processes", "2", "--threads", "1", children=4)
    ids = ledger_jobs(scenario, 2, 4.0, scaled=False)
    scenario.wait(running(ids, 2), timeout=15, what="both jobs to run")
    paused = owner_pid(ids[0])
    scenario.expect(paused is not None, "the first job has no live owner")
    if paused:
        psutil.Process(paused).suspend()
    try:
        scenario.wait(
            lambda: not scenario.fleet.rows().filter(pid=paused).exists(),
            timeout=ALIVE + 5,
            what="the paused worker to be declared dead",
        )
        scenario.wait(
            all_finished(ids), timeout=20, what="the paused worker's job to run elsewhere"
        )
    finally:
        if paused:
            psutil.Process(paused).resume()
    resumed = time.monotonic()

    scenario.recover(
        lambda: not alive(paused), since=resumed, bound=5, what="the resumed stale worker to stop"
    )
    scenario.stop(supervisor)
    # The paused run may end after its job ran elsewhere: its result must be discarded.
    scenario.conclude(successful(ids), reruns=True, overlap=True)


def test_quit_releases_running_jobs_at_once(any_db):
    scenario = any_db
    supervisor = scenario.fleet.supervise("--processes", "1", "--threads", "2", children=3)
    ids = ledger_jobs(scenario, 2, 30.0, scaled=False)
    scenario.wait(running(ids, 2), timeout=15, what="both jobs to run")
    quit_at = time.monotonic()
    scenario.stop(supervisor, signal.SIGQUIT, timeout=10)
    scenario.expect(
        time.monotonic() - quit_at < 5, "QUIT took more than 5 s: it must not wait for jobs"
    )
    states = sorted(Job.objects.using(ALIAS).filter(pk__in=ids).values_list("status", flat=True))
    scenario.expect(states == ["ready", "ready"], f"after QUIT the jobs are {states}, not ready")
    # Make the released jobs short, and let a new supervisor run them.
    Job.objects.using(ALIAS).filter(pk__in=ids).update(kwargs={"seconds": 0.2})
    again = scenario.fleet.supervise("--processes", "1", "--threads", "2", children=3)
    scenario.recover(all_finished(ids), since=time.monotonic(), bound=10, what="the jobs to run")
    scenario.stop(again)
    scenario.conclude(successful(ids))


def test_a_storm_of_terms_is_one_graceful_stop(any_db):
    scenario = any_db
    supervisor = scenario.fleet.supervise("--processes", "2", "--threads", "2", children=4)
    ids = ledger_jobs(scenario, 4, 1.5, scaled=False)
    scenario.wait(running(ids, 4), timeout=15, what="4 jobs to run")
    family = scenario.fleet.os_children(supervisor)
    for _ in range(20):
        for pid in [supervisor.pid, *family]:
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).send_signal(signal.SIGTERM)
        time.sleep(0.01)  # a storm spread over a moment, not a synchronisation
    started = time.monotonic()
    try:
        code = supervisor.wait(timeout=SHUTDOWN_TIMEOUT + 10)
    except AssertionError:
        code = None
    scenario.expect(code == 0, f"the supervisor exited {code} after a TERM storm, expected 0")
    scenario.recovery, scenario.bound = time.monotonic() - started, SHUTDOWN_TIMEOUT + 5
    scenario.expect(
        scenario.recovery < scenario.bound,
        f"the graceful stop took {scenario.recovery:.1f} s, over the shutdown timeout and then "
        "some",
    )
    scenario.conclude(successful(ids))


def test_a_dead_workers_job_goes_back_only_once_its_process_group_is_gone(pg):
    """Issue 18, item 5: the job's subprocess handles TERM and keeps writing; the job runs
    again only once nothing of its dead worker's process group is left."""
    job = pg.target.enqueue(tasks.spawn_a_writer_then_die).id
    supervisor = pg.fleet.supervise("--processes", "1", "--threads", "1", children=3)
    pg.wait(all_finished([job]), timeout=30, what="the job to run again and finish")
    lines = pg.ledger.lines()
    writes = [float(fields[4]) for fields in lines if fields[0] == "wrote"]
    second = [float(fields[4]) for fields in lines if fields[0] == "start" and fields[2] == "2"]
    writers = [int(fields[4]) for fields in lines if fields[0] == "spawned"]
    pg.expect(
        any(fields[0] == "termed" for fields in lines),
        "the job's subprocess never got TERM (nothing outlived TERM: nothing was tested)",
    )
    if writes and second:
        pg.expect(
            max(writes) < min(second),
            f"the dead worker's subprocess still wrote {max(writes) - min(second):.2f} s "
            "after attempt 2 had started",
        )
    pg.expect(second, "attempt 2 never started")
    pg.expect(not any(alive(pid) for pid in writers), f"the writer {writers} outlived it all")
    pg.stop(supervisor)
    pg.conclude({job: "successful"})
