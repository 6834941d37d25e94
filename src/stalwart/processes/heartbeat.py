"""The heartbeat: proves a process alive, and makes it stop before others take it for dead.

Every ``interval`` seconds the heartbeat thread touches our row (database clock). If the row
is gone we were pruned: the process is fenced at once. A second thread watches the time since
the last successful beat on the host's monotonic clock, without waiting on the database (a
beat may hang on a dead connection): past ``soft`` seconds the process is fenced (it stops
claiming and exits); past ``hard`` seconds, still alive, it ends at once with ``os._exit``.
Both come before ``threshold``, when pruners would give its jobs to others: a job never runs
here and elsewhere at once for lack of a heartbeat.
"""

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, connections

from stalwart import events
from stalwart.db.retry import reset_if_broken
from stalwart.processes.exits import EXIT_FENCED
from stalwart.processes.registry import Registration


def fence_deadlines(interval: float, threshold: float) -> tuple[float, float]:
    """Seconds without a successful beat after which to fence softly, then to exit at once."""
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
        after_beat: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="stalwart-heartbeat", daemon=True)
        self.registration = registration
        self.interval = interval
        self.threshold = threshold
        self.metadata = metadata
        self.on_fenced = on_fenced
        self.after_beat = after_beat
        self.last_success = time.monotonic()
        self._stop_event = threading.Event()
        self._watch = threading.Thread(target=self._guard, name="stalwart-fence", daemon=True)

    def start(self) -> None:
        super().start()
        self._watch.start()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        try:
            self._beat()
        finally:
            connections.close_all()  # this thread's own connection

    def _beat(self) -> None:
        while not self._stop_event.wait(self.interval):
            try:
                alive = self.registration.heartbeat(self.metadata())
            except DatabaseError as error:
                events.emit(
                    "heartbeat_failed",
                    process=self.registration.name,
                    error=f"{type(error).__name__}: {error}",
                )
                reset_if_broken(self.registration.database)
                continue
            if not alive:
                self.on_fenced("its process row is gone (pruned as dead)")
                return
            self.last_success = time.monotonic()
            if self.after_beat is not None:
                self.after_beat()

    def _guard(self) -> None:
        soft, hard = fence_deadlines(self.interval, self.threshold)
        fenced = False
        while not self._stop_event.wait(min(self.interval / 4, 0.5)):
            silent_for = time.monotonic() - self.last_success
            if silent_for > hard:
                events.emit(
                    "process_fenced",
                    process=self.registration.name,
                    reason=f"no heartbeat for {silent_for:.0f} s: exiting at once",
                )
                logging.shutdown()
                sys.stderr.flush()
                os._exit(EXIT_FENCED)
            if silent_for > soft and not fenced:
                fenced = True
                self.on_fenced(f"no successful heartbeat for {silent_for:.0f} s")
