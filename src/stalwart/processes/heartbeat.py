"""The heartbeat: proves a process alive, and ends it before others may take it for dead.

Beats go out at a fixed rate, every ``interval`` seconds (a slow beat does not push the next
one back), but only while the role's main loop makes progress (``Liveness``): a stuck loop
gets no heartbeats. If the row is gone we were pruned: the process is fenced at once.

The deadlines are ``stalwart.deadlines``'s, counted from the sending of the last beat that
worked (the database's stamp is never earlier, so pruners count from a later moment):

- past ``suspend`` the process stops claiming (``on_suspended``), and claims again as soon
  as a beat goes through: a slow or briefly unreachable database slows it, never kills it;
- at ``kill``, strictly before anyone may prune it, the kernel ends it: a timer
  (``ITIMER_REAL``) re-armed by each beat that works delivers ``SIGALRM``, whose default
  action ends the process whatever its threads are doing, a task holding the GIL included.
  So a job never runs here and elsewhere at once for lack of a heartbeat.

Should the process die so, its jobs are charged by cause: while its beats fail, hang or are
withheld from a stalled loop, it says that the fault is not its jobs' (``on_verdict``, an
``INTERRUPTED`` verdict, withdrawn when a beat goes through). A process frozen as a whole
says nothing, and its death is a crash. A task that changes the kernel's timer (``alarm()``,
``setitimer(ITIMER_REAL)``) is found out at the next beat, said so, and the timer restored.

In a process that is not only a Stalwart role (a worker run in a thread of a test), nothing
is armed, and ``kill`` fences the role instead.
"""

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from stalwart import events
from stalwart.db.deadline import cut
from stalwart.deadlines import Deadlines
from stalwart.processes.liveness import Liveness
from stalwart.processes.outage import DatabaseFailure, Outage
from stalwart.processes.registry import Registration
from stalwart.processes.verdicts import Verdict, interrupted

# How far the kernel's timer may be from where we set it before we call it tampered with.
TIMER_TOLERANCE = 0.25


