"""PostgreSQL restarts under a draining tree: fast, immediate, and down past the threshold.

A restart or failover must never stop a healthy tree: every role reconnects and carries on,
and the supervisor keeps its children (issue 9, item 1).
"""

import time

import pytest

from tests.faults.target import ALIVE
from tests.faults.workload import (
    all_finished,
    ledger_jobs,
    some_ended,
    successful,
    watch_tree,
)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_postgresql_restart_mid_drain(pg, cluster, mode):
    supervisor = pg.fleet.supervise("--processes", "2", "--threads", "2", children=4)
    tree = pg.fleet.os_children(supervisor)
    ids = ledger_jobs(pg, 40, 0.25)
    pg.wait(some_ended(pg, 8), timeout=20, what="the drain to be under way")

    cluster.restart(mode)
    pg.target.reconnect()
    ended = time.monotonic()

    pg.recover(all_finished(ids), since=ended, bound=15, what="every job to finish")
    watch_tree(pg, supervisor, before=tree, since=ended)
    pg.stop(supervisor)
    pg.conclude(successful(ids))


def test_postgresql_down_longer_than_the_alive_threshold(pg, cluster):
    # The jobs' bodies (0.25 s, no database) all end early in the outage: from then on no
    # body runs anywhere, so no process needs to end at its deadline, and after the restart
    # the pruners give everyone a threshold to beat again before judging silence. The tree
    # must come through whole, and no finished body run again.
    supervisor = pg.fleet.supervise("--processes", "2", "--threads", "2", children=4)
    tree = pg.fleet.os_children(supervisor)
    ids = ledger_jobs(pg, 40, 0.25)
    pg.wait(some_ended(pg, 8), timeout=20, what="the drain to be under way")

    cluster.down_for(ALIVE + 2)
    pg.target.reconnect()
    ended = time.monotonic()

    pg.recover(all_finished(ids), since=ended, bound=20, what="every job to finish")
    watch_tree(pg, supervisor, before=tree, since=ended)
    pg.stop(supervisor)
    pg.conclude(successful(ids))
