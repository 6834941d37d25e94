"""What every role shares: its process row and heartbeat, its signals, its title, its wake-ups,
its connection's session, and its way through database outages.

Signals: ``TERM`` and ``INT`` ask for a graceful stop (a repeated ``TERM`` changes nothing);
``QUIT`` asks for an immediate one, and so does an ``INT`` during a stop: a second Ctrl-C.
Handlers only set flags and wake the main loop.

The main loop runs its work in ``step()`` and waits in ``pause()``: a step that fails on the
database starts (or continues) an outage (``stalwart.processes.outage``), and the loop backs
off and carries on; waiting marks the loop idle, so the heartbeat (``Liveness``) can tell a
loop that waits from one that is stuck.
"""

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import psutil
import setproctitle
from django.db import connections

from stalwart import events, log
from stalwart.conf import Options
from stalwart.db import hints
from stalwart.db.deadline import cut
from stalwart.db.retry import lost_connections_to_the_caller
from stalwart.db.session import bookkeeping
from stalwart.deadlines import Deadlines
from stalwart.processes import forking, verdicts
from stalwart.processes.exits import EXIT_CRASHED, EXIT_FENCED, EXIT_OK, EXIT_RECYCLE  # noqa: F401
from stalwart.processes.heartbeat import Heartbeat
from stalwart.processes.liveness import Liveness
from stalwart.processes.outage import DatabaseFailure, Outage
from stalwart.processes.registry import Registration, process_name, stall_limit
from stalwart.processes.verdicts import Verdict
from stalwart.processes.wakeup import Waker

# What ``step()`` returns when the step failed on the database (it has waited its backoff).
FAILED: Any = object()


