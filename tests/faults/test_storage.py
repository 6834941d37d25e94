"""The database refuses writes: a full disk, then a read-only database.

A full disk is real: the job table and its indexes move to a tablespace on a small tmpfs we
mount, and a filler table takes its last byte, so the queue's writes fail with "No space left
on device" until the filler goes. (The process table stays off it, so heartbeats go on and the
episode can outlast the alive threshold.) Workers must back off inside the process, with a
log line or two per episode, not crash and be re-forked in a loop (issue 9, item 17), and
finish the drain once there is space again.
"""

import re
import time

import psycopg
from psycopg import errors

from tests.faults.workload import (
    all_finished,
    ledger_jobs,
    some_ended,
    successful,
    watch_tree,
)

TABLESPACE = "full_disk"
# Lines a process may log about one outage: one when it starts, one when it ends (and slack
# for the processes that notice it separately).
LINES_PER_EPISODE = 2


def move_job_table(cluster, dbname: str) -> None:
    cluster.small_tablespace(TABLESPACE, 8)
    with cluster.session(dbname) as session:
        session.execute(f"ALTER TABLE stalwart_job SET TABLESPACE {TABLESPACE}")
        indexes = session.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'stalwart_job'"
        ).fetchall()
        for (index,) in indexes:
            session.execute(f'ALTER INDEX "{index}" SET TABLESPACE {TABLESPACE}')


def fill_the_disk(session: psycopg.Connection) -> None:
    """Take every byte of the tablespace with a filler table (until the disk says no)."""
    session.execute(f"CREATE TABLE filler (junk text) TABLESPACE {TABLESPACE}")
    for rows in (2000, 200, 20, 1):
        while True:
            try:
                session.execute(
                    "INSERT INTO filler SELECT string_agg(md5(random()::text), '') "
                    "FROM generate_series(1, 30) CROSS JOIN generate_series(1, %s) AS n "
                    "GROUP BY n",
                    [rows],
                )
            except errors.DiskFull:
                break


def disk_full_lines(output: str) -> int:
    """Log lines about the full disk (a traceback's lines count one each)."""
    return sum(
        1
        for line in output.splitlines()
        if re.search(r"No space left on device|could not extend file", line)
    )


def test_a_full_disk_during_a_drain(pg, cluster, root):
    move_job_table(cluster, pg.target.name)
    supervisor = pg.fleet.supervise("--processes", "2", "--threads", "2", children=4)
    tree = pg.fleet.os_children(supervisor)
    # About 22 s of work for the four threads: the drain is still going when the disk is
    # full, even on a loaded machine where filling it takes a while.
    ids = ledger_jobs(pg, 180, 0.5)
    pg.wait(some_ended(pg, 4), timeout=20, what="the drain to be under way")

    with cluster.session(pg.target.name) as session:
        fill_the_disk(session)
        refused_before = cluster.server_log().count("No space left on device")
        full_at = time.monotonic()
        # Held full longer than the alive threshold, and until the queue has met the full
        # disk at least once (on a loaded machine its writes come slowly), within a bound.
        while True:
            refused = cluster.server_log().count("No space left on device") - refused_before
            held = time.monotonic() - full_at
            if (held >= 6 and refused > 0) or held >= 30:
                break
            time.sleep(0.2)  # polling the server's log for the refusal
        session.execute("DROP TABLE filler")
    ended = time.monotonic()

    pg.expect(refused > 0, "the full disk never refused one of the queue's writes (no test)")
    # The rest of the work (up to 22 s of it), and then some.
    pg.recover(all_finished(ids), since=ended, bound=45, what="every job to finish")
    watch_tree(pg, supervisor, before=tree, since=ended)
    pg.stop(supervisor)
    output = pg.fleet.outputs()
    lines = disk_full_lines(output)
    processes = len(tree) + 1
    pg.expect(
        lines <= LINES_PER_EPISODE * processes,
        f"{lines} log lines about the full disk from {processes} processes in one episode "
        f"(at most {LINES_PER_EPISODE} each: one when it starts, one when it ends)",
    )
    pg.expect(
        "Traceback" not in output,
        "a process logged a traceback about the full disk (an expected outage, not a crash)",
    )
    pg.conclude(successful(ids), reruns=True)


def test_a_read_only_database_for_a_while(pg, cluster):
    supervisor = pg.fleet.supervise("--processes", "2", "--threads", "2", children=4)
    tree = pg.fleet.os_children(supervisor)
    ids = ledger_jobs(pg, 40, 0.2)
    pg.wait(some_ended(pg, 4), timeout=20, what="the drain to be under way")

    cluster.read_only(True)
    try:
        time.sleep(2)  # read-only for a while (shorter than the alive threshold)
    finally:
        cluster.read_only(False)
    ended = time.monotonic()

    pg.recover(all_finished(ids), since=ended, bound=10, what="every job to finish")
    watch_tree(pg, supervisor, before=tree, since=ended)
    pg.stop(supervisor)
    pg.conclude(successful(ids))
