"""The one place that turns events into log lines, on the ``stalwart`` logger.

Each line reads ``action=<name> key=value …`` (a value with spaces in quotes; quotes,
backslashes and line breaks escaped, so one event is one line) and carries the same data as
``extra``:
``record.action`` and ``record.stalwart`` (a dict of the fields), for structured handlers.
Argument values are never logged. A failed job logs its traceback once, here.
"""

import logging
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
    "recurring_enqueued": logging.INFO,
    "job_timed_out": logging.ERROR,
    "worker_recycling": logging.INFO,
    "job_deduplicated": logging.DEBUG,
    "queue_paused": logging.INFO,
    "queue_resumed": logging.INFO,
    "jobs_retried": logging.INFO,
    "jobs_discarded": logging.INFO,
    "jobs_pruned": logging.INFO,
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
    logger.log(level, message, extra={"action": action, "stalwart": fields})


def install() -> None:
    events.subscribe(log_event)
