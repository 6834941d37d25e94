"""Limits a DBA sets on the queue's role: timeouts, and fewer connections than it needs.

- ``lock_timeout``/``statement_timeout``/``idle_in_transaction_session_timeout`` on the role,
  while an application transaction holds the job table: the queue's statements time out,
  are retried, and the drain finishes; nothing crashes.
- A connection limit below what the tree needs, right after every connection was dropped:
  processes wait for a connection (with backoff), none is lost, and all recover once the
  limit is lifted.
"""

import time

from tests.faults.workload import (
    all_finished,
    ledger_jobs,
    some_ended,
    successful,
    watch_tree,
)


def test_role_timeouts_while_an_application_holds_the_job_table(pg, cluster):
    cluster.set_role(
        lock_timeout="200ms",
        statement_timeout="1s",
        idle_in_transaction_session_timeout="1s",
    )
    try:
        supervisor = pg.fleet.supervise("--processes", "2", "--threads", "2", children=4)
        tree = pg.fleet.os_children(supervisor)
        ids = ledger_jobs(pg, 40, 0.2)
        pg.wait(some_ended(pg, 4), timeout=20, what="the drain to be under way")

        with cluster.session(pg.target.name) as session, session.transaction():
            session.execute("LOCK TABLE stalwart_job IN EXCLUSIVE MODE")
            time.sleep(2)  # the application's transaction holds the table for a while
        ended = time.monotonic()

        pg.recover(all_finished(ids), since=ended, bound=10, what="every job to finish")
        watch_tree(pg, supervisor, before=tree, since=ended)
        pg.stop(supervisor)
    finally:
        cluster.set_role(
            lock_timeout=None, statement_timeout=None, idle_in_transaction_session_timeout=None
        )
    pg.conclude(successful(ids))


def test_fewer_connections_than_the_tree_needs(pg, cluster):
    supervisor = pg.fleet.supervise("--processes", "2", "--threads", "2", children=4)
    ids = ledger_jobs(pg, 40, 0.2)
    pg.wait(some_ended(pg, 4), timeout=20, what="the drain to be under way")

    cluster.connection_limit(4)  # the tree holds about a dozen
    try:
        cluster.terminate(cluster.app_backends(pg.target.name))
        time.sleep(3)  # a while with too few connections
    finally:
        cluster.connection_limit(-1)
    ended = time.monotonic()

    pg.recover(all_finished(ids), since=ended, bound=15, what="every job to finish")
    # Children that could not beat for longer than the threshold may have been replaced;
    # the supervisor must carry on.
    watch_tree(pg, supervisor, before=None, since=ended)
    more = ledger_jobs(pg, 6, 0.1)
    pg.wait(all_finished(more), timeout=10, what="jobs enqueued after the limit was lifted")
    pg.stop(supervisor)
    # Children that could not beat for longer than the threshold may have been replaced and
    # their jobs run again; nothing may be lost or run twice at once.
    pg.conclude(successful(ids + more), reruns=True)
