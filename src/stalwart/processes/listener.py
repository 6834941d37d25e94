"""LISTEN/NOTIFY (PostgreSQL): wake an idle worker the moment a job for its queues commits."""

import contextlib
import threading
from collections.abc import Callable

from django.db import connections

from stalwart import events
from stalwart.db.postgresql import CHANNEL


class Listener(threading.Thread):
    """Holds its own connection in LISTEN and calls ``wake`` for relevant notifications.

    Polling stays the fallback: a lost connection only delays pick-up to the poll interval,
    and is re-established with backoff.
    """

    def __init__(
        self, database: str, wants: Callable[[str], bool], wake: Callable[[], None]
    ) -> None:
        super().__init__(name="stalwart-listener", daemon=True)
        self.database = database
        self.wants = wants
        self.wake = wake
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        backoff = 0.5
        while not self._stopped.is_set():
            wrapper = connections.create_connection(self.database)
            try:
                wrapper.ensure_connection()
                with wrapper.cursor() as cursor:
                    cursor.execute(f"LISTEN {CHANNEL}")
                self.wake()  # anything enqueued while we were not listening
                backoff = 0.5
                raw = wrapper.connection
                while not self._stopped.is_set():
                    for notification in raw.notifies(timeout=0.25):
                        if self.wants(notification.payload):
                            self.wake()
            except Exception as error:  # noqa: BLE001 - any failure: reconnect later, keep polling
                events.emit("listener_failed", error=f"{type(error).__name__}: {error}")
                self._stopped.wait(backoff)
                backoff = min(backoff * 2, 30.0)
            finally:
                with contextlib.suppress(Exception):  # closing a dead connection may fail too
                    wrapper.close()
