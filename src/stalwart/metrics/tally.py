"""Counting what happens in this process, and adding it to the database's counters.

``install(database)`` subscribes a ``Tally`` to Stalwart's events (``OPTIONS['metrics']``
does it for a backend). Counts wait in memory; a daemon thread adds them to
``stalwart_counter`` every ``FLUSH_INTERVAL`` seconds in one upsert, and a role adds the
rest as it stops. A process killed outright loses at most its last interval's counts. A
forked child starts from zero: what it inherited is its parent's to add.
"""

import atexit
import math
import os
import threading
from typing import Any

from django.db import DatabaseError, connections

from stalwart import events

FLUSH_INTERVAL = 5.0
# Upper bounds of the duration histogram's buckets, in seconds (jobs run longer than
# requests: up to an hour, then +Inf).
BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0)
# The counter each event adds to; events with a ``count`` add that many.
COUNTED = {
    "job_enqueued": "enqueued",
    "job_succeeded": "succeeded",
    "job_failed": "failed",
    "job_retry_scheduled": "retried",
    "jobs_retried": "retried",
    "job_timed_out": "timed_out",
    "jobs_released": "released",
    "jobs_discarded": "discarded",
    "job_cancelled": "cancelled",  # a running job that stopped (or never ran again)
    "jobs_cancelled": "cancelled",  # waiting jobs cancelled at once
    "job_interrupted": "interrupted",  # given back free: a lost connection, a stop, a death
}


def _counter(action: str, fields: dict[str, Any]) -> str | None:
    """The counter an event adds to (a job a dead process gave back: by what became of it)."""
    if action == "job_given_back":
        if fields.get("status") == "failed":
            return "failed"
        return "retried" if fields.get("charged") else "interrupted"
    return COUNTED.get(action)


# Events whose ``duration`` is an attempt's running time.
TIMED = ("job_succeeded", "job_failed", "job_retry_scheduled", "job_cancelled")

Key = tuple[str, str, str, str]  # name, queue, task, le


def _le(bound: float) -> str:
    return "+Inf" if math.isinf(bound) else f"{bound:g}"


class Tally:
    def __init__(
        self, database: str, *, interval: float = FLUSH_INTERVAL, background: bool = True
    ) -> None:
        self.database = database
        self.interval = interval
        # False: no thread; counts are added only by flush() (tests, and short commands).
        self.background = background
        self._lock = threading.Lock()
        self._counts: dict[Key, float] = {}
        self._pid = os.getpid()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()

    # -- counting --------------------------------------------------------------------------

    def record(self, action: str, fields: dict[str, Any]) -> None:
        """The events subscriber."""
        name = _counter(action, fields)
        if name is None:
            return
        queue = str(fields.get("queue") or "")
        task = str(fields.get("task") or "")
        amount = float(fields.get("count", 1))
        if not amount:
            return
        added: list[tuple[Key, float]] = [((name, queue, task, ""), amount)]
        duration = fields.get("duration")
        if action in TIMED and isinstance(duration, int | float):
            for bound in (*BUCKETS, math.inf):
                if duration <= bound:
                    added.append((("duration_bucket", "", task, _le(bound)), 1.0))
            added.append((("duration_sum", "", task, ""), float(duration)))
            added.append((("duration_count", "", task, ""), 1.0))
        with self._lock:
            self._adopt_process()
            for key, value in added:
                self._counts[key] = self._counts.get(key, 0.0) + value
            self._start_thread()

    def _adopt_process(self) -> None:
        """In a forked child: forget the parent's counts and its (absent) thread."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._counts = {}
            self._thread = None
            self._wake = threading.Event()

    def _start_thread(self) -> None:
        if self.background and (self._thread is None or not self._thread.is_alive()):
            self._thread = threading.Thread(target=self._run, name="stalwart-metrics", daemon=True)
            self._thread.start()

    # -- adding to the database ------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval)
            self._wake.clear()
            try:
                self.flush()
            finally:
                connections.close_all()  # this thread's own connection

    def flush(self) -> int:
        """Add what was counted to the database now; return how many counters changed. On
        failure the counts are kept for the next try."""
        with self._lock:
            self._adopt_process()
            counts, self._counts = self._counts, {}
        if not counts:
            return 0
        from stalwart.db import statements_for

        connection = connections[self.database]
        try:
            with connection.cursor() as cursor:
                statements_for(connection).add_to_counters(cursor, sorted(counts.items()))
        except DatabaseError as error:
            with self._lock:
                for key, value in counts.items():
                    self._counts[key] = self._counts.get(key, 0.0) + value
            events.emit("metrics_not_stored", error=f"{type(error).__name__}: {error}")
            return 0
        return len(counts)

    def pending(self) -> dict[Key, float]:
        with self._lock:
            return dict(self._counts)


_tallies: dict[str, Tally] = {}


def install(database: str, *, background: bool = True) -> Tally:
    """Count this process's events into ``database``'s counters (once per database). What is
    still counted when the process exits normally is added then (``atexit``), so a script, a
    management command or a short-lived web worker loses nothing; a process killed outright
    (SIGKILL) loses at most its last ``FLUSH_INTERVAL`` of counts."""
    tally = _tallies.get(database)
    if tally is None:
        if not _tallies:
            atexit.register(_flush_at_exit)
        tally = _tallies[database] = Tally(database, background=background)
        events.subscribe(tally.record)
    return tally


def _flush_at_exit() -> None:
    try:
        flush_all()
    finally:
        connections.close_all()


def uninstall(database: str) -> None:
    tally = _tallies.pop(database, None)
    if tally is not None:
        events.unsubscribe(tally.record)


def flush_all() -> None:
    """Add every installed tally's counts now (a role does this as it stops)."""
    for tally in list(_tallies.values()):
        tally.flush()
