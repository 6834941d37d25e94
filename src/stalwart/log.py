"""The one place that turns events into log lines, on the ``stalwart`` logger.

In a Stalwart process (``queue supervise``'s children, ``queue work``), the lines go to the
handlers from a thread of their own (``run_in_background``): a handler that blocks (a full
pipe, a log server that does not answer) holds up only that thread, never a loop whose
progress proves the process alive. Each record is made where the event happens (its time,
thread and process are the event's); if the handlers fall behind by ``BACKLOG`` records,
new ones are dropped and counted, and the count is logged (``log_lines_dropped``) once they
catch up. At exit the backlog is written within a bound (``flush``).

Each line reads ``action=<name> key=value …`` (a value with spaces in quotes; quotes,
backslashes and line breaks escaped, so one event is one line) and carries the same data as
``extra``:
``record.action`` and ``record.stalwart`` (a dict of the fields), for structured handlers.
Argument values are never logged. A failed job logs its traceback once, here.
"""

import logging
import os
import queue
import threading
import time
from typing import Any

from stalwart import events

logger = logging.getLogger("stalwart")

# Polling and per-job bookkeeping stay below INFO; outcomes and lifecycle are INFO and up.
_LEVELS = {
    "job_enqueued": logging.DEBUG,
    "jobs_claimed": logging.DEBUG,
    "job_started": logging.DEBUG,
    "job_succeeded": logging.INFO,
    "job_failed": logging.ERROR,
    "job_retry_scheduled": logging.WARNING,
    "job_cancelled": logging.WARNING,
    "job_cancel_requested": logging.INFO,
    "jobs_cancelled": logging.INFO,
    "job_result_discarded": logging.WARNING,
    "jobs_released": logging.WARNING,
    "jobs_promoted": logging.DEBUG,
    "dependants_released": logging.DEBUG,
    "dependants_cancelled": logging.INFO,
    "dependants_not_released": logging.WARNING,
    "dependants_revived": logging.INFO,
    "batch_finishing": logging.DEBUG,
    "batch_finished": logging.INFO,
    "batch_callback_failed": logging.ERROR,
    "recurring_enqueued": logging.INFO,
    "job_timed_out": logging.ERROR,
    "worker_recycling": logging.INFO,
    "job_deduplicated": logging.DEBUG,
    "queue_paused": logging.INFO,
    "queue_resumed": logging.INFO,
    "jobs_retried": logging.INFO,
    "jobs_discarded": logging.INFO,
    "jobs_pruned": logging.INFO,
    "batches_pruned": logging.INFO,
    "jobs_expired": logging.INFO,
    "orphans_released": logging.WARNING,
    "claim_failed": logging.WARNING,
    "backoff_failed": logging.ERROR,
    "jobs_reconciled": logging.WARNING,
    "outcome_not_stored": logging.ERROR,
    "recurring_task_invalid": logging.ERROR,
    "task_module_failed": logging.ERROR,
    "database_retry": logging.WARNING,
    "process_started": logging.INFO,
    "process_registered": logging.DEBUG,
    "process_stopping": logging.INFO,
    "process_stopped": logging.INFO,
    "process_fenced": logging.ERROR,
    "process_pruned": logging.WARNING,
    "prune_deferred": logging.WARNING,
    "process_exited": logging.WARNING,
    "child_exited": logging.INFO,
    "process_forked": logging.INFO,
    "process_crashed": logging.ERROR,
    "parent_gone": logging.WARNING,
    "threads_abandoned": logging.WARNING,
    "deregister_failed": logging.WARNING,
    "database_unavailable": logging.WARNING,
    "process_waiting_for_database": logging.INFO,
    "database_recovered": logging.INFO,
    "job_runner_crashed": logging.ERROR,
    "release_failed": logging.ERROR,
    "finish_failed": logging.ERROR,
    "event_subscriber_failed": logging.ERROR,
    "process_replaced": logging.INFO,
    "heartbeat_failed": logging.WARNING,
    "heartbeat_recovered": logging.INFO,
    "listener_failed": logging.WARNING,
    "listener_recovered": logging.INFO,
    "notify_failed": logging.WARNING,
    "process_stalled": logging.ERROR,
    "process_reregistered": logging.WARNING,
    "signal_receiver_failed": logging.ERROR,
    "outcome_deferred": logging.INFO,
    "metrics_not_stored": logging.WARNING,
    "session_options_refused": logging.WARNING,
    "prepared_statements_lost": logging.WARNING,
    "code_changed": logging.INFO,
    "job_interrupted": logging.WARNING,
    "job_given_back": logging.DEBUG,
    "process_suspended": logging.WARNING,
    "pruning_waits": logging.INFO,
    "kill_timer_disarmed": logging.INFO,
    "process_resumed": logging.INFO,
    "kernel_timer_tampered": logging.ERROR,
    "process_group_lingers": logging.WARNING,
    "clean_up_left": logging.ERROR,
    "signal_receiver_slow": logging.WARNING,
    "task_not_found_deferred": logging.WARNING,
    "log_lines_dropped": logging.WARNING,
    "embedded_supervisor_started": logging.INFO,
    "embedded_supervisor_stopped": logging.INFO,
    "embedded_supervisor_killed": logging.ERROR,
    "embedded_supervisor_shared": logging.INFO,
}

