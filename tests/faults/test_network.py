"""The link to PostgreSQL misbehaves: our proxy cuts it, stalls it, or slows it down.

- A cut closes every connection at once: each role reconnects, nothing is lost or run twice;
  the same when new connections are refused for a while after the cut.
- A stall longer than the alive threshold: the stalled processes must stop themselves before
  anyone may take their jobs, their late results must be discarded, and their supervisor,
  blocked in a query, must still reap its children (issue 9, item 17: a client-side deadline).
- Latency: a heartbeat whose answer comes late must never let another supervisor prune a
  worker whose job still runs (item 3): no job runs twice at once.
"""

import socket
import threading
import time
from datetime import timedelta

import psutil

from stalwart.models import Job
from tests.faults.target import ALIAS, ALIVE
from tests.faults.workload import (
    all_finished,
    ledger_jobs,
    running,
    some_ended,
    successful,
    watch_tree,
)


def resumed_after(supervisor, offset: int, *, children: int):
    """Every one of the supervisor's ``children`` has logged, after ``offset`` characters of
    the tree's output, that it went on after a heartbeat that waited."""

    def check() -> bool:
        lines = supervisor.output[offset:].splitlines()
        pids = {line.split()[2] for line in lines if "action=process_resumed" in line}
        return len(pids) >= children

    return check


def settled(scenario, supervisor):
    """Every process of the tree has beaten twice: its threads hold their connections (a
    connection opened through a slowed link would take many slow round trips)."""
    from django.db.models import F

    from tests.faults.target import HEARTBEAT

    def check() -> bool:
        family = scenario.fleet.family(supervisor)
        pids = [supervisor.pid, *(pid for pids in family.values() for pid in pids)]
        young = scenario.fleet.rows().filter(
            pid__in=pids, last_heartbeat_at__lt=F("created_at") + timedelta(seconds=2 * HEARTBEAT)
        )
        return len(pids) > 1 and not young.exists()

    return check


def test_proxy_cuts_every_connection_mid_drain(proxied):
    supervisor = proxied.fleet.supervise("--processes", "2", "--threads", "2", children=4)
    tree = proxied.fleet.os_children(supervisor)
    ids = ledger_jobs(proxied, 40, 0.25)
    proxied.wait(some_ended(proxied, 8), timeout=20, what="the drain to be under way")

    cut = proxied.proxy.cut()
    ended = time.monotonic()
    proxied.expect(cut >= 5, f"only {cut} connections were cut")

    proxied.recover(all_finished(ids), since=ended, bound=10, what="every job to finish")
    watch_tree(proxied, supervisor, before=tree, since=ended)
    proxied.stop(supervisor)
    proxied.conclude(successful(ids))


def test_proxy_refuses_new_connections_after_a_cut(proxied):
    """Every connection cut, and new ones refused for 1.5 s (well within the threshold)."""
    supervisor = proxied.fleet.supervise("--processes", "2", "--threads", "2", children=4)
    tree = proxied.fleet.os_children(supervisor)
    ids = ledger_jobs(proxied, 40, 0.25)
    proxied.wait(some_ended(proxied, 8), timeout=20, what="the drain to be under way")

    proxied.proxy.refuse()
    proxied.proxy.cut()
    time.sleep(1.5)  # refusing connections for a while
    proxied.proxy.accept()
    ended = time.monotonic()

    proxied.recover(all_finished(ids), since=ended, bound=10, what="every job to finish")
    watch_tree(proxied, supervisor, before=tree, since=ended)
    proxied.stop(supervisor)
    proxied.conclude(successful(ids))


