"""The supervisor: forks workers, dispatchers and a scheduler, reaps them, replaces them.

It heartbeats and prunes dead processes from its own loop (it holds no connection when it
forks). A child that exits is reaped at once with ``waitpid(WNOHANG)``; the jobs it held are
released (or failed, at their last attempt) and a replacement is forked, with backoff if
children keep dying young. TERM/INT are forwarded to the children, which drain; the
supervisor exits only after they have, killing any that outlive the shutdown timeout.
"""

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError

from stalwart import events
from stalwart.conf import Options
from stalwart.db.errors import is_transient
from stalwart.processes import systemd
from stalwart.processes.base import EXIT_CRASHED, EXIT_FENCED, EXIT_RECYCLE, Role
from stalwart.processes.forking import fork_child
from stalwart.processes.registry import prune_under_lease, remove_reaped_child

# How long a child must live for its next death to count as a fresh start, not a crash loop.
HEALTHY_LIFETIME = 30.0
MAX_RESTART_DELAY = 30.0
# A child recycled sooner than this (say, max_memory_mb below its size at start) is restarted
# with backoff like a crash, not in a tight loop.
MIN_RECYCLE_LIFETIME = 5.0
# Extra time children get past the shutdown timeout to release their jobs and deregister.
SHUTDOWN_GRACE = 5.0


@dataclass
class ChildSlot:
    """One child the configuration asks for, and the process currently filling it."""

    kind: str
    number: int
    make: Callable[[int, int], Role]  # (supervisor id, supervisor pid) -> the child's role
    pid: int | None = None
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

    def __init__(self, *, config: Options, slots: list[ChildSlot], **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.slots = slots
        self._next_beat = 0.0
        self._watchdog = systemd.watchdog_interval()
        self._next_watchdog = 0.0
        self._pending_clean_ups: list[tuple[int, str, str, bool]] = []
        self._last_beat = time.monotonic()

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
        signal.signal(signal.SIGCHLD, lambda signum, frame: self.waker.wake())
        for slot in self.slots:
            self._start(slot)
        systemd.notify(
            f"READY=1\nSTATUS=supervising {len(self.slots)} processes\nMAINPID={os.getpid()}"
        )
        try:
            while not self.stop_requested:
                self._reap()
                self._retry_clean_ups()
                self._restart_due()
                self._maintain()
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
        deadlines = [self._next_beat]
        deadlines += [slot.restart_at for slot in self.slots if slot.pid is None]
        if self._watchdog:
            deadlines.append(self._next_watchdog)
        return min(max(min(deadlines) - now, 0.01), 1.0)

    def _maintain(self, *, chores: bool = True) -> None:
        """Watchdog pings, heartbeats (fencing ourselves if they fail too long), pruning."""
        now = time.monotonic()
        if self._watchdog and now >= self._next_watchdog:
            systemd.notify("WATCHDOG=1")
            self._next_watchdog = now + self._watchdog
        if now < self._next_beat or self.fenced_reason is not None:
            return
        self._next_beat = now + self.config.heartbeat_interval
        try:
            if not self.registration.heartbeat(self.metadata()):
                self.fence("its process row is gone (pruned as dead)")
                return
            self._last_beat = time.monotonic()
        except DatabaseError as error:
            if not is_transient(error):
                raise
            events.emit(
                "heartbeat_failed", process=self.name, error=f"{type(error).__name__}: {error}"
            )
            failing_for = time.monotonic() - self._last_beat
            if failing_for > self.config.process_alive_threshold:
                self.fence(f"heartbeats have failed for {failing_for:.0f} s")
            return
        if not chores:
            return
        try:
            prune_under_lease(
                self.database,
                holder=self.name,
                threshold=self.config.process_alive_threshold,
                interval=self.config.heartbeat_interval,
                exclude=self.registration.id,
            )
        except DatabaseError as error:
            if not is_transient(error):
                raise
            events.emit("chore_failed", process=self.name, chore="prune", error=str(error))

    # -- children ----------------------------------------------------------------------------

    def _start(self, slot: ChildSlot) -> None:
        supervisor_id, supervisor_pid = self.registration.id, os.getpid()

        def run_child() -> int:
            role = slot.make(supervisor_id, supervisor_pid)
            status = role.run()
            if getattr(role, "abandoned_threads", False):
                events.emit("threads_abandoned", process=role.name)
            return status

        slot.pid = fork_child(run_child)
        slot.started_at = time.monotonic()
        events.emit("process_forked", kind=slot.kind, slot=slot.label, pid=slot.pid)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            slot = next((slot for slot in self.slots if slot.pid == pid), None)
            self._child_exited(pid, status, slot)

    def _clean_up_after(self, pid: int, how: str, kind: str, expected: bool = False) -> bool:
        """Release what a dead child held and drop its row; False if the database is away."""
        try:
            gone = remove_reaped_child(
                self.database, supervisor=self.registration.id, pid=pid, cause=f"died: it {how}"
            )
        except DatabaseError as error:
            if is_transient(error):
                return False  # the child is dead for sure: try again later
            # Give up here; the child's row stays and is pruned (its jobs released) later.
            events.emit("cleanup_failed", pid=pid, error=f"{type(error).__name__}: {error}")
            return True
        released = [job for process in gone for job in process.released]
        events.emit(
            "child_exited" if expected else "process_exited",
            kind=kind,
            pid=pid,
            how=how,
            released=sum(1 for job in released if not job.failed),
            failed=sum(1 for job in released if job.failed),
        )
        return True

    def _retry_clean_ups(self) -> None:
        # The child is dead for sure, so releasing its jobs late is still safe.
        self._pending_clean_ups = [
            entry for entry in self._pending_clean_ups if not self._clean_up_after(*entry)
        ]

    def _child_exited(self, pid: int, status: int, slot: ChildSlot | None) -> None:
        how = describe_exit(status)
        code = os.waitstatus_to_exitcode(status)
        kind = slot.kind if slot else "unknown"
        expected = code == EXIT_RECYCLE or (
            self.stop_requested and code in (0, EXIT_FENCED, EXIT_RECYCLE)
        )
        if not self._clean_up_after(pid, how, kind, expected):
            self._pending_clean_ups.append((pid, how, kind, expected))
        if slot is None:
            return
        lived = time.monotonic() - slot.started_at
        slot.last_pid = slot.pid
        slot.pid = None
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
        pending = {entry[0] for entry in self._pending_clean_ups}
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
        deadline = time.monotonic() + self.config.shutdown_timeout + SHUTDOWN_GRACE
        while any(slot.pid for slot in self.slots):
            self._reap()
            if not any(slot.pid for slot in self.slots):
                break
            if self.immediate and forwarded != signal.SIGQUIT:
                forwarded = signal.SIGQUIT
                self._signal_children(forwarded)
            if time.monotonic() >= deadline:
                # Killed, a child can no longer run anything: releasing its jobs is safe.
                self._signal_children(signal.SIGKILL)
                deadline = time.monotonic() + 10
            self._show_state()
            with contextlib.suppress(DatabaseError):
                self._maintain(chores=False)  # keep our row alive while the children drain
            self.waker.wait(0.2)
        deadline = time.monotonic() + 30
        while self._pending_clean_ups and time.monotonic() < deadline:
            self._retry_clean_ups()
            if self._pending_clean_ups:
                self.waker.wait(1.0)
        if self.fenced_reason is not None:
            self.exit_status = EXIT_FENCED
