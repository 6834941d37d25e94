"""The scheduler: turns recurring tasks into jobs, each tick exactly once across schedulers.

Each poll reads the database clock and the latest tick enqueued per key, asks each recurring
task which ticks are due (computed from the previous tick, never from the wall clock, so
nothing drifts), and enqueues them through ``stalwart.ticks``. Run as many schedulers as you
like: the unique ``(key, run_at)`` record makes each tick happen once.

Between polls it sleeps until the next tick of any entry is due, by the database clock it
read at the poll (a hair after, never before), and never longer than ``polling_interval``.
"""

import time
from datetime import datetime
from typing import Any

from django.tasks.exceptions import InvalidTask

from stalwart import events
from stalwart.binding import check_entry
from stalwart.conf import Options, SchedulerOptions
from stalwart.exceptions import TaskNotFound
from stalwart.processes.base import FAILED, Role
from stalwart.ticks import database_now, enqueue_tick, last_runs

# Woken a little after a tick is due rather than before (this host's monotonic clock and the
# database's may tick a hair apart): a poll just before the tick would find nothing due.
TICK_MARGIN = 0.005


class Scheduler(Role):
    kind = "scheduler"

    def __init__(self, *, config: Options, scheduler: SchedulerOptions, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.scheduler = scheduler
        self.started_at: datetime | None = None
        self.broken: dict[str, str] = {}  # key -> why its task cannot be enqueued
        self.next_tick_in: float | None = None  # seconds from the last poll to the next tick

    def metadata(self) -> dict[str, Any]:
        return {**super().metadata(), "recurring": [entry.key for entry in self.config.recurring]}

    def main(self) -> None:
        self.set_title(f"scheduling {len(self.config.recurring)} recurring tasks")
        for entry in self.config.recurring:
            problem = check_entry(entry, self.config.alias)
            if problem is not None:
                self.mark_broken(entry.key, problem)
        while not self.stop_requested:
            started = time.monotonic()
            if self.step(self.tick) is FAILED:
                continue  # the step has waited its backoff
            wait = self.scheduler.polling_interval
            if self.next_tick_in is not None:
                wait = min(wait, self.next_tick_in + TICK_MARGIN)
            self.pause(max(wait - (time.monotonic() - started), 0))

    def mark_broken(self, key: str, problem: str) -> None:
        self.broken[key] = problem
        events.emit("recurring_task_invalid", key=key, error=problem)

    def tick(self) -> None:
        """Enqueue every tick that is due now; note when the next one is."""
        self.next_tick_in = None
        if not self.config.recurring:
            return
        now = database_now(self.database)
        if self.started_at is None:
            self.started_at = now  # ticks before our first look are not ours to replay
        latest = last_runs(self.database)
        for entry in self.config.recurring:
            if entry.key in self.broken:
                continue
            since = latest.get(entry.key, self.started_at)
            for run_at in entry.due(since=since, now=now):
                try:
                    result = enqueue_tick(
                        entry, run_at, alias=self.config.alias, database=self.database
                    )
                except (InvalidTask, TaskNotFound) as error:
                    # One bad entry must not stop the others (nor crash-loop the scheduler).
                    self.mark_broken(entry.key, str(error))
                    break
                if result is not None:
                    events.emit(
                        "recurring_enqueued",
                        key=entry.key,
                        run_at=run_at.isoformat(),
                        job=result.id,
                    )
        upcoming = [
            moment
            for entry in self.config.recurring
            if entry.key not in self.broken and (moment := entry.next_after(now)) is not None
        ]
        if upcoming:
            self.next_tick_in = max((min(upcoming) - now).total_seconds(), 0.0)