class Role:
    """A long-running process role. Subclasses implement ``main()``."""

    kind: ClassVar[str]
    # The supervisor beats from its own loop: it forks, and must hold no connection in
    # another thread when it does.
    heartbeat_in_thread: ClassVar[bool] = True
    # Seconds a connection attempt may take (None: as long as a statement may run).
    connect_timeout: ClassVar[int | None] = None

    def __init__(
        self,
        *,
        config: Options,
        name: str | None = None,
        supervisor: int | None = None,
        parent_pid: int | None = None,
        owns_process: bool = False,
    ):
        self.config = config
        self.database = config.database
        self.name = name or process_name(self.kind)
        self.registration = Registration(
            self.database, kind=self.kind, name=self.name, supervisor=supervisor
        )
        self.waker = Waker()
        self.stop_requested = False
        self.immediate = False
        self.interrupted = False  # the stop came from Ctrl-C (INT): a second one cuts it short
        self.fenced_reason: str | None = None
        self.exit_status = EXIT_OK
        self._title = ""
        self._heartbeat: Heartbeat | None = None
        self._psutil = psutil.Process()
        self.parent_pid = parent_pid
        # The role is the whole process (a forked child, 'queue work'), not a thread of
        # something else: it may set signal dispositions and be ended by the kernel.
        self.owns_process = owns_process
        self.outage = Outage(self.database, process=self.name)
        self._main_connection: Any = None  # the main loop's connection wrapper
        self._thread: threading.Thread | None = None  # the main loop's thread
        self.process_deadlines = Deadlines(
            interval=config.heartbeat_interval,
            threshold=config.process_alive_threshold,
            statement_timeout=config.statement_timeout,
        )
        self.liveness = Liveness(limit=self.process_deadlines.stall)
        # Beats overdue: claim nothing new until one goes through (see heartbeat.py).
        self.suspended = False
        # Held while deciding to claim, and by the heartbeat while it decides whether the
        # kernel's deadline must hold (``holds_running_work``).
        self.claim_gate = threading.Lock()
        # Our own word on a death that may come (see verdicts.py), in the row's metadata too.
        self.verdict: Verdict | None = None

    # -- control -----------------------------------------------------------------------------

    def request_stop(self, *, immediate: bool = False) -> None:
        """Ask the main loop to stop; safe from signal handlers and other threads."""
        self.stop_requested = True
        if immediate:
            self.immediate = True
        self.waker.wake()

    def fence(self, reason: str) -> None:
        """Our row is gone (we were pruned, our jobs given to others), or our deadline passed
        where no kernel timer ends us: stop at once. Writes of ours are fenced on owner and
        attempt, so none can touch what others now hold."""
        self.fenced_reason = reason
        self.exit_status = EXIT_FENCED
        events.emit("process_fenced", process=self.name, reason=reason)
        self.request_stop(immediate=True)
        if self._main_connection is not None and threading.current_thread() is not self._thread:
            # A main loop blocked on a stalled link would never see the stop: cut the link.
            cut(self._main_connection)

    def _cut_stalled_loop(self) -> None:
        """Our heartbeats are past the deadline and nothing here may run twice, so the
        kernel's timer is stopped: if the main loop is stuck (in a call on a dead link),
        cut its connection, so that it reconnects and sees a stop asked meanwhile."""
        if self.liveness.stalled and self._main_connection is not None:
            cut(self._main_connection)

    def suspend(self, suspended: bool) -> None:
        """Our heartbeats are overdue (True): claim nothing new; or go through again."""
        self.suspended = suspended
        self.waker.wake()

    def give_verdict(self, verdict: Verdict | None) -> None:
        """Say (or withdraw) why a death of ours now would not be our jobs' doing, or whose it
        would be: to our supervisor at once, and in our row with the next write."""
        self.verdict = verdict
        forking.tell_parent({"verdict": None if verdict is None else verdict.as_data()})

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, self._on_graceful_signal)
        signal.signal(signal.SIGINT, self._on_graceful_signal)
        signal.signal(signal.SIGQUIT, self._on_immediate_signal)
        if self.owns_process:
            # The heartbeat's hard deadline: SIGALRM's default action ends the process.
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
        for signum in forking.signals_before_start():
            self.request_stop(immediate=signum == signal.SIGQUIT)

    def _on_graceful_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            if self.stop_requested:
                # Ctrl-C again (or during a stop for TERM): stop now, as QUIT does.
                self.request_stop(immediate=True)
                return
            self.interrupted = True
        self.request_stop()

    def announce_stop(self, waiting: str) -> None:
        """After a first Ctrl-C, say on the terminal what the stop waits for, and how to cut
        it short (from the main loop: writing from a signal handler could interrupt a write
        in progress)."""
        if not self.interrupted or self.immediate or not self.owns_process:
            return
        sys.stderr.write(
            f"\nStopping: {waiting}. Press Ctrl-C again to stop now: jobs still running "
            "then go back to the queue once this process has ended.\n"
        )
        sys.stderr.flush()

    def _on_immediate_signal(self, signum: int, frame: Any) -> None:
        self.request_stop(immediate=True)

    # -- reporting ---------------------------------------------------------------------------

    def resident_memory(self) -> int:
        """Bytes of memory this process holds (RSS), 0 if it cannot be read."""
        try:
            return self._psutil.memory_info().rss
        except psutil.Error:
            return 0

    def metadata(self) -> dict[str, Any]:
        """What the process table shows about us (refreshed at every heartbeat)."""
        data: dict[str, Any] = {"rss_bytes": self.resident_memory() or None}
        if self.verdict is not None:
            data[verdicts.KEY] = self.verdict.as_data()
        if self.suspended:
            data["suspended"] = True
        failing_for = self.outage.failing_for
        if failing_for is not None:
            # The loop cannot do its work (the heartbeat can): 'queue status --check' says so.
            data["failing_for"] = round(failing_for, 1)
            data["error"] = (self.outage.error or "")[:500]
        return data

    def set_title(self, state: str) -> None:
        title = f"stalwart {self.kind} {state}".rstrip()
        if title != self._title:
            self._title = title
            setproctitle.setproctitle(title)

    # -- life --------------------------------------------------------------------------------

    def application_name(self, thread: str = "") -> str:
        """How our sessions appear in ``pg_stat_activity``: ``stalwart:worker:4242``."""
        name = f"stalwart:{self.kind}:{os.getpid()}"
        return f"{name}:{thread}" if thread else name

    def open_session(
        self, thread: str = "", *, main: bool = False, database: str | None = None
    ) -> None:
        """Make this thread's connection a bookkeeping session (see ``stalwart.db.session``);
        statements of the main loop count as its progress. ``database``: another alias than
        the queue's (the listener's ``listen_database``), reached directly."""
        if main:
            self._main_connection = connections[self.database]
            self._thread = threading.current_thread()
        bookkeeping(
            database or self.database,
            application_name=self.application_name(thread),
            statement_timeout=self.config.statement_timeout,
            lock_timeout=self.config.lock_timeout,
            on_statement=self.liveness.progressed if main else None,
            connect_timeout=self.connect_timeout,
            pooled=self.config.transaction_pooler and database is None,
        )

    def step[T](self, work: Callable[[], T]) -> T:
        """Run one step of the main loop. A database failure is an outage, not a crash: the
        connection is reset if broken, the outage logged once, and the loop waits its backoff
        (a lost connection is not retried within the step: the loop does it); then
        ``FAILED`` is returned. Anything else propagates."""
        began = time.monotonic()
        try:
            with lost_connections_to_the_caller():
                value = work()
        except DatabaseFailure as error:
            self.pause(self.outage.failed(error))
            return FAILED
        self.outage.succeeded()
        if time.monotonic() - began > stall_limit(self.config):
            self.outage.stalled()  # it waited for the database so long that others did too
        self.liveness.progressed()
        return value

    def pause(self, seconds: float) -> bool:
        """Wait up to ``seconds`` (less if woken); return whether woken."""
        self.liveness.idle()
        try:
            return self.waker.wait(seconds)
        finally:
            self.liveness.busy()

    def run(self) -> int:
        """Register, run ``main()`` until stopped, deregister. Returns the exit status."""
        if self.owns_process:
            log.run_in_background()  # a log handler that blocks must not stall our loops
        self.install_signal_handlers()
        self.set_title("starting")
        self.prepare()
        self.open_session(main=True)
        if not self._register():
            return self.exit_status  # asked to stop before the database let us register
        events.emit(
            "process_started",
            kind=self.kind,
            process=self.name,
            id=self.registration.id,
            pid=os.getpid(),
        )
        if self.heartbeat_in_thread:
            self._heartbeat = Heartbeat(
                self.registration,
                deadlines=self.process_deadlines,
                metadata=self.metadata,
                on_fenced=self.fence,
                on_suspended=self.suspend,
                on_verdict=self.give_verdict,
                liveness=self.liveness,
                hard_exit=self.owns_process,
                session=lambda: self.open_session("heartbeat"),
                holding=self.holds_running_work,
                gate=self.claim_gate,
                running=self.running_tasks,
                unhang=self._cut_stalled_loop,
            )
            self._heartbeat.start()
        if self.parent_pid is not None:
            ParentWatch(self.parent_pid, self.on_parent_gone).start()
        try:
            self.main()
        except BaseException:
            if self.exit_status == EXIT_OK:
                self.exit_status = EXIT_CRASHED
            raise
        finally:
            # Stop beating before the row goes, or a last beat would find it gone and fence us.
            # (Briefly: a beat stuck on a dead connection must not hold the exit up.)
            if self._heartbeat is not None:
                self._heartbeat.stop()
                self._heartbeat.join(min(self.config.heartbeat_interval, 2.0))
            # Give back what is still held while the row still says whose it is (so no orphan
            # sweep takes it first), then the row: the last writes before the process ends.
            # One try each on a lost or refused connection: the stop has a bound, and what
            # these leave undone a prune does once the row is silent.
            with lost_connections_to_the_caller():
                self.final_release()
                self._leave()
                self._add_counts()
            connections.close_all()  # this thread's; forked children must not keep them either
            events.emit(
                "process_stopped",
                kind=self.kind,
                process=self.name,
                status=self.exit_status,
                reason=self.fenced_reason,
            )
            self._ignore_late_stops()
        return self.exit_status

    def _ignore_late_stops(self) -> None:
        """The stop is done: a late TERM or Ctrl-C (the tail of a storm of them) must not
        turn this exit into a death by signal, as it would once Python's finalisation has
        put the default actions back in place of our handlers."""
        if self.owns_process and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, signal.SIG_IGN)

    def _add_counts(self) -> None:
        """Add what this process counted for the metrics (if they are on) before it ends."""
        from stalwart.metrics.tally import flush_all

        try:
            flush_all()
        except Exception as error:  # noqa: BLE001 - metrics never hold up a stop
            events.emit("metrics_not_stored", process=self.name, error=str(error))

    def _register(self) -> bool:
        """Register our row, waiting out a database outage (and saying so, once); False if
        stopped first. Stalwart's tables missing for longer than ``process_alive_threshold``
        (time for a deploy's ``migrate`` to finish) is no outage: the error is raised, and
        the command exits with it."""
        missing_since: float | None = None
        while not self.stop_requested:
            try:
                with lost_connections_to_the_caller():
                    self.registration.register(self.metadata())
            except DatabaseFailure as error:
                delay = self.outage.failed(error)
                if self.outage.failures == 1:
                    # (What failed, and what to do, is the outage's line, just before.)
                    events.emit(
                        "process_waiting_for_database",
                        kind=self.kind,
                        process=self.name,
                        reason="it has not registered: it starts once the database answers",
                    )
                if hints.classify(error) != hints.MISSING_TABLES:
                    missing_since = None
                else:
                    now = time.monotonic()
                    missing_since = now if missing_since is None else missing_since
                    if now - missing_since >= self.config.process_alive_threshold:
                        raise
                self.pause(delay)
                continue
            self.outage.succeeded()
            return True
        return False

    def _leave(self) -> None:
        """Take our row off the table, unless jobs may still run in this process: then mark
        it as leaving and let whoever is sure we are gone (the supervisor that reaps us, or
        a prune once our heartbeat is old) give our jobs back, without charging them an
        attempt. A fenced process leaves its row alone: it may be gone already."""
        if self.fenced_reason is not None:
            return
        try:
            if self.abandons_jobs():
                self.registration.mark_leaving(self.metadata())
                return
            self.registration.deregister()
        except DatabaseFailure as error:
            # Left behind, the row is pruned once its heartbeat is old enough.
            events.emit("deregister_failed", process=self.name, error=str(error))
            return
        if self._heartbeat is not None:
            self._heartbeat.disarm()

    def prepare(self) -> None:
        """Before the process registers (so before anything may take it for dead): load what
        it needs that runs the application's code (a worker's task modules)."""

    def abandons_jobs(self) -> bool:
        """Whether this process ends with jobs still running in its threads."""
        return False

    def holds_running_work(self) -> bool:
        """Whether a job's body runs in this process, or is about to (asked with
        ``claim_gate`` held). While none does, a long outage does not end the process at
        the kernel's deadline (see heartbeat.py). Roles that run no jobs: False."""
        return False

    def running_tasks(self) -> list[str]:
        """The task paths of the jobs this process runs now (any thread may ask)."""
        return []

    def main(self) -> None:
        raise NotImplementedError

    def final_release(self) -> None:
        """Give back anything still held, just before deregistering and ending."""

    def on_parent_gone(self) -> None:
        """Our supervisor died: stop gracefully, as if it had sent TERM."""
        events.emit("parent_gone", process=self.name, parent=self.parent_pid)
        self.request_stop()


class ParentWatch(threading.Thread):
    """Notices when the supervisor that forked us is gone (we were re-parented)."""

    def __init__(self, parent_pid: int, on_gone: Callable[[], None], interval: float = 0.5):
        super().__init__(name="stalwart-parent-watch", daemon=True)
        self.parent_pid = parent_pid
        self.on_gone = on_gone
        self.interval = interval

    def run(self) -> None:
        while os.getppid() == self.parent_pid:
            time.sleep(self.interval)  # a poll of the parent pid, not a synchronisation
        self.on_gone()
