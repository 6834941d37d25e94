"""The dispatcher: makes due scheduled jobs ready in batches, and, between batches, does
cluster chores."""

import time

from stalwart import events
from stalwart.conf import DispatcherOptions, Options
from stalwart.jobs import JobStore
from stalwart.processes.base import FAILED, Role
from stalwart.processes.chores import Chores


class Dispatcher(Role):
    kind = "dispatcher"

    def __init__(self, *, config: Options, dispatcher: DispatcherOptions, **kwargs) -> None:
        super().__init__(config=config, **kwargs)
        self.dispatcher = dispatcher
        self.store = JobStore(self.database, notify=config.listen_notify)
        self.chores = Chores(config, holder=self.name)

    def metadata(self) -> dict:
        return {**super().metadata(), "polling_interval": self.dispatcher.polling_interval}

    def main(self) -> None:
        self.set_title("dispatching")
        while not self.stop_requested:
            started = time.monotonic()
            promoted = self.step(self._dispatch)
            if promoted is FAILED:
                continue  # the step has waited its backoff
            # Chores are a step of their own, between promotions, never inside one; each
            # call does a bounded part (see Chores), so a big sweep does not hold promotion up.
            if self.step(self._chores) is FAILED:
                continue
            if promoted >= self.dispatcher.batch_size:
                continue  # more may be due right now
            elapsed = time.monotonic() - started
            self.pause(max(self.dispatcher.polling_interval - elapsed, 0))

    def _dispatch(self) -> int:
        promoted = self.store.promote_due(limit=self.dispatcher.batch_size)
        if promoted:
            events.emit("jobs_promoted", process=self.name, count=promoted)
        return promoted

    def _chores(self) -> None:
        self.chores.run_due(exclude=self.registration.id)
