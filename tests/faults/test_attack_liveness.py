"""Attacks on the liveness rules of a process that runs no job, and of pruners after an outage.

A process whose heartbeats are overdue stops the kernel's kill timer when it runs no job's
body and claims none; a pruner judges others' silence only once it has itself reached the
database for a whole threshold on end. What must still hold:

- a worker cut off alone while it runs a body is ended by the kernel before anyone may prune
  it (its job then runs elsewhere, never in both places at once);
- a worker cut off alone while idle lives on, is pruned on time by a pruner that kept its
  link, and once its link returns it is fenced and claims nothing;
- a worker of a tree cut off alone once its job's body has finished is not charged for the
  network: the job, allowed one attempt, still succeeds;
- a pruner whose own link flaps (cut every second or so, never for long) still prunes a dead
  worker, so that its job is not stranded.

The partition is the suite's proxy, with chosen processes cut off: their links, open and
new, forward nothing (a host's link hung, while the others' work).
"""

import os
import signal
import threading
import time

import psutil
import pytest

from stalwart.models import Job
from tests.faults.cluster import PrivateCluster
from tests.faults.proxy import Proxy, _Link
from tests.faults.scenario import Scenario
from tests.faults.target import ALIAS, ALIVE, SHUTDOWN_TIMEOUT, Databases
from tests.faults.workload import all_finished, ledger_jobs, owner_pid, running, successful
from tests.testapp import tasks

EXIT_FENCED = 3
UNKNOWN = object()


class Partition(Proxy):
    """The proxy, with processes cut off: what their links carry is neither read nor sent,
    while every other process's link works."""

    def __init__(self, host: str, port: int) -> None:
        self.isolated: set[int] = set()
        super().__init__(host, port)

    def owner(self, link: _Link) -> int | None:
        """The pid of the process at the client end of ``link`` (found once)."""
        pid = getattr(link, "owner_pid", UNKNOWN)
        if pid is UNKNOWN:
            pid = None
            try:
                port = link.client.getpeername()[1]
            except OSError:
                return None
            for connection in psutil.net_connections(kind="tcp4"):
                if (
                    connection.laddr
                    and connection.laddr.port == port
                    and connection.raddr
                    and connection.raddr.port == self.port
                ):
                    pid = connection.pid
                    break
            link.owner_pid = pid  # type: ignore[attr-defined]
        return pid  # type: ignore[return-value]

    def isolate(self, *pids: int) -> None:
        self.isolated.update(pids)

    def strand(self) -> int:
        """Every open link goes dead for good, with no reset (a failover behind a moved
        address, a firewall that dropped its state): new connections work. How many."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.stranded = True  # type: ignore[attr-defined]
        return len(links)

    def _blocked(self, link: _Link) -> bool:
        return getattr(link, "stranded", False) or self.owner(link) in self.isolated

    def rejoin(self, *pids: int) -> None:
        """Heal the partition; the hung links are reset (as a NAT or a firewall would)."""
        with self._lock:
            hung = [link for link in self._links if self.owner(link) in pids]
        for link in hung:
            link.close()
        self.isolated.difference_update(pids)

    def _pump(
        self, link: _Link, source, target, answers: bool
    ) -> None:  # the parent's, with the partition
        import select

        flowing = self._flowing[answers]
        try:
            while not link.closed.is_set():
                if not flowing.wait(0.05):
                    continue
                if self._blocked(link):
                    time.sleep(0.05)  # cut off: read nothing, forward nothing
                    continue
                readable, _, _ = select.select([source], [], [], 0.05)
                if not readable:
                    continue
                data = source.recv(65536)
                if not data:
                    break
                while self._blocked(link) and not link.closed.is_set():
                    time.sleep(0.05)
                target.sendall(data)
        except (OSError, ValueError):
            pass
        finally:
            link.close()
            with self._lock:
                self._links.discard(link)


@pytest.fixture
def partitioned(scenario: Scenario, pg_databases: Databases, cluster: PrivateCluster) -> Scenario:
    scenario.proxy = Partition(cluster.host, cluster.port)
    return scenario.open(pg_databases.postgresql(port=scenario.proxy.port))


def row_of(pid: int) -> bool:
    from stalwart.models import Process

    return Process.objects.using(ALIAS).filter(pid=pid).exists()


def beaten(scenario: Scenario, pid: int, times: int = 2):
    """The process's row has been stamped ``times`` heartbeats after it was made."""
    from datetime import timedelta

    from django.db.models import F

    from tests.faults.target import HEARTBEAT

    def check() -> bool:
        return (
            scenario.fleet.rows()
            .filter(
                pid=pid,
                last_heartbeat_at__gte=F("created_at") + timedelta(seconds=times * HEARTBEAT),
            )
            .exists()
        )

    return check


