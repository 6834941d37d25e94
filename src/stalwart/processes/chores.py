"""Cluster maintenance, done by dispatchers (and by a standalone ``queue work``).

Each chore is done by one process in the cluster at a time, the holder of its lease, and in
bounded transactions, so none holds many locks or runs long:

- Dead processes are pruned and their jobs released, and jobs whose owner has no row are
  taken back (under the lease "stalwart.prune"; supervisors do this too).
- Free concurrency slots nobody handed on are handed out (under "stalwart.slots"): a sweep
  of the keys with blocked jobs, up to ``SLOT_SWEEP_BATCH`` keys per transaction, in key
  order. A sweep of many keys is spread over calls: each call does one batch, and the
  caller (the dispatcher) promotes due jobs between them.
- Finished jobs past ``OPTIONS['retention']`` are deleted, and the batches they leave
  without jobs (under "stalwart.retention"), ``BATCH_SIZE`` rows per transaction.

Everything here is safe if several processes do it at once; the leases only keep the cluster
from doing the same work on every host.
"""

import time

from stalwart import events, leases
from stalwart.conf import Options
from stalwart.control import delete_expired_jobs
from stalwart.jobs import JobStore
from stalwart.processes.outage import Outage
from stalwart.processes.registry import may_prune, prune_under_lease

RETENTION_LEASE = "stalwart.retention"
RETENTION_INTERVAL = 60.0  # seconds between retention passes in the whole cluster
SLOTS_LEASE = "stalwart.slots"
SLOT_SWEEP_BATCH = 1000  # concurrency keys per transaction of the slot sweep


class Chores:
    def __init__(self, config: Options, *, holder: str) -> None:
        self.config = config
        self.holder = holder
        self.store = JobStore(config.database, notify=config.listen_notify)
        self._next_sweep = 0.0
        self._next_retention = 0.0
        self._next_slots = 0.0
        # Where the slot sweep under way goes on (None: no sweep under way).
        self._slots_after: str | None = None

    def run_due(self, *, exclude: int | None, outage: Outage) -> None:
        """Do what is due now; ``exclude`` is the caller's own process row, ``outage`` the
        state of the caller's own access to the database (see ``may_prune``)."""
        now = time.monotonic()
        if now >= self._next_sweep and may_prune(outage, self.config, self.holder):
            self._next_sweep = now + self.config.heartbeat_interval
            prune_under_lease(
                self.config.database,
                holder=self.holder,
                threshold=self.config.process_alive_threshold,
                interval=self.config.heartbeat_interval,
                exclude=exclude,
            )
        self.sweep_slots(now)
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

    def sweep_slots(self, now: float) -> None:
        """One batch of the slot sweep, if one is under way or due, and the lease is ours."""
        if self._slots_after is None:
            if now < self._next_slots:
                return
            self._next_slots = now + self.config.heartbeat_interval
        # Renewed at each batch; held a little longer than the interval between sweeps.
        if not leases.try_acquire(
            SLOTS_LEASE,
            self.holder,
            ttl=2 * self.config.heartbeat_interval,
            database=self.config.database,
        ):
            self._slots_after = None
            return
        _, self._slots_after = self.store.unblock_batch(
            after=self._slots_after, batch=SLOT_SWEEP_BATCH
        )
