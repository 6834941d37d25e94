"""Living through database outages: reconnect, back off, one log line when it starts and one
when it ends.

Every loop that talks to the database (a role's main loop, the heartbeat) runs its steps
through an ``Outage``. A step that fails with any database error (``InterfaceError``
included: in Django it is not a ``DatabaseError``) drops the connection if it can no longer
be used, so the next step reconnects, and the loop waits a backoff that grows from
``first_delay`` to ``max_delay``. A restart, a failover, a full disk or a table that is
missing all look the same from here: the process stays up and carries on when the database
does. Only errors that are not the database's end the process.
"""

import random
import time
from collections.abc import Callable

from django.db import Error as DatabaseFailure  # DatabaseError and InterfaceError alike

from stalwart import events
from stalwart.db.errors import is_transient
from stalwart.db.hints import advice
from stalwart.db.retry import reset_if_broken

__all__ = ["DatabaseFailure", "Outage"]


def hint_for(error: BaseException, database: str) -> str | None:
    """What a person should know about an outage's error, when it is not a plain outage
    (a missing database or table, refused credentials, a server that cannot be reached)."""
    try:
        return advice(error, database)
    except Exception:  # noqa: BLE001 - a hint must never break the loop it describes
        return None


class Outage:
    """The state of one loop's access to the database."""

    def __init__(
        self,
        database: str,
        *,
        process: str,
        started: str = "database_unavailable",
        ended: str = "database_recovered",
        first_delay: float = 0.1,
        max_delay: float = 5.0,
        reset: Callable[[str], None] = reset_if_broken,
    ) -> None:
        self.database = database
        self.process = process
        self.started, self.ended = started, ended  # the events at either end of an outage
        self.first_delay = first_delay
        self.max_delay = max_delay
        self._reset = reset
        self.since: float | None = None  # monotonic time the outage began
        self.recovered_at: float | None = None  # monotonic time the last outage ended
        # Since when a pruner waits for others to beat after a run of outages of its own
        # (see registry.may_prune); None: it does not wait.
        self.waiting_since: float | None = None
        # The recovery after which a pruner last said it waits (``pruning_waits``, once each).
        self.wait_said_after: float | None = None
        self.error: str | None = None
        self.failures = 0
        self._delay = first_delay

    @property
    def failing_for(self) -> float | None:
        """Seconds since the outage began, or None if the last step succeeded."""
        return None if self.since is None else time.monotonic() - self.since

    def up_for(self, at_least: float) -> bool:
        """Whether the database has answered this loop for ``at_least`` seconds on end (a
        loop that never lost it, since it started)."""
        if self.since is not None:
            return False
        return self.recovered_at is None or time.monotonic() - self.recovered_at >= at_least

    def failed(self, error: BaseException) -> float:
        """Record a failed step; return how long to wait before the next one."""
        self._reset(self.database)
        self.failures += 1
        self.error = f"{type(error).__name__}: {str(error).strip()}"
        if self.since is None:
            self.since = time.monotonic()
            self._delay = self.first_delay
            events.emit(
                self.started,
                process=self.process,
                transient=is_transient(error),
                error=self.error,
                hint=hint_for(error, self.database),
            )
        else:
            self._delay = min(self._delay * 2, self.max_delay)
        return self._delay * random.uniform(0.75, 1.25)  # noqa: S311 - jitter, not secrecy

    def stalled(self) -> None:
        """Record that a call worked, but only after waiting far longer than it should (a
        lock held by another writer, as SQLite's one writer): for as long, nobody's beats
        could land either, so for a pruner it is an outage that just ended (see
        ``registry.may_prune``); no line is logged."""
        if self.since is None:
            self.recovered_at = time.monotonic()

    def succeeded(self) -> None:
        """Record a step that worked: an outage in progress is over."""
        if self.since is None:
            return
        events.emit(
            self.ended,
            process=self.process,
            down_for=time.monotonic() - self.since,
            failures=self.failures,
        )
        self.since = None
        self.recovered_at = time.monotonic()
        self.error = None
        self.failures = 0