_MULTILINE_FIELDS = ("traceback",)


_ESCAPES = str.maketrans({"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"})


def _format_value(value: Any) -> str:
    """A value as ``key=value`` shows it: quoted if it has spaces, quotes or is empty, and
    always on one line (a newline is written ``\\n``, as in JSON), so that one event is one
    line however many lines a database's message has."""
    if isinstance(value, float):
        return f"{value:.4f}".rstrip("0").rstrip(".") if value else "0"
    text = str(value)
    escaped = text.translate(_ESCAPES)
    if escaped != text or not text or " " in text or "=" in text:
        return f'"{escaped}"'
    return text


def log_event(action: str, fields: dict[str, Any]) -> None:
    level = _LEVELS.get(action, logging.INFO)
    if not logger.isEnabledFor(level):
        return
    parts = [f"action={action}"]
    parts.extend(
        f"{key}={_format_value(value)}"
        for key, value in fields.items()
        if key not in _MULTILINE_FIELDS and value is not None
    )
    message = " ".join(parts)
    traceback = fields.get("traceback")
    if traceback:
        message = f"{message}\n{traceback.rstrip()}"
    extra = {"action": action, "stalwart": fields}
    background = _background
    if background is None:
        logger.log(level, message, extra=extra)
        return
    background.put(
        logger.makeRecord(logger.name, level, "(stalwart)", 0, message, (), None, extra=extra)
    )


# Records waiting for the handlers, past which new ones are dropped (and counted).
BACKLOG = 10_000


class _Background:
    """The thread that hands records to the ``stalwart`` logger's handlers."""

    def __init__(self) -> None:
        self.queue: queue.Queue[logging.LogRecord] = queue.Queue(maxsize=BACKLOG)
        self.dropped = 0
        self.thread = threading.Thread(target=self._serve, name="stalwart-log", daemon=True)
        self.thread.start()

    def put(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1

    def _serve(self) -> None:
        while True:
            record = self.queue.get()
            try:
                logger.handle(record)
                if self.dropped and self.queue.empty():
                    dropped, self.dropped = self.dropped, 0
                    logger.warning(
                        'action=log_lines_dropped count=%d reason="the log handlers fell behind '
                        'by %d lines"',
                        dropped,
                        BACKLOG,
                        extra={"action": "log_lines_dropped", "stalwart": {"count": dropped}},
                    )
            except Exception:  # noqa: BLE001, S110 - logging's handleError reports what it can
                pass
            finally:
                self.queue.task_done()

    def flush(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.queue.unfinished_tasks:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)  # polling the backlog with a bound, at exit
        return True


_background: _Background | None = None


def run_in_background() -> None:
    """From now on, in this process, hand log lines to the handlers from a thread of their
    own. For a process that is a Stalwart role through and through (not a test runner or a
    web server that enqueues)."""
    global _background  # noqa: PLW0603 - one per process
    if _background is None:
        _background = _Background()


def after_fork_in_child() -> None:
    # The parent's log thread does not exist here: a child that wants one starts its own.
    global _background  # noqa: PLW0603 - one per process
    _background = None


def flush(timeout: float = 2.0) -> bool:
    """Write the lines waiting for the handlers, giving up after ``timeout`` seconds;
    whether they were all written."""
    background = _background
    return background is None or background.flush(timeout)


def install() -> None:
    events.subscribe(log_event)


os.register_at_fork(after_in_child=after_fork_in_child)
