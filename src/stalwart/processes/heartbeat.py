"""The heartbeat thread: proves a process alive, and notices when it has been declared dead."""

import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, connections

from stalwart import events
from stalwart.db.retry import reset_if_broken
from stalwart.processes.registry import Registration


class Heartbeat(threading.Thread):
    """Every ``interval`` seconds, touch our row (database clock) with fresh metadata.

    If the row is gone we were pruned as dead: ``on_fenced`` is called and the beating stops.
    If heartbeats keep failing for longer than ``threshold`` (host monotonic clock), others
    will soon take us for dead, so we fence ourselves the same way.
    """

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
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        try:
            self._beat()
        finally:
            connections.close_all()  # this thread's own connection

    def _beat(self) -> None:
        last_success = time.monotonic()
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
                failing_for = time.monotonic() - last_success
                if failing_for > self.threshold:
                    self.on_fenced(f"heartbeats have failed for {failing_for:.0f} s")
                    return
                continue
            if not alive:
                self.on_fenced("its process row is gone (pruned as dead)")
                return
            last_success = time.monotonic()
            if self.after_beat is not None:
                self.after_beat()
