"""Hooks a test turns on in the Stalwart processes it starts, through environment variables.

Each fault is real (a receiver that raises, a log handler that blocks, a heartbeat whose
answer comes late and whose link then goes down); the variables only say where and when.

- ``STALWART_FAULT_RAISING_RECEIVER=1``: a ``task_finished`` receiver that raises.
- ``STALWART_FAULT_BLOCKING_LOG=<file>``: a handler on the ``stalwart`` logger that blocks
  while ``<file>`` holds the pid of the process it runs in (a log pipe nobody reads).
- ``STALWART_FAULT_SLOW_RECEIVER=<seconds>``: a ``task_finished`` receiver that takes that
  long (an e-mail sent, a webhook called, from the receiver).
- ``STALWART_FAULT_STUCK_LOOP=<file>``: in a process whose pid ``<file>`` holds, every
  statement of its main thread's connection blocks until the file is gone (a call that
  never returns: a driver or a link that hangs where no deadline reaches).
- ``STALWART_FAULT_LATE_HEARTBEAT=<file>:<seconds>``: in a process whose pid ``<file>``
  holds, the next heartbeat's answer arrives ``<seconds>`` late, and then the heartbeat's
  link goes down (its socket is cut, reconnections are refused): a slow network, then a
  partition, on that host only.
- ``STALWART_FAULT_DIE_FINISHING_BATCH=<file>``: the first process to reach the end of a
  batch's finishing transaction (callbacks enqueued, not yet committed) while ``<file>``
  exists removes it and kills itself with ``SIGKILL``.
- ``STALWART_FAULT_PAUSE_AT=<event>:<file>``: the first process to emit the event ``<event>``
  (``batch_finishing``: callbacks enqueued, not yet committed; ``job_succeeded``: an
  outcome written) while ``<file>`` exists removes it, writes to ``<file>.held`` which
  connections its thread holds (backend pid, client port), and waits there, in the middle
  of its work, until ``<file>.held`` is gone (at most ``PAUSE_LIMIT`` s): the test cuts one
  of those connections meanwhile.
"""

import json
import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

RAISING_RECEIVER = "STALWART_FAULT_RAISING_RECEIVER"
BLOCKING_LOG = "STALWART_FAULT_BLOCKING_LOG"
LATE_HEARTBEAT = "STALWART_FAULT_LATE_HEARTBEAT"
STUCK_LOOP = "STALWART_FAULT_STUCK_LOOP"
SLOW_RECEIVER = "STALWART_FAULT_SLOW_RECEIVER"
DIE_FINISHING_BATCH = "STALWART_FAULT_DIE_FINISHING_BATCH"
PAUSE_AT = "STALWART_FAULT_PAUSE_AT"
PAUSE_LIMIT = 60.0  # a pause the test never ends ends here: the process goes on


def _named_in(flag: Path) -> bool:
    try:
        return flag.read_text().strip() == str(os.getpid())
    except OSError:
        return False


def _raise(sender: object, **kwargs: object) -> None:
    raise RuntimeError("a task_finished receiver failed")


class BlockingHandler(logging.Handler):
    def __init__(self, flag: Path) -> None:
        super().__init__()
        self.flag = flag

    def emit(self, record: logging.LogRecord) -> None:
        while _named_in(self.flag):
            time.sleep(0.05)  # a blocked handler: waits until the scenario lets it go


def _late_then_cut_off(spec: str) -> None:
    from django.db.backends.signals import connection_created

    path, _, seconds = spec.rpartition(":")
    flag, delay = Path(path), float(seconds)
    done: list[bool] = []

    def late_answer(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        result = execute(sql, params, many, context)  # the database has stamped the beat...
        if "stalwart_process" in sql and not done and _named_in(flag):
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


def _stuck_main_loop(flag: Path) -> None:
    from django.db.backends.signals import connection_created

    def stuck(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        while _named_in(flag):
            time.sleep(0.05)  # a call that hangs: until the scenario lets it go
        return execute(sql, params, many, context)

    def on_connection(sender: Any, connection: Any, **kwargs: Any) -> None:
        main = threading.current_thread() is threading.main_thread()
        if main and stuck not in connection.execute_wrappers:
            connection.execute_wrappers.append(stuck)

    connection_created.connect(on_connection, weak=False)


def _slow(sender: object, **kwargs: object) -> None:
    time.sleep(float(os.environ[SLOW_RECEIVER]))  # the receiver's own slow work


def _die_finishing_batch(flag: Path) -> None:
    import signal

    from stalwart import events

    def on_event(action: str, fields: dict[str, Any]) -> None:
        if action != "batch_finishing":
            return
        try:
            flag.unlink()  # one process wins, once
        except OSError:
            return
        os.kill(os.getpid(), signal.SIGKILL)

    events.subscribe(on_event)


def held_file(flag: Path) -> Path:
    """Where the process paused by ``PAUSE_AT`` says what it holds (see ``_pause_at``)."""
    return flag.with_name(f"{flag.name}.held")


def _own_connections() -> list[dict[str, Any]]:
    """This thread's open PostgreSQL connections: alias, backend pid, client port."""
    from django.db import connections

    found = []
    for connection in connections.all(initialized_only=True):
        driver = connection.connection
        if connection.vendor != "postgresql" or driver is None or driver.closed:
            continue
        with socket.socket(fileno=os.dup(driver.fileno())) as sock:
            port = sock.getsockname()[1]
        found.append({"alias": connection.alias, "backend": driver.info.backend_pid, "port": port})
    return found


def _pause_at(spec: str) -> None:
    from stalwart import events

    action, _, path = spec.partition(":")
    flag = Path(path)
    held = held_file(flag)

    def on_event(name: str, fields: dict[str, Any]) -> None:
        if name != action:
            return
        try:
            flag.unlink()  # one process wins, once
        except OSError:
            return
        said = {
            "pid": os.getpid(),
            "thread": threading.current_thread().name,
            "event": {key: str(value) for key, value in fields.items()},
            "connections": _own_connections(),
        }
        draft = held.with_name(f"{held.name}.draft")
        draft.write_text(json.dumps(said))
        draft.rename(held)  # whole, at once
        deadline = time.monotonic() + PAUSE_LIMIT
        while held.exists() and time.monotonic() < deadline:
            time.sleep(0.01)  # paused mid-work: until the scenario has cut the connection

    events.subscribe(on_event)


def install() -> None:
    if os.environ.get(RAISING_RECEIVER):
        from django.tasks.signals import task_finished

        task_finished.connect(_raise, dispatch_uid="stalwart-faults-raising-receiver")
    if os.environ.get(SLOW_RECEIVER):
        from django.tasks.signals import task_finished

        task_finished.connect(_slow, dispatch_uid="stalwart-faults-slow-receiver")
    if os.environ.get(BLOCKING_LOG):
        logging.getLogger("stalwart").addHandler(BlockingHandler(Path(os.environ[BLOCKING_LOG])))
    if os.environ.get(STUCK_LOOP):
        _stuck_main_loop(Path(os.environ[STUCK_LOOP]))
    if spec := os.environ.get(LATE_HEARTBEAT):
        _late_then_cut_off(spec)
    if os.environ.get(DIE_FINISHING_BATCH):
        _die_finishing_batch(Path(os.environ[DIE_FINISHING_BATCH]))
    if spec := os.environ.get(PAUSE_AT):
        _pause_at(spec)
