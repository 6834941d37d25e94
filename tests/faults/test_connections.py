"""Connections ended by the server: ``pg_terminate_backend`` of every backend (what a failover
does), then of each role's connections alone.

Every role must notice, reconnect and carry on (issue 9, item 1): workers finish the drain,
the dispatcher promotes due jobs, the scheduler keeps enqueueing its every-second tick, and
the supervisor keeps its row alive without fencing itself, so the tree stays as it was for
twice the alive threshold after the fault.
"""

import time
from datetime import timedelta

import pytest

from tests.faults.fleet import role_backends
from tests.faults.workload import (
    EVERY_SECOND,
    all_finished,
    ledger_jobs,
    recurring_runs,
    some_ended,
    successful,
    watch_tree,
)
from tests.testapp import tasks


def ticks_grow(scenario, since_count: int, by: int):
    return lambda: recurring_runs() >= since_count + by


def test_terminate_every_backend_while_supervise_runs(pg, cluster):
    supervisor = pg.fleet.supervise(
        "--processes", "2", "--threads", "2", children=4, STALWART_RECURRING=EVERY_SECOND
    )
    tree = pg.fleet.os_children(supervisor)
    ids = ledger_jobs(pg, 30, 0.3)
    pg.wait(some_ended(pg, 6), timeout=20, what="the drain to be under way")
    pg.wait(lambda: recurring_runs() >= 1, timeout=10, what="the first recurring tick")

    terminated = cluster.terminate(cluster.app_backends(pg.target.name))
    ended = time.monotonic()
    ticks = recurring_runs()
    pg.expect(terminated >= 5, f"only {terminated} backends were terminated")

    pg.recover(all_finished(ids), since=ended, bound=10, what="every job to finish")
    pg.wait(
        ticks_grow(pg, ticks, 3),
        timeout=8,
        what="the scheduler to enqueue 3 more every-second ticks after the fault",
    )
    watch_tree(pg, supervisor, before=tree, since=ended)
    later = recurring_runs()
    pg.wait(
        ticks_grow(pg, later, 2),
        timeout=5,
        what="every-second ticks to go on being enqueued twice the threshold after the fault",
    )
    more = ledger_jobs(pg, 6, 0.1)
    pg.wait(all_finished(more), timeout=10, what="jobs enqueued after the fault to finish")
    pg.stop(supervisor)
    pg.conclude(successful(ids + more))


@pytest.mark.parametrize("role", ["supervisor", "worker", "dispatcher", "scheduler"])
def test_terminate_one_roles_connections(pg, role):
    supervisor = pg.fleet.supervise(
        "--processes", "2", "--threads", "2", children=4, STALWART_RECURRING=EVERY_SECOND
    )
    tree = pg.fleet.os_children(supervisor)
    ids = ledger_jobs(pg, 30, 0.3)
    pg.wait(some_ended(pg, 6), timeout=20, what="the drain to be under way")
    pg.wait(lambda: recurring_runs() >= 1, timeout=10, what="the first recurring tick")

    pid = supervisor.pid if role == "supervisor" else pg.fleet.family(supervisor)[role][0]
    backends = role_backends(pg.target, pid)
    terminated = pg.target.cluster.terminate(backends)
    ended = time.monotonic()
    ticks = recurring_runs()
    pg.expect(terminated >= 1, f"no backend of the {role} (pid {pid}) was found to terminate")
    # A job due after the fault: only the dispatcher makes it ready.
    due = pg.target.backend.enqueue(
        tasks.ledger.using(run_after=pg.target.now() + timedelta(seconds=1)), (), {}
    ).id

    pg.recover(all_finished([*ids, due]), since=ended, bound=10, what="every job to finish")
    pg.wait(
        ticks_grow(pg, ticks, 3),
        timeout=8,
        what="the scheduler to enqueue 3 more every-second ticks after the fault",
    )
    watch_tree(pg, supervisor, before=tree, since=ended)
    pg.stop(supervisor)
    pg.conclude(successful([*ids, due]))