def lone_jobs(scenario: Scenario, count: int, seconds: float) -> list[str]:
    return [
        scenario.target.enqueue(tasks.ledger.using(queue_name="lone"), seconds=seconds).id
        for _ in range(count)
    ]


def ran_in(scenario: Scenario, ids: list[str], pid: int) -> list[str]:
    runs = scenario.ledger.executions()
    return [job for job in ids for run in runs.get(job, []) if run.pid == pid]


def test_an_idle_worker_cut_off_alone_is_pruned_on_time_and_fenced_when_back(partitioned):
    s = partitioned
    supervisor = s.fleet.supervise("--processes", "1", "--queues", "default", children=3)
    lone = s.fleet.work("--threads", "2", "--queues", "lone")
    s.wait(beaten(s, lone.pid), timeout=30, what="the lone worker to beat")

    s.proxy.isolate(lone.pid)
    cut_at = time.monotonic()
    ids = lone_jobs(s, 3, 0.2)  # only the lone worker serves this queue
    # Pruned on time by the supervisor, which kept its link: within the threshold, a sweep
    # (an interval) and the pruner's statements.
    pruned = s.recover(
        lambda: not row_of(lone.pid),
        since=cut_at,
        bound=2 * ALIVE + 3,
        what="the lone to be pruned",
    )
    if pruned:
        while time.monotonic() < cut_at + ALIVE + 3:
            time.sleep(0.2)  # the partition lasts a while longer
    s.proxy.rejoin(lone.pid)
    try:
        code = lone.wait(timeout=20)
    except AssertionError:
        code = None
    # It holds nothing, so either end is safe: fenced once back (its timer stopped, its loop
    # turning), or ended by the kernel at its deadline because its main loop hung on the
    # dead link (a stalled loop always ends, to be replaced). Never still running, never
    # claiming.
    s.expect(
        code in (EXIT_FENCED, -signal.SIGALRM),
        f"the pruned lone worker exited {code}, neither fenced (3) nor ended at its deadline",
    )
    s.expect(not ran_in(s, ids, lone.pid), "the pruned lone worker claimed jobs once back")

    rescuer = s.fleet.work("--threads", "2", "--queues", "lone")
    s.wait(all_finished(ids), timeout=20, what="the lone jobs to run elsewhere")
    s.stop(rescuer)
    s.stop(supervisor)
    s.conclude(successful(ids))


