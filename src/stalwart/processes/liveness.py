"""Liveness means progress: whether a role's main loop is doing its work or is stuck.

The loop is *idle* while it waits (for a wake-up, a poll, a backoff) and *busy* otherwise.
Busy, it proves progress by finishing a step or a statement (``progressed``). The heartbeat
vouches for the process only while the loop is idle or has progressed within ``limit``
seconds: a loop stuck on a lock, in a log handler that blocks, or in a task's code that holds
the main thread, stops the heartbeats, and the process fences itself and ends before anyone
takes its jobs.
"""

import time


class Liveness:
    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._busy_since: float | None = time.monotonic()

    def idle(self) -> None:
        """The loop is about to wait: waiting is not being stuck."""
        self._busy_since = None

    def busy(self) -> None:
        """The loop is working again."""
        self._busy_since = time.monotonic()

    def progressed(self) -> None:
        """The loop finished something (a step, a statement): it is not stuck."""
        if self._busy_since is not None:
            self._busy_since = time.monotonic()

    def excuse(self) -> None:
        """The whole process stood still (its heartbeat thread too): the loop's time stood
        still with it, and counts again from now."""
        if self._busy_since is not None:
            self._busy_since = time.monotonic()

    @property
    def stalled_for(self) -> float:
        """Seconds the loop has been busy without progress (0 while idle)."""
        since = self._busy_since
        return 0.0 if since is None else time.monotonic() - since

    @property
    def stalled(self) -> bool:
        return self.stalled_for > self.limit
