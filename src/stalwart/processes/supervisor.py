"""The supervisor: forks workers, dispatchers and a scheduler, reaps them, replaces them.

It heartbeats and prunes dead processes from its own loop (it holds no connection when it
forks). A child that exits is reaped at once with ``waitpid(WNOHANG)``; the jobs it held are
released (a death is charged as ``Statements.release_owner`` says; a child that ended on its
own with jobs still running gives them back uncharged) and a replacement is forked, with
backoff if children keep dying young. Whatever the child's jobs started is ended with it
(its process group: TERM, then KILL). TERM/INT are forwarded to the children, which drain;
the supervisor exits only after they have, killing any that outlive the shutdown timeout.

The database may go away and come back (a restart, a failover): every call the supervisor
makes has a deadline, a failure is an outage (logged once, retried with backoff), and a
healthy tree is never stopped for it. If its row was pruned meanwhile, it registers again.
"""

import contextlib
import os
import signal
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stalwart import events
from stalwart.conf import Options
from stalwart.db.deadline import deadline
from stalwart.db.retry import lost_connections_to_the_caller
from stalwart.models import Process
from stalwart.processes import systemd, verdicts
from stalwart.processes.base import EXIT_CRASHED, EXIT_FENCED, EXIT_RECYCLE, Role
from stalwart.processes.forking import Forked, Report, end_group, fork_child, listen, report
from stalwart.processes.outage import DatabaseFailure
from stalwart.processes.registry import (
    may_prune,
    prune_under_lease,
    remove_reaped_child,
    report_given_back,
    stall_limit,
)
from stalwart.processes.verdicts import Verdict

# How long a child must live for its next death to count as a fresh start, not a crash loop.
HEALTHY_LIFETIME = 30.0
MAX_RESTART_DELAY = 30.0
# A child recycled sooner than this (say, max_memory_mb below its size at start) is restarted
# with backoff like a crash, not in a tight loop.
MIN_RECYCLE_LIFETIME = 5.0
# Extra time children get past the shutdown timeout to release their jobs and deregister.
SHUTDOWN_GRACE = 5.0
# How long what a dead child's jobs started gets between TERM and KILL.
GROUP_GRACE = 2.0
# How long a process group may outlive its KILL before its jobs are given back all the same
# (a process stuck in the kernel: KILLed, it runs no code of its own any more).
GROUP_GONE_TIMEOUT = 10.0


@dataclass(frozen=True, slots=True)
class CleanUp:
    """A dead child whose row and jobs are still to be dealt with."""

    pid: int
    how: str  # how it ended, in words ("was killed by SIGKILL")
    kind: str
    expected: bool  # an end it was asked for (a stop, a recycle), not a death
    report: Report  # what it said on its status pipe


@dataclass
class GroupEnd:
    """What is left of a dead child's process group: KILLed at ``kill_at``; once KILLed,
    waited for until ``give_up_at``."""

    kill_at: float
    give_up_at: float | None = None


@dataclass
class ChildSlot:
    """One child the configuration asks for, and the process currently filling it."""

    kind: str
    number: int
    make: Callable[[int, int], Role]  # (supervisor id, supervisor pid) -> the child's role
    pid: int | None = None
    forked: Forked | None = None
    started_at: float = 0.0
    quick_deaths: int = 0
    restart_at: float = 0.0
    restart_delay: float = 0.0
    last_pid: int | None = None
    history: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.kind}-{self.number}"


def describe_exit(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}"


