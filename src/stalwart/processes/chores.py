"""Cluster maintenance, done by dispatchers (and by a standalone ``queue work``).

- Dead processes are pruned and their jobs released, and jobs whose owner has no row are
  taken back (under the lease "stalwart.prune"; supervisors do this too).
- Free concurrency slots nobody handed on are handed out (a sweep, safe anywhere).
- Finished jobs past ``OPTIONS['retention']`` are deleted (under "stalwart.retention").

Everything here is safe if several processes do it at once; the leases only keep the cluster
from doing the same work on every host.
"""

import time

from stalwart import events, leases
from stalwart.conf import Options
from stalwart.control import delete_expired_jobs
from stalwart.jobs import JobStore
from stalwart.processes.registry import prune_under_lease

RETENTION_LEASE = "stalwart.retention"
RETENTION_INTERVAL = 60.0  # seconds between retention passes in the whole cluster


class Chores:
    def __init__(self, config: Options, *, holder: str) -> None:
        self.config = config
        self.holder = holder
        self.store = JobStore(config.database, notify=config.listen_notify)
        self._next_sweep = 0.0
        self._next_retention = 0.0

    def run_due(self, *, exclude: int | None) -> None:
        """Do what is due now; ``exclude`` is the caller's own process row."""
        now = time.monotonic()
        if now >= self._next_sweep:
            self._next_sweep = now + self.config.heartbeat_interval
            prune_under_lease(
                self.config.database,
                holder=self.holder,
                threshold=self.config.process_alive_threshold,
                interval=self.config.heartbeat_interval,
                exclude=exclude,
            )
            self.store.unblock_all()
        if now >= self._next_retention:
            self._next_retention = now + RETENTION_INTERVAL
            # Held a little longer than the interval, so its holder renews it in time.
            if leases.try_acquire(
                RETENTION_LEASE,
                self.holder,
                ttl=2 * RETENTION_INTERVAL,
                database=self.config.database,
            ):
                deleted = delete_expired_jobs(self.config)
                if deleted:
                    events.emit("jobs_expired", process=self.holder, count=deleted)
