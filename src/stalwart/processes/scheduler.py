"""The scheduler: turns recurring tasks into jobs (its duties arrive with recurring tasks)."""

from stalwart.conf import Options, SchedulerOptions
from stalwart.processes.base import Role


class Scheduler(Role):
    kind = "scheduler"

    def __init__(self, *, config: Options, scheduler: SchedulerOptions, **kwargs) -> None:
        super().__init__(config=config, **kwargs)
        self.scheduler = scheduler

    def main(self) -> None:
        self.set_title("scheduling")
        while not self.stop_requested:
            self.waker.wait(self.scheduler.polling_interval)
