"""Hooks a scenario turns on in the Stalwart processes through environment variables.

- ``STALWART_FAULT_RAISING_RECEIVER=1``: a ``task_finished`` receiver that raises.
- ``STALWART_FAULT_BLOCKING_LOG=<file>``: a handler on the ``stalwart`` logger that blocks
  while ``<file>`` holds the pid of the process it runs in (a log pipe nobody reads).
"""

import logging
import os
import time
from pathlib import Path

RAISING_RECEIVER = "STALWART_FAULT_RAISING_RECEIVER"
BLOCKING_LOG = "STALWART_FAULT_BLOCKING_LOG"


def _raise(sender: object, **kwargs: object) -> None:
    raise RuntimeError("a task_finished receiver failed")


class BlockingHandler(logging.Handler):
    def __init__(self, flag: Path) -> None:
        super().__init__()
        self.flag = flag

    def blocked(self) -> bool:
        try:
            return self.flag.read_text().strip() == str(os.getpid())
        except OSError:
            return False

    def emit(self, record: logging.LogRecord) -> None:
        while self.blocked():
            time.sleep(0.05)  # a blocked handler: waits until the scenario lets it go


def install() -> None:
    if os.environ.get(RAISING_RECEIVER):
        from django.tasks.signals import task_finished

        task_finished.connect(_raise, dispatch_uid="stalwart-faults-raising-receiver")
    if os.environ.get(BLOCKING_LOG):
        logging.getLogger("stalwart").addHandler(BlockingHandler(Path(os.environ[BLOCKING_LOG])))
