"""The dispatcher: makes due scheduled jobs ready in batches, and does cluster chores."""

import time

from django.db import DatabaseError

from stalwart import events, leases
from stalwart.conf import DispatcherOptions, Options
from stalwart.control import delete_expired_jobs
from stalwart.db.errors import is_transient
from stalwart.jobs import JobStore
from stalwart.processes.base import Role
from stalwart.processes.registry import prune_under_lease

RETENTION_LEASE = "stalwart.retention"
RETENTION_INTERVAL = 60.0  # seconds: one dispatcher in the cluster deletes expired jobs this often


class Dispatcher(Role):
    kind = "dispatcher"

    def __init__(self, *, config: Options, dispatcher: DispatcherOptions, **kwargs) -> None:
        super().__init__(config=config, **kwargs)
        self.dispatcher = dispatcher
        self.store = JobStore(self.database, notify=config.listen_notify)
        self._next_retention = 0.0

    def metadata(self) -> dict:
        return {**super().metadata(), "polling_interval": self.dispatcher.polling_interval}

    def main(self) -> None:
        self.set_title("dispatching")
        next_chores = 0.0
        while not self.stop_requested:
            started = time.monotonic()
            try:
                promoted = self.store.promote_due(limit=self.dispatcher.batch_size)
                if promoted:
                    events.emit("jobs_promoted", process=self.name, count=promoted)
                if started >= next_chores:
                    next_chores = started + self.config.heartbeat_interval
                    self.chores()
            except DatabaseError as error:
                if not is_transient(error):
                    raise
                events.emit("database_unavailable", process=self.name, error=str(error))
                promoted = 0
            if promoted >= self.dispatcher.batch_size:
                continue  # more may be due right now
            elapsed = time.monotonic() - started
            self.waker.wait(max(self.dispatcher.polling_interval - elapsed, 0))

    def chores(self) -> None:
        """Maintenance: dead processes, stuck slots, old finished jobs."""
        prune_under_lease(
            self.database,
            holder=self.name,
            threshold=self.config.process_alive_threshold,
            interval=self.config.heartbeat_interval,
            exclude=self.registration.id,
        )
        # Slots freed where no one handed them on (say, a process died in between): safe
        # anywhere at any time, since each key's slots are handed out under its row lock.
        self.store.unblock_all()
        now = time.monotonic()
        if now >= self._next_retention:
            self._next_retention = now + RETENTION_INTERVAL
            if leases.try_acquire(
                RETENTION_LEASE, self.name, ttl=RETENTION_INTERVAL, database=self.database
            ):
                deleted = delete_expired_jobs(self.config)
                if deleted:
                    events.emit("jobs_expired", process=self.name, count=deleted)
