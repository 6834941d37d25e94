"""LISTEN/NOTIFY (PostgreSQL): wake an idle worker the moment a job for its queues commits,
or a dispatcher when a scheduled job is due sooner than it planned to look."""

import contextlib
import threading
import time
from collections.abc import Callable

from django.db import connections

from stalwart.db.wakeups import CHANNEL
from stalwart.processes.outage import Outage


class Listener(threading.Thread):
    """Holds its own connection in LISTEN and calls ``wake`` for relevant notifications.

    Polling stays the fallback: while ``listening`` is False (not yet, or the connection was
    lost and is being re-established with backoff), the role polls at its short interval.
    """

    def __init__(
        self,
        database: str,
        wants: Callable[[str], bool],
        wake: Callable[[], None],
        *,
        session: Callable[[], None] | None = None,
        process: str = "",
        channel: str = CHANNEL,
    ) -> None:
        super().__init__(name="stalwart-listener", daemon=True)
        self.channel = channel
        self.listening = False
        self.listening_since = 0.0  # time.monotonic() when LISTEN last took effect
        self.process = process
        self.database = database
        self.wants = wants
        self.wake = wake
        self.session = session  # makes this thread's connection a bookkeeping session
        self._stopped = threading.Event()

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        if self.session is not None:
            self.session()
        outage = Outage(
            self.database,
            process=self.process,
            started="listener_failed",
            ended="listener_recovered",
            first_delay=0.5,
            max_delay=30.0,
        )
        wrapper = connections[self.database]  # this thread's own
        try:
            while not self._stopped.is_set():
                try:
                    wrapper.ensure_connection()
                    with wrapper.cursor() as cursor:
                        cursor.execute(f"LISTEN {self.channel}")
                    outage.succeeded()
                    self.listening_since = time.monotonic()
                    self.listening = True
                    self.wake()  # anything enqueued while we were not listening
                    raw = wrapper.connection
                    while not self._stopped.is_set():
                        for notification in raw.notifies(timeout=0.25):
                            if self.wants(notification.payload):
                                self.wake()
                except Exception as error:  # noqa: BLE001 - any failure: reconnect later, poll
                    self.listening = False
                    self.wake()  # so the role goes back to its short poll at once
                    delay = outage.failed(error)
                    with contextlib.suppress(Exception):  # a dead connection may not close well
                        wrapper.close()
                    self._stopped.wait(delay)
        finally:
            with contextlib.suppress(Exception):
                wrapper.close()