class Supervisor(Role):
    kind = "supervisor"
    heartbeat_in_thread = False
    # Its loop must keep reaping and pinging the watchdog while a link stalls: the shortest.
    connect_timeout = 2

    def __init__(self, *, config: Options, slots: list[ChildSlot], **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.slots = slots
        self._next_beat = 0.0
        self._watchdog = systemd.watchdog_interval()
        self._next_watchdog = 0.0
        # Every row id we have had (a long outage may have made us register again).
        self._ids: set[int] = set()
        # The newest verdict each living child told us and we wrote into its row (by pid).
        self._relayed: dict[int, dict | None] = {}
        # Dead children whose rows and jobs are not dealt with yet: each waits for its process
        # group to be empty, then for the database.
        self._pending_clean_ups: list[CleanUp] = []
        # Children collected (waitpid) and not yet handled: (pid, status).
        self._collected: deque[tuple[int, int]] = deque()
        # Process groups of dead children still holding processes: when to KILL them (then,
        # when to give up waiting for them to be gone).
        self._groups: dict[int, GroupEnd] = {}
        # A call to the database that takes longer has met a stalled link: it is cut.
        self._call_deadline = config.statement_timeout + 2.0
        self._database_retry_at = 0.0  # while an outage backs off: when to try again

    # -- reporting ---------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        return {
            **super().metadata(),
            "children": {slot.label: slot.pid for slot in self.slots},
        }

    def _show_state(self) -> None:
        alive = sum(1 for slot in self.slots if slot.pid)
        state = "stopping" if self.stop_requested else "running"
        self.set_title(f"{state}, {alive} of {len(self.slots)} children")

    # -- the loop ----------------------------------------------------------------------------

    def main(self) -> None:
        signal.signal(signal.SIGCHLD, self._on_child_signal)
        for slot in self.slots:
            self._start(slot)
        systemd.notify(
            f"READY=1\nSTATUS=supervising {len(self.slots)} processes\nMAINPID={os.getpid()}"
        )
        try:
            while not self.stop_requested:
                self._reap()
                self._ping_watchdog()
                self._end_groups()
                self._database_turn()
                self._restart_due()
                self._show_state()
                self.waker.wait(self._sleep_time())
        except BaseException:
            # Whatever broke the loop, the children are not left unattended.
            self.exit_status = EXIT_CRASHED
            self.request_stop(immediate=True)
            raise
        finally:
            systemd.notify("STOPPING=1")
            self._stop_children()

    def _sleep_time(self) -> float:
        now = time.monotonic()
        deadlines = [
            self._next_beat,
            *(end.give_up_at or end.kill_at for end in self._groups.values()),
        ]
        deadlines += [slot.restart_at for slot in self.slots if slot.pid is None]
        if self._pending_clean_ups:
            deadlines.append(self._database_retry_at)
        if self._watchdog:
            deadlines.append(self._next_watchdog)
        return min(max(min(deadlines) - now, 0.01), 1.0)

    def _ping_watchdog(self) -> None:
        """systemd's watchdog hears from us at each turn of the loop, whatever the database
        does: the loop turns at least once a second, and a call to the database blocks it
        for at most a connection timeout or a call deadline."""
        now = time.monotonic()
        if self._watchdog and now >= self._next_watchdog:
            systemd.notify("WATCHDOG=1")
            self._next_watchdog = now + self._watchdog

    def _database_turn(self, *, chores: bool = True) -> None:
        """Everything the supervisor asks of the database, once per turn: the clean-ups of
        dead children, its heartbeat, pruning. Each call has a deadline; the first failure
        is an outage to wait out (never a reason to stop the tree), and ends the turn, so a
        stalled link costs one deadline per backoff, not one per call."""
        now = time.monotonic()
        if now < self._database_retry_at:
            return
        try:
            with lost_connections_to_the_caller():
                self._database_calls(now, chores=chores)
        except DatabaseFailure as error:
            self._database_retry_at = time.monotonic() + self.outage.failed(error)
            self._next_beat = min(self._next_beat, self._database_retry_at)
            return
        self.outage.succeeded()

    def _database_calls(self, now: float, *, chores: bool) -> None:
        self._clean_up_all()
        if now < self._next_beat:
            return
        self._next_beat = now + self.config.heartbeat_interval
        began = time.monotonic()
        self._beat()
        if time.monotonic() - began > stall_limit(self.config):
            # Our beat waited that long for the database: so did everyone's. Whoever looks
            # silent now may have lived through it: no prune judges them before a threshold.
            self.outage.stalled()
        self._relay_verdicts()
        if not chores:
            return
        # Children that died meanwhile are reaped and cleaned up first: a dead child is the
        # supervisor's to release, not a pruner's.
        self._reap()
        self._clean_up_all()
        if not may_prune(self.outage, self.config, self.name):
            return
        with deadline(self.database, self._call_deadline):
            prune_under_lease(
                self.database,
                holder=self.name,
                threshold=self.config.process_alive_threshold,
                interval=self.config.heartbeat_interval,
                exclude=self.registration.id,
            )

    def _relay_verdicts(self) -> None:
        """Write into each living child's row the newest word it told us on its pipe about a
        death that may come (``verdicts.py``). A child cut off from the database alone says
        so to us, but cannot write it where a pruner looks: without this, a pruner (we, or
        another host's) would take its silence for a crash and charge its jobs. The write
        is a compare-and-set on the row's last heartbeat: a newer beat carries the child's
        own, newer word."""
        for slot in self.slots:
            if slot.pid is None or slot.forked is None:
                continue
            told = listen(slot.forked).verdict
            if told is None or told == self._relayed.get(slot.pid):
                continue
            rows = Process.objects.using(self.database).filter(
                supervisor__in=self._ids, pid=slot.pid
            )
            for row in rows:
                if (row.metadata or {}).get(verdicts.KEY) != told:
                    Process.objects.using(self.database).filter(
                        id=row.id, last_heartbeat_at=row.last_heartbeat_at
                    ).update(metadata={**(row.metadata or {}), verdicts.KEY: told})
            self._relayed[slot.pid] = told

    def _beat(self) -> None:
        with deadline(self.database, self._call_deadline):
            if self.registration.heartbeat(self.metadata()):
                return
            # Pruned while we lived (a long outage): our children are alive and beating;
            # take a new row rather than stop them.
            old = self.registration.id
            self._ids.add(self.registration.reregister(self.metadata()))
        events.emit("process_reregistered", process=self.name, old_id=old, id=self.registration.id)

    # -- children ----------------------------------------------------------------------------

    def _start(self, slot: ChildSlot) -> None:
        supervisor_id, supervisor_pid = self.registration.registered_id, os.getpid()
        self._ids.add(supervisor_id)

        def run_child() -> int:
            role = slot.make(supervisor_id, supervisor_pid)
            status = role.run()
            if getattr(role, "abandoned_threads", False):
                events.emit("threads_abandoned", process=role.name)
            return status

        slot.forked = fork_child(run_child)
        slot.pid = slot.forked.pid
        slot.started_at = time.monotonic()
        events.emit("process_forked", kind=slot.kind, slot=slot.label, pid=slot.pid)

    def _on_child_signal(self, signum: int, frame: Any) -> None:
        """A child exited: collect it now, even while the loop waits on the database (the
        driver's waits return to Python often enough for handlers to run), so that no child
        stays a zombie for as long as a stalled call lasts. The rest happens in the loop."""
        self._collect()
        self.waker.wake()

    def _collect(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self._collected.append((pid, status))

    def _reap(self) -> None:
        self._collect()
        while self._collected:
            pid, status = self._collected.popleft()
            slot = next((slot for slot in self.slots if slot.pid == pid), None)
            self._child_exited(pid, status, slot)

    def _clean_up_all(self) -> None:
        """Release what dead children held and drop their rows, oldest first, each once its
        process group is empty (nothing of the child may run when its jobs go back). The
        child is dead for sure, so releasing its jobs late is still safe; a failure (an
        outage) leaves the rest for a later turn."""
        while self._pending_clean_ups:
            ready = next(
                (entry for entry in self._pending_clean_ups if entry.pid not in self._groups),
                None,
            )
            if ready is None:
                return
            self._clean_up_after(ready)
            self._pending_clean_ups.remove(ready)

    def _clean_up_after(self, entry: CleanUp) -> None:
        with deadline(self.database, self._call_deadline):
            gone = remove_reaped_child(
                self.database,
                supervisors=sorted(self._ids),
                pid=entry.pid,
                cause=f"{'ended' if entry.report.ended else 'died'}: it {entry.how}",
                told=Verdict.from_data(entry.report.verdict),
                ended=entry.report.ended,
            )
        for process in gone:
            report_given_back(process.released, process=process.name)
        released = [job for process in gone for job in process.released]
        events.emit(
            "child_exited" if entry.expected else "process_exited",
            kind=entry.kind,
            pid=entry.pid,
            how=entry.how,
            released=sum(1 for job in released if not job.failed),
            failed=sum(1 for job in released if job.failed),
        )

    def _end_groups(self, *, now: bool = False) -> None:
        """KILL what is left in dead children's process groups once their grace is over, and
        forget a group once nothing is left in it (or it outlived the KILL for too long: a
        process stuck in the kernel, which runs no code of its own any more)."""
        moment = time.monotonic()
        for pgid, end in list(self._groups.items()):
            if not end_group(pgid, 0):
                del self._groups[pgid]  # empty
            elif end.give_up_at is None and (now or moment >= end.kill_at):
                end_group(pgid, signal.SIGKILL)
                end.give_up_at = moment + GROUP_GONE_TIMEOUT
            elif end.give_up_at is not None and moment >= end.give_up_at:
                events.emit("process_group_lingers", pgid=pgid, after=GROUP_GONE_TIMEOUT)
                del self._groups[pgid]

    def _child_exited(self, pid: int, status: int, slot: ChildSlot | None) -> None:
        how = describe_exit(status)
        code = os.waitstatus_to_exitcode(status)
        kind = slot.kind if slot else "unknown"
        # What it said before it ended: whether its role returned (jobs it left running were
        # given up on purpose), and its verdict on a death (whose doing it would be).
        said = report(slot.forked) if slot is not None and slot.forked is not None else Report()
        expected = said.ended and (
            code == EXIT_RECYCLE or (self.stop_requested and code in (0, EXIT_FENCED))
        )
        # Whatever its jobs started does not outlive it, and its jobs wait until it is gone.
        if end_group(pid, signal.SIGTERM):
            self._groups[pid] = GroupEnd(kill_at=time.monotonic() + GROUP_GRACE)
        # Its row and jobs are dealt with in the loop's database turn: reaping never waits on
        # the database.
        self._pending_clean_ups.append(CleanUp(pid, how, kind, expected, said))
        self._relayed.pop(pid, None)
        if slot is None:
            return
        lived = time.monotonic() - slot.started_at
        slot.last_pid = slot.pid
        slot.pid = None
        slot.forked = None
        if self.stop_requested:
            return
        if (
            code == 0
            or lived >= HEALTHY_LIFETIME
            or (code == EXIT_RECYCLE and lived >= MIN_RECYCLE_LIFETIME)
        ):
            slot.quick_deaths = 0
            delay = 0.0
        else:
            slot.quick_deaths += 1
            delay = min(0.5 * 2 ** (slot.quick_deaths - 1), MAX_RESTART_DELAY)
        slot.restart_at = time.monotonic() + delay
        slot.restart_delay = delay
        slot.history.append(how)

    def _restart_due(self) -> None:
        if self.stop_requested:
            return
        now = time.monotonic()
        # A dead child's clean-up goes by (supervisor, pid): no new child until it is done,
        # so a reused pid can never be taken for the dead one.
        pending = {entry.pid for entry in self._pending_clean_ups}
        for slot in self.slots:
            if slot.pid is None and now >= slot.restart_at and slot.last_pid not in pending:
                self._start(slot)
                events.emit(
                    "process_replaced",
                    slot=slot.label,
                    pid=slot.pid,
                    delay=slot.restart_delay,
                    after=slot.history[-1] if slot.history else None,
                )

    def _signal_children(self, signum: int) -> None:
        for slot in self.slots:
            if slot.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(slot.pid, signum)

    def _stop_children(self) -> None:
        """Forward the stop to every child, wait for them, kill what outlives the timeout."""
        forwarded = signal.SIGQUIT if self.immediate else signal.SIGTERM
        self._signal_children(forwarded)
        self.announce_stop(
            f"waiting up to {self.config.shutdown_timeout:g} s for the workers' running jobs "
            "to finish"
        )
        stopping = time.monotonic()
        stop_by = stopping + self.config.shutdown_timeout + SHUTDOWN_GRACE
        while any(slot.pid for slot in self.slots):
            self._reap()
            if not any(slot.pid for slot in self.slots):
                break
            if self.immediate and forwarded != signal.SIGQUIT:
                forwarded = signal.SIGQUIT
                self._signal_children(forwarded)
            if time.monotonic() >= stop_by:
                # Killed, a child can no longer run anything: releasing its jobs is safe.
                self._signal_children(signal.SIGKILL)
                stop_by = time.monotonic() + 10
            self._show_state()
            self._ping_watchdog()
            self._database_turn(chores=False)  # our row alive while the children drain
            self.waker.wait(0.2)
        # What the children's jobs started got TERM at each death, and KILL after a grace:
        # their jobs go back once it is gone.
        while self._groups:
            self._end_groups()
            if self._groups:
                self.waker.wait(0.1)
        # The clean-ups get what is left of the documented bound (and one try at least); what
        # the database will not take by then is a prune's to do, once the rows fall silent.
        give_up_at = stopping + self.config.shutdown_timeout + SHUTDOWN_GRACE
        while self._pending_clean_ups:
            self._database_retry_at = 0.0  # no backoff left to respect: we are leaving
            self._database_turn(chores=False)
            if not self._pending_clean_ups or time.monotonic() >= give_up_at:
                break
            self.waker.wait(min(1.0, max(give_up_at - time.monotonic(), 0.0)))
        if self._pending_clean_ups:
            events.emit(
                "clean_up_left",
                process=self.name,
                children=len(self._pending_clean_ups),
                error=self.outage.error,
                reason="the database could not be reached before the stop's bound: their "
                "rows are pruned, and their jobs given back, once they are silent",
            )
        if self.fenced_reason is not None:
            self.exit_status = EXIT_FENCED