def test_proxy_stalls_past_the_alive_threshold(proxied):
    stalled = proxied.fleet.supervise("--processes", "2", "--threads", "2", children=4)
    ids = ledger_jobs(proxied, 8, 3.0)
    proxied.wait(running(ids, 4), timeout=20, what="the stalled tree to run 4 jobs")
    # A second supervisor on a direct link: it may take the stalled tree's jobs, once that
    # tree can no longer run them.
    healthy = proxied.fleet.supervise(
        "--processes", "1", "--threads", "4", children=3, PGPORT=str(proxied.target.cluster.port)
    )

    proxied.proxy.stall()
    time.sleep(ALIVE + 2)  # holding the stall open past the alive threshold
    zombies = [
        child.pid
        for child in psutil.Process(stalled.pid).children()
        if child.status() == psutil.STATUS_ZOMBIE
    ]
    proxied.proxy.unstall()
    ended = time.monotonic()

    proxied.expect(
        not zombies,
        f"children {zombies} of the stalled supervisor died but were not reaped during the "
        "stall: the supervisor was blocked in a query with no deadline",
    )
    proxied.recover(all_finished(ids), since=ended, bound=15, what="every job to finish")
    proxied.stop(stalled, status=None)  # pruned as dead, it may have stopped by itself
    proxied.stop(healthy)
    # Run again elsewhere, never here and elsewhere at once: the stalled workers were ended
    # by the kernel before anyone could prune them.
    proxied.conclude(successful(ids), reruns=True)


def test_latency_on_every_packet_runs_nothing_twice(proxied):
    slow = proxied.fleet.supervise("--processes", "2", "--threads", "2", children=4)
    ids = ledger_jobs(proxied, 4, 6.0, scaled=False)
    proxied.wait(running(ids, 4), timeout=20, what="the slow tree to run the 4 jobs")
    # A second supervisor on a direct link, with idle threads: it prunes and claims.
    pruner = proxied.fleet.supervise(
        "--processes", "1", "--threads", "4", children=3, PGPORT=str(proxied.target.cluster.port)
    )
    proxied.wait(settled(proxied, slow), timeout=10, what="the slow tree to beat twice")
    more = ledger_jobs(proxied, 20, 0.2)

    proxied.proxy.latency(0.2)
    time.sleep(8)  # holding the latency for a while
    proxied.proxy.latency(0)
    ended = time.monotonic()

    proxied.recover(all_finished(ids + more), since=ended, bound=15, what="every job to finish")
    proxied.stop(slow)
    proxied.stop(pruner)
    proxied.conclude(successful(ids + more))


def test_slow_heartbeat_answers_never_let_a_pruner_take_a_live_workers_job(proxied):
    """Item 3: the worker stamps a beat when its answer arrives, the pruner when the UPDATE
    ran. Answers come 2 s late; then requests stall (the last answer still arrives): the
    worker must stop before it can be pruned, never run its job beside the new attempt."""
    slow = proxied.fleet.supervise("--processes", "2", "--threads", "2", children=4)
    ids = ledger_jobs(proxied, 4, 12.0, scaled=False)
    proxied.wait(running(ids, 4), timeout=20, what="the slow tree to run the 4 jobs")
    pruner = proxied.fleet.supervise(
        "--processes", "1", "--threads", "4", children=3, PGPORT=str(proxied.target.cluster.port)
    )
    proxied.wait(settled(proxied, slow), timeout=10, what="the slow tree to beat twice")

    proxied.proxy.latency(2.0, answers_only=True)
    # A beat with a slow answer, in every child of the slow tree: each holds itself back
    # while its beat waits (over 1.5 s), and goes on once the late answer has come back.
    logged = len(slow.output)
    proxied.wait(
        resumed_after(slow, logged, children=4),
        timeout=20,
        what="every child of the slow tree to get a slow answer to a beat",
    )
    proxied.proxy.stall(requests_only=True)
    time.sleep(ALIVE + 1)  # holding the stall past the alive threshold
    proxied.proxy.unstall()
    proxied.proxy.latency(0)
    ended = time.monotonic()

    proxied.recover(all_finished(ids), since=ended, bound=20, what="every job to finish")
    proxied.stop(slow, status=None)  # pruned as dead, it may have stopped by itself
    proxied.stop(pruner)
    # A job may run again once its worker gave it up, never while that worker still runs it.
    proxied.conclude(successful(ids), reruns=True)