def test_a_busy_worker_cut_off_alone_is_ended_before_anyone_may_prune_it(partitioned):
    s = partitioned
    supervisor = s.fleet.supervise("--processes", "1", "--queues", "default", children=3)
    lone = s.fleet.work("--threads", "1", "--queues", "lone")
    ids = lone_jobs(s, 1, 20.0)
    s.wait(running(ids, 1), timeout=15, what="the lone worker's job to start")
    s.wait(beaten(s, lone.pid), timeout=30, what="the lone worker to beat")
    rescuer = s.fleet.work("--threads", "1", "--queues", "lone")

    s.proxy.isolate(lone.pid)
    cut_at = time.monotonic()
    died_at = pruned_at = None
    deadline = cut_at + ALIVE + 6
    while time.monotonic() < deadline and (died_at is None or pruned_at is None):
        now = time.monotonic()
        if died_at is None and lone.process.poll() is not None:
            died_at = now
        if pruned_at is None and not row_of(lone.pid):
            pruned_at = now
        time.sleep(0.05)  # sampling both moments
    s.expect(died_at is not None, "the lone worker running a body outlived the threshold")
    s.expect(
        lone.process.returncode == -signal.SIGALRM,
        f"the lone worker exited {lone.process.returncode}, not by SIGALRM",
    )
    s.expect(
        died_at is not None and (pruned_at is None or died_at < pruned_at),
        f"the lone worker was pruned ({pruned_at}) before it ended ({died_at})",
    )
    s.proxy.rejoin(lone.pid)
    ended = time.monotonic()
    s.recover(all_finished(ids), since=ended, bound=30, what="the job to run elsewhere")
    s.stop(rescuer)
    s.stop(supervisor)
    s.conclude(successful(ids), reruns=True)


def test_a_tree_worker_cut_off_alone_after_its_body_ended_charges_its_job_nothing(partitioned):
    s = partitioned
    job = s.target.enqueue(tasks.ledger, seconds=1.5).id
    Job.objects.using(ALIAS).filter(pk=job).update(max_attempts=1)  # before anyone claims it
    supervisor = s.fleet.supervise("--processes", "1", "--threads", "1", children=3)
    s.wait(running([job], 1), timeout=15, what="the job to start")
    worker = owner_pid(job)
    s.expect(worker is not None, "no worker holds the job")
    s.proxy.isolate(worker)  # its body ends in the partition: its outcome waits to be written
    cut_at = time.monotonic()
    while time.monotonic() < cut_at + ALIVE + 3:
        time.sleep(0.2)  # the partition lasts past the threshold
    s.proxy.rejoin(worker)
    ended = time.monotonic()
    s.recover(all_finished([job]), since=ended, bound=20, what="the job to finish")
    row = Job.objects.using(ALIAS).get(pk=job)
    s.expect(
        row.status == "successful" and not row.errors,
        f"the job, whose body ran to its end, was charged for its worker's link: "
        f"{row.status} {[error['exception_class_path'] for error in row.errors]}",
    )
    s.stop(supervisor)
    s.conclude({job: "successful"}, reruns=True)


@pytest.mark.parametrize("pruner", ["supervise", "work"])
def test_a_pruner_whose_own_link_flaps_still_prunes_a_dead_worker(partitioned, pruner):
    s = partitioned
    lone = s.fleet.work("--threads", "1", "--queues", "lone")
    ids = lone_jobs(s, 1, 10.0)
    s.wait(running(ids, 1), timeout=15, what="the lone worker's job to start")
    # The only pruners left once the lone worker is dead: a tree, or a standalone worker
    # (which does the chores itself), serving every queue.
    if pruner == "supervise":
        pruning = s.fleet.supervise("--processes", "1", children=3)
    else:
        pruning = s.fleet.work("--threads", "1")
    lone.signal(signal.SIGKILL)
    lone.wait(timeout=10)
    killed_at = time.monotonic()

    # The pruners' link is reset every 1.5 s, a brief failover each time: they reconnect at
    # once, and beat on; nothing of them looks silent.
    stop = threading.Event()

    def flap() -> None:
        while not stop.wait(1.5):
            s.proxy.cut()

    flapper = threading.Thread(target=flap, daemon=True)
    flapper.start()
    try:
        # The dead worker's row goes (its job back) however long the flapping lasts: a
        # pruner waits at most two thresholds after its own outages began, then judges.
        s.recover(
            lambda: not row_of(lone.pid),
            since=killed_at,
            bound=6 * ALIVE + 4,  # its bound (2 thresholds' wait, a threshold), 2x for load
            what="the dead lone worker to be pruned while the pruners' link flaps",
        )
    finally:
        stop.set()
        flapper.join()
    s.wait(all_finished(ids), timeout=30, what="the job to run again once the link is steady")
    s.stop(pruning)
    s.conclude(successful(ids), reruns=True)


