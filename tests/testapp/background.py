"""A stand-in for a library that runs a thread from the moment it is imported (a metrics
exporter, a client's connection reaper). The test app starts it from ``ready()`` when
``STALWART_TEST_BACKGROUND_THREAD`` is ``true`` (or ``database``: then it also queries the
database through Django, taking and giving back connections), so a supervisor forks with it
running.

It follows the pattern Stalwart's docs ask of such libraries: a forked child gets no copy
of the thread, and the lock the thread may have held at the fork stays held for ever, so
``os.register_at_fork(after_in_child=...)`` gives the child a new lock and a new thread.
"""

import os
import threading
import time


class Ticker:
    def __init__(self, *, use_database: bool = False) -> None:
        self.lock = threading.Lock()
        self.ticks = 0
        self.pid = os.getpid()
        self.use_database = use_database

    def start(self) -> None:
        threading.Thread(target=self._run, name="testapp-ticker", daemon=True).start()

    def _run(self) -> None:
        while True:
            with self.lock:  # held most of the time, so a fork very likely copies it held
                self.ticks += 1
                if self.use_database:
                    self._query()
                time.sleep(0.005)  # the library's own work, not a synchronisation
            time.sleep(0.0005)

    def _query(self) -> None:
        from django.db import connection

        from tests.testapp.models import Execution

        Execution.objects.exists()
        if self.ticks % 20 == 0:
            connection.close()  # given back (to the pool, if there is one), as after a request

    def after_fork_in_child(self) -> None:
        self.lock = threading.Lock()
        self.ticks = 0
        self.pid = os.getpid()
        self.start()

    def state(self, timeout: float = 5.0) -> dict:
        """Whether this process's ticker runs: its lock can be taken and its count moves."""
        if not self.lock.acquire(timeout=timeout):
            return {"pid": os.getpid(), "lock": False, "ticking": False}
        first = self.ticks
        self.lock.release()
        deadline = time.monotonic() + timeout
        while self.ticks == first and time.monotonic() < deadline:
            time.sleep(0.01)  # a bounded poll of the thread's progress
        return {"pid": os.getpid(), "lock": True, "ticking": self.ticks != first}


ticker = Ticker()


def install() -> None:
    """Start the ticker if ``STALWART_TEST_BACKGROUND_THREAD`` asks for it."""
    wanted = os.environ.get("STALWART_TEST_BACKGROUND_THREAD")
    if wanted not in ("true", "database"):
        return
    ticker.use_database = wanted == "database"
    ticker.start()
    os.register_at_fork(after_in_child=ticker.after_fork_in_child)
