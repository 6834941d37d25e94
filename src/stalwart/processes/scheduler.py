"""The scheduler: turns recurring tasks into jobs, each tick exactly once across schedulers.

Each poll reads the database clock and the latest tick enqueued per key, asks each recurring
task which ticks are due (computed from the previous tick, never from the wall clock, so
nothing drifts), and enqueues them through ``stalwart.ticks``. Run as many schedulers as you
like: the unique ``(key, run_at)`` record makes each tick happen once.
"""

import time
from datetime import datetime
from typing import Any

from django.tasks.exceptions import InvalidTask

from stalwart import events
from stalwart.conf import Options, SchedulerOptions
from stalwart.exceptions import TaskNotFound
from stalwart.processes.base import FAILED, Role
from stalwart.ticks import check_entry, database_now, enqueue_tick, last_runs


class Scheduler(Role):
    kind = "scheduler"

    def __init__(self, *, config: Options, scheduler: SchedulerOptions, **kwargs: Any) -> None:
        super().__init__(config=config, **kwargs)
        self.scheduler = scheduler
        self.started_at: datetime | None = None
        self.broken: dict[str, str] = {}  # key -> why its task cannot be enqueued

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
            elapsed = time.monotonic() - started
            self.pause(max(self.scheduler.polling_interval - elapsed, 0))

    def mark_broken(self, key: str, problem: str) -> None:
        self.broken[key] = problem
        events.emit("recurring_task_invalid", key=key, error=problem)

    def tick(self) -> None:
        """Enqueue every tick that is due now."""
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
