"""The heartbeat: proves a process alive, and makes it stop before others take it for dead.

Every ``interval`` seconds the heartbeat thread touches our row (database clock), but only
while the role's main loop makes progress (``Liveness``): a stuck loop gets no heartbeats.
If the row is gone we were pruned: the process is fenced at once.

Pruners take a process for dead ``threshold`` seconds after the database stamped its last
beat. The stamp is taken while the beat runs, so never before we *sent* it: each beat's
success is dated by its sending time on the host's monotonic clock, never by the arrival of
an answer that may come late. Counting from there, past ``soft`` seconds the process is
fenced (it stops claiming and ends); at ``hard`` seconds, strictly before ``threshold``, it
is ended by the kernel: a timer (``ITIMER_REAL``) re-armed by each beat delivers ``SIGALRM``,
whose default action ends the process whatever its threads are doing, a task holding the GIL
included. So a job never runs here and elsewhere at once for lack of a heartbeat: the
margin is ``threshold - hard`` (half an interval) plus the time the beat took to arrive.

In a process that is not only a Stalwart role (a worker run in a thread of a test), nothing
is armed and the hard deadline fences, like the soft one.
"""

import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from stalwart import events
from stalwart.processes.liveness import Liveness
from stalwart.processes.outage import DatabaseFailure, Outage
from stalwart.processes.registry import Registration


def fence_deadlines(interval: float, threshold: float) -> tuple[float, float]:
    """Seconds after sending the last successful beat at which to fence softly, and at which
    the process is ended (``hard``, strictly less than ``threshold``)."""
    # A healthy process is silent for up to one interval (plus the beat itself): never
    # fence before half an interval more than that.
    floor = 1.5 * interval
    hard = max(threshold - interval / 2, floor)
    soft = max(hard - interval, floor)
    return soft, hard


class Heartbeat(threading.Thread):
    def __init__(
        self,
        registration: Registration,
        *,
        interval: float,
        threshold: float,
        metadata: Callable[[], dict[str, Any]],
        on_fenced: Callable[[str], None],
        liveness: Liveness | None = None,
        hard_exit: bool = False,
        session: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="stalwart-heartbeat", daemon=True)
        self.registration = registration
        self.interval = interval
        self.threshold = threshold
        self.metadata = metadata
        self.on_fenced = on_fenced
        self.liveness = liveness
        self.hard_exit = hard_exit
        self.session = session
        self.soft, self.hard = fence_deadlines(interval, threshold)
        self.last_success = time.monotonic()  # the sending time of the last beat that worked
        self.outage = Outage(
            registration.database,
            process=registration.name,
            started="heartbeat_failed",
            ended="heartbeat_recovered",
        )
        self._stalled_reported = False
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

    def run(self) -> None:
        if self.session is not None:
            self.session()
        try:
            self._beat()
        finally:
            connections.close_all()  # this thread's own connection

    def _beat(self) -> None:
        while not self._stop_event.wait(self.interval):
            if self.liveness is not None and self.liveness.stalled:
                if not self._stalled_reported:
                    self._stalled_reported = True
                    events.emit(
                        "process_stalled",
                        process=self.registration.name,
                        stalled_for=self.liveness.stalled_for,
                    )
                continue  # no progress, no heartbeat: the deadlines take their course
            metadata = self.metadata()
            sent = time.monotonic()
            try:
                alive = self.registration.heartbeat(metadata)
            except DatabaseFailure as error:
                self.outage.failed(error)
                continue
            self.outage.succeeded()
            if self._stop_event.is_set():
                return  # a beat that came back after the stop: its row may be gone by now
            if not alive:
                self.on_fenced("its process row is gone (pruned as dead)")
                return
            self.last_success = sent
            self._arm(sent)

    def _arm(self, sent: float) -> None:
        if self.hard_exit and not self._stop_event.is_set():
            remaining = sent + self.hard - time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, max(remaining, 0.001))

    def _guard(self) -> None:
        fenced = False
        while not self._stop_event.wait(min(self.interval / 4, 0.5)):
            silent_for = time.monotonic() - self.last_success
            if silent_for > self.soft and not fenced:
                fenced = True
                self.on_fenced(f"no successful heartbeat for {silent_for:.1f} s")
