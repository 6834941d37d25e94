"""Faults a test can switch on in the processes it starts, through environment variables.

Each fault is real (a heartbeat whose answers come late, a log handler that blocks, a signal
receiver that raises); the variables only say where and when. ``install()`` runs in the test
app's ``ready()``, so every ``python -m django`` child picks them up.

- ``STALWART_TEST_SLOW_HEARTBEAT=<file>:<seconds>``: in a process whose pid is listed in
  ``<file>``, the next heartbeat's answer arrives ``<seconds>`` late, and then the heartbeat's
  link goes down (the socket is cut, reconnections are refused): a slow network, then a
  partition, on that host only.
- ``STALWART_TEST_BLOCKING_LOG=<file>``: while ``<file>`` exists, logging a job's success
  from a main thread blocks (as a log handler writing to a full pipe does).
- ``STALWART_TEST_RAISING_RECEIVER=1``: a ``task_finished`` receiver that raises.
"""

import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any


def _listed(path: Path) -> bool:
    try:
        return str(os.getpid()) in path.read_text().split()
    except OSError:
        return False


def _late_then_cut_off(spec: str) -> None:
    from django.db.backends.signals import connection_created

    path, _, seconds = spec.rpartition(":")
    flag, delay = Path(path), float(seconds)
    done: list[bool] = []

    def late_answer(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)  # the database has stamped the beat...
        if "stalwart_process" in sql and not done and _listed(flag):
            done.append(True)
            time.sleep(delay)  # ...and its answer arrives late...
            connection = context["connection"]
            # ...after which this link is down: reconnecting is refused.
            connection.settings_dict = {**connection.settings_dict, "HOST": "127.0.0.1", "PORT": 1}
            with socket.socket(fileno=os.dup(connection.connection.fileno())) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        return result

    def on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
        heartbeat = threading.current_thread().name == "stalwart-heartbeat"
        if heartbeat and late_answer not in connection.execute_wrappers:
            connection.execute_wrappers.append(late_answer)

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
        _late_then_cut_off(spec)
    if flag := os.environ.get("STALWART_TEST_BLOCKING_LOG"):
        logging.getLogger("stalwart").addHandler(BlockingHandler(flag))
    if os.environ.get("STALWART_TEST_RAISING_RECEIVER"):
        _raising_receiver()
