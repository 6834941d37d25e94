"""One of two supervisors runs with its wall clock off (``faketime``), against one database.

Only the database's clock may decide when a job is due and when a retry may run (issue 9,
items 7 and 12), and when a process is dead. The skewed supervisor serves the queue
``skewed``: there it enqueues jobs due at a time read from the database's clock, and runs a
task whose first attempt fails with a 4 s backoff. The ledger's monotonic times (shared by
every process on the host, faketime or not) are mapped onto the database's clock.
"""

import time
from datetime import timedelta

import pytest

from stalwart.models import Job
from tests.faults.invariants import finished
from tests.faults.target import ALIAS, ALIVE
from tests.testapp import tasks

EARLY = 0.3  # seconds of tolerance for "not before"
LATE = 3.0  # seconds a retry may come after its backoff


@pytest.mark.parametrize("offset", ["+30s", "-90s"], ids=["30s-fast", "90s-slow"])
def test_one_supervisor_with_a_skewed_clock(pg, faketime, offset):
    healthy = pg.fleet.supervise(
        "--queues", "default", "--processes", "1", "--threads", "2", children=3
    )
    skewed = pg.fleet.supervise(
        "--queues",
        "skewed",
        "--processes",
        "1",
        "--threads",
        "2",
        children=3,
        skew=offset,
        timeout=90,  # libfaketime slows every start-up, the more so on a loaded machine
    )
    processes = set(pg.fleet.rows().values_list("pid", flat=True))
    mono0, db0 = time.clock_gettime(time.CLOCK_MONOTONIC), pg.target.now()

    def on_db_clock(mono: float) -> float:
        """Seconds after ``db0`` by the database's clock, of a monotonic time."""
        return mono - mono0

    due = db0 + timedelta(seconds=6)
    enqueuer = pg.target.enqueue(
        tasks.ledger_enqueue_at.using(queue_name="skewed"), due.isoformat(), 3
    ).id
    retried = pg.target.enqueue(tasks.ledger_fails_once.using(queue_name="skewed")).id

    pg.wait(lambda: finished([enqueuer]) == 1, timeout=10, what="the skewed host to enqueue")
    later = Job.objects.using(ALIAS).get(pk=enqueuer).return_value or []
    jobs = [enqueuer, retried, *later]
    pg.recover(
        lambda: finished(jobs) == len(jobs),
        since=mono0,
        bound=6 + 4 + LATE + 3,
        what="the due jobs and the retry to run",
    )

    runs = pg.ledger.executions()
    # Each check below needs its runs: a run missing is a failure, not a check skipped.
    pg.expect(len(later) == 3, f"the skewed host enqueued {len(later)} due jobs, not 3")
    for job in later:
        first = min((run.started for run in runs.get(job, [])), default=None)
        if pg.expect(first is not None, f"job {job}, due at {due:%H:%M:%S.%f}, never started"):
            early = 6 - on_db_clock(first)
            pg.expect(
                early <= EARLY,
                f"job {job}, due at {due:%H:%M:%S.%f} by the database's clock, started "
                f"{early:.1f} s early (enqueued on a host whose clock is {offset} off)",
            )
    tries = sorted(runs.get(retried, []), key=lambda run: run.attempt)
    if pg.expect(
        len(tries) >= 2 and tries[0].ended is not None,
        f"the retried job's ledger has {len(tries)} runs, not a failed one and its retry",
    ):
        after = tries[1].started - tries[0].ended
        pg.expect(
            4 - EARLY <= after <= 4 + LATE,
            f"the retry with a 4 s backoff ran {after:.1f} s after the failure, on a host "
            f"whose clock is {offset} off (the database's clock must decide)",
        )
    # No process is taken for dead because of a clock: all still there, none pruned, twice
    # the alive threshold on.
    while time.monotonic() < mono0 + 2 * ALIVE:
        time.sleep(0.2)  # watching for a stated time, not synchronising
    still = set(pg.fleet.rows().values_list("pid", flat=True))
    pg.expect(
        processes <= still,
        f"processes {sorted(processes - still)} were pruned (their clocks, not their hearts)",
    )
    pg.expect(
        "action=process_pruned" not in pg.fleet.outputs(),
        "a live process was pruned with a skewed clock in the cluster",
    )
    pg.stop(healthy)
    pg.stop(skewed)
    # The retried job ran twice by design (its first attempt failed).
    pg.conclude(dict.fromkeys(jobs, "successful"), reruns=True)
