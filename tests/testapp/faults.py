"""Faults a test can switch on in the processes it starts, through environment variables.

Each fault is real (a heartbeat whose answers come late, a log handler that blocks, a signal
receiver that raises); the variables only say where and when. ``install()`` runs in the test
app's ``ready()``, so every ``python -m django`` child picks them up.

- ``STALWART_TEST_SLOW_HEARTBEAT=<file>:<seconds>``: the heartbeat of each process whose pid
  is listed in ``<file>`` gets its answers ``<seconds>`` late.
- ``STALWART_TEST_BLOCKING_LOG=<file>``: while ``<file>`` exists, logging a job's success
  from a main thread blocks (as a log handler writing to a full pipe does).
- ``STALWART_TEST_RAISING_RECEIVER=1``: a ``task_finished`` receiver that raises.
"""

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any


def _listed(path: Path) -> bool:
    try:
        return str(os.getpid()) in path.read_text().split()
    except OSError:
        return False


def _slow_heartbeats(spec: str) -> None:
    from django.db.backends.signals import connection_created

    path, _, seconds = spec.rpartition(":")
    flag, delay = Path(path), float(seconds)

    def late_answers(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)
        if "stalwart_process" in sql and _listed(flag):
            time.sleep(delay)  # the answer is on its way: it arrives late
        return result

    def on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
        heartbeat = threading.current_thread().name == "stalwart-heartbeat"
        if heartbeat and late_answers not in connection.execute_wrappers:
            connection.execute_wrappers.append(late_answers)

    connection_created.connect(on_connection, weak=False)


class BlockingHandler(logging.Handler):
    """Blocks a main thread that logs a job's success, while a flag file exists."""

    def __init__(self, flag: str) -> None:
        super().__init__()
        self.flag = Path(flag)

    def emit(self, record: logging.LogRecord) -> None:
        if getattr(record, "action", None) != "job_succeeded":
            return
        if threading.current_thread() is not threading.main_thread():
            return
        while self.flag.exists():
            time.sleep(0.05)  # stuck, as a handler writing to a pipe nobody reads


def _raising_receiver() -> None:
    from django.tasks.signals import task_finished

    def receiver(sender: Any, task_result: Any, **kwargs: Any) -> None:
        raise RuntimeError("a task_finished receiver that raises")

    task_finished.connect(receiver, weak=False, dispatch_uid="stalwart-test-raising")


def install() -> None:
    if spec := os.environ.get("STALWART_TEST_SLOW_HEARTBEAT"):
        _slow_heartbeats(spec)
    if flag := os.environ.get("STALWART_TEST_BLOCKING_LOG"):
        logging.getLogger("stalwart").addHandler(BlockingHandler(flag))
    if os.environ.get("STALWART_TEST_RAISING_RECEIVER"):
        _raising_receiver()
