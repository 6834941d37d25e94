"""The dispatcher: makes due scheduled jobs ready in batches, and, between batches, does
cluster chores.

Without LISTEN/NOTIFY it looks every ``polling_interval``. With it (PostgreSQL), it sleeps
until the earliest scheduled job is due, by the database's clock; an enqueue or a retry of a
job due sooner than that wakes it (a NOTIFY carrying the due time), and it looks at least
every ``listen_timeout`` seconds whatever it was told. So an idle dispatcher costs a few
statements a minute, and a delayed job is made ready within milliseconds of its time.
"""

import time
from typing import Any

from stalwart import events
from stalwart.conf import DispatcherOptions, Options
from stalwart.jobs import JobStore
from stalwart.processes.base import FAILED, Role
from stalwart.processes.chores import Chores

# Woken for a job the database says is due, a little after its time rather than before
# (the monotonic clock here and the database's may tick a hair apart).
DUE_MARGIN = 0.002


class Dispatcher(Role):
    kind = "dispatcher"

    def __init__(self, *, config: Options, dispatcher: DispatcherOptions, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.dispatcher = dispatcher
        self.store = JobStore(self.database, notify=config.listen_notify)
        self.chores = Chores(config, holder=self.name)
        self._listener: Any = None
        # When we plan to look next, in seconds since the epoch on the database's clock:
        # a notification of a job due before then wakes us.
        self._look_at = float("inf")
        # The last look found a due job it had not promoted, and chose to look again at once.
        self._recheck_due = False

    def metadata(self) -> dict:
        return {**super().metadata(), "polling_interval": self.dispatcher.polling_interval}

    def main(self) -> None:
        from django.db import connections

        self.set_title("dispatching")
        if self.config.listen_notify and connections[self.database].vendor == "postgresql":
            from stalwart.db.wakeups import SCHEDULED_CHANNEL
            from stalwart.processes.listener import Listener

            listen_on = self.config.listen_database  # a direct connection, past a pooler
            self._listener = Listener(
                listen_on or self.database,
                self._due_sooner,
                self.waker.wake,
                session=lambda: self.open_session("listener", database=listen_on),
                process=self.name,
                channel=SCHEDULED_CHANNEL,
            )
            self._listener.start()
        try:
            while not self.stop_requested:
                started = time.monotonic()
                wait = self.step(self._dispatch)
                if wait is FAILED:
                    continue  # the step has waited its backoff
                # Chores are a step of their own, between promotions, never inside one; each
                # call does a bounded part (see Chores), so a big sweep does not hold promotion
                # up.
                if self.step(self._chores) is FAILED:
                    continue
                self.pause(max(wait - (time.monotonic() - started), 0))
        finally:
            if self._listener is not None:
                self._listener.stop()
                self._listener.join(2.0)

    def _listening(self) -> bool:
        return self._listener is not None and self._listener.listening

    def _due_sooner(self, payload: str) -> bool:
        """Whether a notified due time comes before our next look (a payload we cannot
        read wakes us: looking costs a statement, missing a job costs its lateness)."""
        try:
            return float(payload) < self._look_at
        except ValueError:
            return True

    def _dispatch(self) -> float:
        """Promote one batch; return how long to wait before the next."""
        # Until we know when we look next, any notification wakes us: one that comes during
        # this look leaves the waker set, and the wait that follows ends at once.
        self._look_at = float("inf")
        promoted = self.store.promote_due(limit=self.dispatcher.batch_size)
        if promoted:
            events.emit("jobs_promoted", process=self.name, count=promoted)
        if promoted >= self.dispatcher.batch_size:
            return 0.0  # more may be due right now
        if not self._listening():
            return self.dispatcher.polling_interval  # notifications are not heard: poll
        now, due = self.store.next_due()
        wait = self.dispatcher.listen_timeout
        if self.store.any_pending():
            # A parent's end notifies nobody: while jobs wait for theirs, look every
            # polling_interval.
            wait = self.dispatcher.polling_interval
        recheck, self._recheck_due = self._recheck_due, False
        if due is not None:
            until_due = due - now
            if until_due <= 0 and not recheck:
                # Due by this reading of the clock, but not by the promotion's, an instant
                # earlier (each statement reads the clock when it starts; a sleep cut short by
                # the time the last look took ends a hair before a job is due): look again
                # at once, once.
                until_due = 0.0
                self._recheck_due = True
            elif until_due <= 0:
                # Due, and still not promoted: it cannot be yet (still owned by a live
                # process, or locked by another dispatcher). Look again after
                # polling_interval.
                until_due = self.dispatcher.polling_interval - DUE_MARGIN
            wait = min(wait, until_due + DUE_MARGIN)
        self._look_at = now + wait
        return wait

    def _chores(self) -> None:
        self.chores.run_due(exclude=self.registration.id, outage=self.outage)