class Heartbeat(threading.Thread):
    def __init__(
        self,
        registration: Registration,
        *,
        deadlines: Deadlines,
        metadata: Callable[[], dict[str, Any]],
        on_fenced: Callable[[str], None],
        on_suspended: Callable[[bool], None] = lambda suspended: None,
        on_verdict: Callable[[Verdict | None], None] = lambda verdict: None,
        liveness: Liveness | None = None,
        hard_exit: bool = False,
        session: Callable[[], None] | None = None,
        holding: Callable[[], bool] | None = None,
        gate: threading.Lock | None = None,
        running: Callable[[], list[str]] = list,
        unhang: Callable[[], None] = lambda: None,
    ) -> None:
        super().__init__(name="stalwart-heartbeat", daemon=True)
        self.registration = registration
        self.deadlines = deadlines
        self.interval = deadlines.interval
        self.metadata = metadata
        self.on_fenced = on_fenced
        self.on_suspended = on_suspended
        self.on_verdict = on_verdict
        self.liveness = liveness
        self.hard_exit = hard_exit
        self.session = session
        # Whether a job's body runs here, or is about to (None: always assumed), asked with
        # ``gate`` held, the lock the role takes to decide whether to claim.
        self.holding = holding
        self.gate = gate if gate is not None else threading.Lock()
        self.running = running  # the task paths running now (named when the timer is changed)
        # With the kernel's timer stopped, what ends a call hung on a dead link: ours is cut
        # here, and ``unhang`` cuts the role's main loop's if that loop is stuck.
        self.unhang = unhang
        self._connection: Any = None  # this thread's connection wrapper, once it runs
        self.last_success = time.monotonic()  # the sending time of the last beat that worked
        self.suspended = False
        self.verdict: Verdict | None = None
        self._in_flight_since: float | None = None  # a beat sent and not yet answered
        self._withheld = False  # the last beat was withheld from a stalled main loop
        self._armed_until: float | None = None  # when the kernel's timer fires (monotonic)
        self.outage = Outage(
            registration.database,
            process=registration.name,
            started="heartbeat_failed",
            ended="heartbeat_recovered",
        )
        self._stop_event = threading.Event()
        self._watch = threading.Thread(target=self._guard, name="stalwart-fence", daemon=True)

    def start(self) -> None:
        self._arm(self.last_success)
        super().start()
        self._watch.start()

    def stop(self) -> None:
        """Stop beating. The kernel's deadline stays armed until ``disarm``."""
        self._stop_event.set()

    def disarm(self) -> None:
        """The process holds nothing any more: no need to end it at the deadline."""
        if self.hard_exit:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self._armed_until = None

    def run(self) -> None:
        self._connection = connections[self.registration.database]
        if self.session is not None:
            self.session()
        try:
            self._beat()
        finally:
            connections.close_all()  # this thread's own connection

    # -- beating -----------------------------------------------------------------------------

    def _beat(self) -> None:
        next_send = time.monotonic() + self.interval
        while not self._stop_event.wait(max(next_send - time.monotonic(), 0.0)):
            woke = time.monotonic()
            if woke - next_send > self.interval / 2 and self.liveness is not None:
                # We could not run for a while (the whole process was frozen: a task holding
                # the GIL, a stop signal, a starved machine): the loop's clock stood still
                # with ours, and it gets a fresh look.
                self.liveness.excuse()
            if self.liveness is not None and self.liveness.stalled:
                next_send = woke + self.interval
                self._withhold()
                continue  # no progress, no heartbeat: the deadlines take their course
            self._withheld = False
            self._check_timer()
            metadata = self.metadata()
            sent = time.monotonic()
            self._in_flight_since = sent
            try:
                alive = self.registration.heartbeat(metadata)
            except DatabaseFailure as error:
                self.outage.failed(error)
                continue
            finally:
                self._in_flight_since = None
                # A fixed rate: the next beat is due an interval after this one was due (at
                # once, if this one took longer than that).
                next_send = max(next_send + self.interval, time.monotonic())
            self.outage.succeeded()
            if self._stop_event.is_set():
                return  # a beat that came back after the stop: its row may be gone by now
            if not alive:
                self.on_fenced("its process row is gone (pruned as dead)")
                return
            with self.gate:  # armed, then claims may resume: in one step for the guard
                self.last_success = sent
                self._arm(sent)
                self._recovered()

    def _withhold(self) -> None:
        """The main loop is stalled: say so once, and that a death now would not be its jobs'
        doing (in the row too, where no supervisor hears us; without stamping it)."""
        if self._withheld or self.liveness is None:
            return
        self._withheld = True
        stalled_for = self.liveness.stalled_for
        events.emit("process_stalled", process=self.registration.name, stalled_for=stalled_for)
        self._set_verdict(interrupted(f"its main loop made no progress for {stalled_for:.1f} s"))
        try:
            self.registration.update_metadata(self.metadata())
        except DatabaseFailure as error:
            self.outage.failed(error)

    def _recovered(self) -> None:
        if self.suspended:
            self.suspended = False
            events.emit("process_resumed", process=self.registration.name)
            self.on_suspended(False)
        if self.verdict is not None:
            self._set_verdict(None)

    def _set_verdict(self, verdict: Verdict | None) -> None:
        if verdict != self.verdict:
            self.verdict = verdict
            self.on_verdict(verdict)

    # -- the kernel's deadline ---------------------------------------------------------------

    def _arm(self, sent: float) -> None:
        if self.hard_exit and not self._stop_event.is_set():
            # A change made since the last look would be overwritten unsaid: look first.
            self._check_timer()
            self._armed_until = sent + self.deadlines.kill
            remaining = self._armed_until - time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, max(remaining, 0.001))

    def _check_timer(self) -> None:
        """Whether a task changed the kernel's timer (``signal.alarm()``, ``setitimer``):
        if so, say so, and set it back to our deadline."""
        if not self.hard_exit or self._armed_until is None:
            return
        expected = self._armed_until - time.monotonic()
        remaining, _ = signal.getitimer(signal.ITIMER_REAL)
        if abs(remaining - expected) <= TIMER_TOLERANCE:
            return
        try:
            tasks = ",".join(sorted(set(self.running())))
        except Exception:  # noqa: BLE001 - naming suspects must never stop the beats
            tasks = ""
        events.emit(
            "kernel_timer_tampered",
            process=self.registration.name,
            tasks=tasks,
            found=round(remaining, 3),
            expected=round(expected, 3),
            reason="a task running here (one of tasks) called signal.alarm() or "
            "setitimer(ITIMER_REAL), which Stalwart's "
            "processes use to end themselves before they may be taken for dead; restored",
        )
        signal.setitimer(signal.ITIMER_REAL, max(expected, 0.001))

    # -- the guard ---------------------------------------------------------------------------

    def _guard(self) -> None:
        deadlines = self.deadlines
        while not self._stop_event.wait(min(self.interval / 4, 0.5)):
            now = time.monotonic()
            silent_for = now - self.last_success
            if silent_for <= deadlines.suspend:
                continue
            cause = self._beats_failing(now)
            if cause is not None:
                self._set_verdict(interrupted(cause))
            with self.gate:  # never between a beat's arming and its resuming claims
                if not self.suspended and time.monotonic() - self.last_success > deadlines.suspend:
                    self.suspended = True
                    events.emit(
                        "process_suspended",
                        process=self.registration.name,
                        silent_for=round(silent_for, 1),
                        reason=cause or "no heartbeat went out (the whole process was held up)",
                    )
                    self.on_suspended(True)
            if self.holding is not None and not self._hold_deadline():
                if silent_for > deadlines.kill:
                    self._cut_hung_calls(now)
                continue  # nothing runs here that could run twice: no need to end
            if not self.hard_exit and silent_for > deadlines.kill:
                self.on_fenced(f"no successful heartbeat for {silent_for:.1f} s")
                return

    def _hold_deadline(self) -> bool:
        """While silent past ``suspend`` (so claiming nothing): whether the deadline must
        hold. It must while a job's body runs here, or a claim is under way, or the main
        loop is stalled (beats withheld: a stuck process must end, to be replaced); otherwise the
        kernel's timer is stopped, so that an outage longer than the threshold ends no
        process that runs nothing (a dispatcher, an idle worker, one whose jobs have all
        finished and wait to be written: those writes are fenced on owner and attempt). A
        beat that goes through arms it again before claims resume."""
        with self.gate:
            silent_for = time.monotonic() - self.last_success
            if silent_for <= self.deadlines.suspend or not self.suspended:
                # A beat went through meanwhile (however late its answer): claims may go on.
                return True
            stalled = self._withheld or (self.liveness is not None and self.liveness.stalled)
            if stalled or self.holding is None or self.holding():
                # A stalled main loop ends at the deadline whatever it holds: otherwise it
                # would keep its slot, doing nothing, for ever.
                if self.hard_exit and self._armed_until is None:
                    self._arm(self.last_success)  # at once, if it is past
                return True
            if self.hard_exit and self._armed_until is not None:
                signal.setitimer(signal.ITIMER_REAL, 0)
                self._armed_until = None
                events.emit(
                    "kill_timer_disarmed",
                    process=self.registration.name,
                    silent_for=round(silent_for, 1),
                    reason="no job runs here: nothing could run twice if this process were "
                    "taken for dead; it is fenced if its row is gone once a beat goes through",
                )
            return False

    def _cut_hung_calls(self, now: float) -> None:
        """Past the deadline with the kernel's timer stopped, nothing else ends a call hung
        on a link that died without a reset (a failover behind a moved address, a firewall
        that dropped its state): cut ours, and the main loop's if it is stuck, so that both
        reconnect, and the next beat goes through (or finds the row gone and fences us)
        where new connections work, instead of waiting for TCP to give up."""
        sent = self._in_flight_since
        if sent is not None and now - sent > self.deadlines.kill and self._connection is not None:
            cut(self._connection)
        self.unhang()

    def _beats_failing(self, now: float) -> str | None:
        """Why beats do not go through, if that is what happens: they fail, hang, or are
        withheld from a stalled loop. None: none went out at all (the process was frozen)."""
        if self._withheld:
            return "its main loop stalled"
        sent = self._in_flight_since
        if sent is not None and now - sent > self.deadlines.statement_timeout:
            return f"a heartbeat has waited {now - sent:.1f} s for the database"
        if self.outage.failing_for is not None:
            return f"its heartbeats have failed for {self.outage.failing_for:.1f} s: " + (
                self.outage.error or "the database is unreachable"
            )
        return None