def test_a_stalled_link_charges_no_job_its_tree_gave_up(proxied):
    """A link that stalls past the threshold ends the whole tree's workers (the kernel's
    deadline); the supervisor, which learns from them that their heartbeats hung (their
    verdict: interrupted), gives their jobs back uncharged: a job allowed a single attempt is
    not failed for a network fault, and never runs twice at once."""
    stalled = proxied.fleet.supervise("--processes", "1", "--threads", "2", children=3)
    ids = ledger_jobs(proxied, 2, 3 * ALIVE, scaled=False)
    Job.objects.using(ALIAS).filter(pk__in=ids).update(max_attempts=1)
    proxied.wait(running(ids, 2), timeout=20, what="the jobs to start")

    proxied.proxy.stall()
    time.sleep(ALIVE + 3)  # holding the stall open past the alive threshold
    proxied.proxy.unstall()
    ended = time.monotonic()

    proxied.recover(all_finished(ids), since=ended, bound=8 * ALIVE, what="every job to finish")
    for job_id, status, errors in (
        Job.objects.using(ALIAS).filter(pk__in=ids).values_list("id", "status", "errors")
    ):
        proxied.expect(
            status == "successful" and errors == [],
            f"job {job_id} ended {status} with {errors}: a stall is not the job's failure",
        )
    proxied.stop(stalled)
    proxied.conclude(successful(ids), reruns=True)


def test_a_stalled_link_never_silences_the_supervisors_watchdog(proxied, tmp_path):
    """systemd's watchdog must keep hearing from the supervisor while its link stalls: every
    call it makes has a deadline, a connection attempt a short timeout, and the loop makes
    one attempt per backoff, not one per child."""
    address = str(tmp_path / "notify.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    listener.bind(address)
    listener.settimeout(0.1)
    pings: list[float] = []
    stop = threading.Event()

    def collect() -> None:
        while not stop.is_set():
            try:
                if b"WATCHDOG=1" in listener.recv(4096):
                    pings.append(time.monotonic())
            except (TimeoutError, OSError):
                continue

    collector = threading.Thread(target=collect)
    collector.start()
    try:
        supervisor = proxied.fleet.supervise(
            "--processes",
            "1",
            children=3,
            NOTIFY_SOCKET=address,
            WATCHDOG_USEC="2000000",  # a ping expected every second
        )
        proxied.wait(lambda: len(pings) >= 2, timeout=10, what="the first pings")
        stalled_at = time.monotonic()
        proxied.proxy.stall()
        time.sleep(3 * ALIVE)  # holding the stall open: the children fence and die
        proxied.proxy.unstall()
        ended = time.monotonic()
        during = [moment for moment in pings if stalled_at <= moment <= ended]
        gaps = [
            later - earlier for earlier, later in zip([stalled_at, *during], during, strict=False)
        ]
        # A statement timeout (a quarter of the threshold) and 2 s of margin, or a 2 s
        # connection timeout, per turn of the loop, and the ping interval on top.
        bound = 1.0 + ALIVE / 4 + 2.0 + 1.0
        worst = max(gaps, default=ended - stalled_at)
        proxied.expect(
            worst <= bound,
            f"the watchdog went {worst:.1f} s without a ping while the link stalled "
            f"(bound {bound:.1f} s; gaps {[round(gap, 1) for gap in gaps]})",
        )
        proxied.recover(
            lambda: len(proxied.fleet.family(supervisor).get("worker", [])) == 1,
            since=ended,
            bound=6 * ALIVE,
            what="a worker to run again",
        )
        proxied.stop(supervisor)
        proxied.conclude({})
    finally:
        stop.set()
        collector.join(5)
        listener.close()