def test_a_tree_cut_off_whose_worker_dies_meanwhile_strands_nothing(proxied):
    """The whole tree's link hangs past the threshold, and its worker is killed meanwhile:
    once the link is back the supervisor gives the dead worker's job back (it reaped it; no
    prune is needed). Idle children whose loops hung on the stalled link may have been ended
    at their deadline and replaced (a stalled loop always ends); nothing is stranded."""
    s = proxied
    supervisor = s.fleet.supervise("--processes", "1", "--threads", "1", children=3)
    ids = ledger_jobs(s, 1, 6.0, scaled=False)
    s.wait(running(ids, 1), timeout=15, what="the job to start")
    worker = owner_pid(ids[0])
    s.proxy.stall()
    stalled_at = time.monotonic()
    os.kill(worker, signal.SIGKILL)
    while time.monotonic() < stalled_at + ALIVE + 2:
        time.sleep(0.2)  # the stall lasts past the threshold
    s.proxy.unstall()
    ended = time.monotonic()
    s.recover(all_finished(ids), since=ended, bound=ALIVE + 6 + 6, what="the job to run again")
    s.stop(supervisor)
    s.conclude(successful(ids), reruns=True)


def test_an_idle_worker_cut_off_alone_stops_promptly_when_asked(partitioned):
    """TERM to a worker that runs nothing, cut off alone past its suspension (its timer
    stopped): the stop's writes cannot go through; it must still end within the shutdown
    timeout and a few thresholds (before, the kernel ended it at its deadline)."""
    s = partitioned
    supervisor = s.fleet.supervise("--processes", "1", "--queues", "default", children=3)
    lone = s.fleet.work("--threads", "2", "--queues", "lone")
    s.wait(beaten(s, lone.pid), timeout=30, what="the lone worker to beat")
    s.proxy.isolate(lone.pid)
    cut_at = time.monotonic()
    while time.monotonic() < cut_at + ALIVE - 1:
        time.sleep(0.1)  # past its suspension (2 s): its timer is stopped (its log says so)
    asked = time.monotonic()
    lone.signal(signal.SIGTERM)
    # The stop's writes each wait for a connection that cannot be made (a connect timeout,
    # a statement timeout's), a few times: bounded, however long the partition lasts.
    bound = SHUTDOWN_TIMEOUT + 3 * ALIVE
    try:
        code = lone.wait(timeout=bound + 5)
    except AssertionError:
        code = None
    took = time.monotonic() - asked
    s.expect(took <= bound, f"the cut-off idle worker took {took:.1f} s to stop (bound {bound})")
    s.expect(code is not None, "the cut-off idle worker never stopped")
    s.expect("action=kill_timer_disarmed" in lone.output, "the kill timer was never stopped")
    s.proxy.rejoin(lone.pid)
    s.wait(lambda: not row_of(lone.pid), timeout=2 * ALIVE, what="the lone worker's row to go")
    s.stop(supervisor)
    s.conclude({})


def test_dead_connections_with_no_reset_leave_no_idle_worker_hung(partitioned):
    """Every open connection of a tree goes dead without a reset (new ones work): jobs
    enqueued after that still run, within a few thresholds. An idle worker stops its kill
    timer; something must still end its calls hung on the dead link, or it waits for TCP
    to give up (minutes) where the kernel used to end it and its supervisor replace it."""
    s = partitioned
    supervisor = s.fleet.supervise("--processes", "1", "--threads", "2", children=3)
    for pid in s.fleet.os_children(supervisor):
        s.wait(beaten(s, pid), timeout=30, what=f"child {pid} to beat")
    stranded = s.proxy.strand()
    s.expect(stranded >= 4, f"only {stranded} links went dead")
    fault = time.monotonic()
    ids = ledger_jobs(s, 4, 0.2, scaled=False)
    s.recover(all_finished(ids), since=fault, bound=8 * ALIVE, what="new jobs to run")
    s.stop(supervisor)
    s.conclude(successful(ids), reruns=True)
