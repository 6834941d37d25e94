"""The application's receivers of a worker's reports, run on a thread of their own.

A worker's main loop proves the process alive (its heartbeats vouch only for a loop that
progresses), so it runs no application code: Django's ``task_finished`` receivers are
called here, one report after another, in the order the outcomes were written. A receiver
that takes long holds up only the reports after it, and is named in a warning
(``signal_receiver_slow``: where it is, file and line) once it has run ``slow_after``
seconds. At a stop, the reports still waiting are sent within what is left of the shutdown
timeout.
"""

import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable

from stalwart import events

# Seconds a receiver may run before it is named in a warning.
SLOW_AFTER = 5.0


class Reporter:
    def __init__(self, *, process: str, slow_after: float = SLOW_AFTER) -> None:
        self.process = process
        self.slow_after = slow_after
        self._queue: deque[tuple[str, Callable[[], None]]] = deque()
        self._lock = threading.Condition()
        self._running: tuple[str, float] | None = None  # (what, since) of the report being sent
        self._warned = False
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="stalwart-reporter", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, what: str, send: Callable[[], None]) -> None:
        """Send a report (``what``: its signal's name) after those already waiting."""
        with self._lock:
            self._queue.append((what, send))
            self._lock.notify()

    @property
    def waiting(self) -> int:
        return len(self._queue) + (1 if self._running is not None else 0)

    def check(self) -> None:
        """Name a receiver that has run too long (called from the worker's loop)."""
        running = self._running
        if running is None or self._warned:
            return
        what, since = running
        took = time.monotonic() - since
        if took < self.slow_after:
            return
        self._warned = True
        frame = sys._current_frames().get(self._thread.ident or 0)
        where = "unknown"
        if frame is not None:
            summary = traceback.extract_stack(frame)[-1]
            where = f"{summary.filename}:{summary.lineno} in {summary.name}"
        events.emit(
            "signal_receiver_slow",
            process=self.process,
            signal=what,
            running_for=round(took, 1),
            where=where,
            waiting=len(self._queue),
        )

    def drain(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the reports waiting to be sent; whether they
        all were. No more are taken after this."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._stopping = True
            self._lock.notify()
            while self._queue or self._running is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return False
                self._lock.wait(min(remaining, 0.1))
        return True

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._queue:
                    if self._stopping:
                        return
                    self._lock.wait()
                what, send = self._queue.popleft()
                self._running = (what, time.monotonic())
                self._warned = False
            try:
                send()  # signals.send: every receiver runs, one that raises is reported
            except Exception as error:  # noqa: BLE001 - a report never takes the thread down
                events.emit("signal_receiver_failed", signal=what, error=repr(error))
            finally:
                with self._lock:
                    self._running = None
                    self._lock.notify_all()
