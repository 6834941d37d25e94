"""Running one claimed job in a worker thread, and cleaning up after it.

Whatever the task does (return, raise ``Exception``, ``SystemExit``, ``KeyboardInterrupt``,
leave a transaction open, kill its connection), the result is an ``Outcome`` for the worker to
write and a thread whose connections are fit for the next job.
"""

import math
import threading
import time
from dataclasses import dataclass
from traceback import format_exception
from typing import Any

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_started

from stalwart import events, signals
from stalwart.context import StalwartTaskContext
from stalwart.db import ClaimedJob, Outcome
from stalwart.exceptions import InvalidStoredArguments, JobCancelled, TransactionLeftOpen
from stalwart.models import JobStatus
from stalwart.resolution import resolve_task
from stalwart.results import bind_task, make_result, task_errors
from stalwart.serialization import dumps, normalize_return_value
from stalwart.task import StalwartTask


@dataclass(slots=True)
class Finished:
    """One attempt, run: what to write, and the result to report once it is written."""

    job: ClaimedJob
    outcome: Outcome
    result: TaskResult | None  # None when the task could not even be resolved
    duration: float
    error: TaskError | None = None
    return_value: Any = None
    retry_in: float | None = None  # seconds until the next attempt, when one is scheduled
    timed_out: bool = False  # written for an attempt still running past its timeout
    # The exception that failed the attempt, until it is reported: Django's task_finished
    # receivers are called while it is being handled, so sys.exc_info() holds it.
    exception: BaseException | None = None


# The longest wait before a retry a backoff may ask for (a hundred years, in seconds).
MAX_RETRY_DELAY = 100 * 365 * 86400.0


def storable(text: str) -> str:
    """Text every database can store: NUL and lone surrogates written as escapes."""
    return text.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def error_for(exception: BaseException) -> TaskError:
    kind = type(exception)
    try:
        text = "".join(format_exception(exception))
    except Exception as failure:  # noqa: BLE001 - a broken __str__ must not lose the error
        text = f"{kind.__qualname__} (its traceback could not be formatted: {failure!r})"
    return TaskError(
        exception_class_path=storable(f"{kind.__module__}.{kind.__qualname__}"),
        traceback=storable(text),
    )


def encode_errors(errors: list[TaskError]) -> str:
    return dumps(
        [{"exception_class_path": e.exception_class_path, "traceback": e.traceback} for e in errors]
    )


def failure_outcome(
    job: ClaimedJob,
    task: Any,
    exception: BaseException,
    error: TaskError,
    *,
    cancel_requested: bool = False,
) -> tuple[Outcome, float | None]:
    """Failed for good, or scheduled again if the task's retry policy allows another attempt;
    or cancelled, if the task stopped with ``JobCancelled`` or someone asked it to stop.

    Every failed attempt (a worker's death included) counts towards ``max_attempts``.
    """
    errors = [*task_errors(job.errors), error]
    if cancel_requested or isinstance(exception, JobCancelled):
        outcome = Outcome(
            id=job.id,
            attempt=job.attempt,
            status=JobStatus.CANCELLED,
            errors=encode_errors(errors),
        )
        return outcome, None
    delay = None
    if (
        isinstance(task, StalwartTask)
        and task.should_retry(exception)
        and len(errors) < job.max_attempts
    ):
        try:
            delay = task.retry_delay(len(errors))
            if not math.isfinite(delay) or not 0 <= delay <= MAX_RETRY_DELAY:
                raise ValueError(f"backoff returned {delay!r}")
        except Exception as failure:  # noqa: BLE001 - a broken backoff ends the retries
            events.emit("backoff_failed", job=job.id, task=job.task_path, error=repr(failure))
            delay = None
    if delay is not None:
        return (
            Outcome(
                id=job.id,
                attempt=job.attempt,
                status=JobStatus.SCHEDULED,
                errors=encode_errors(errors),
                retry_in=delay,  # counted on the database's clock when it is written
            ),
            delay,
        )
    return (
        Outcome(
            id=job.id, attempt=job.attempt, status=JobStatus.FAILED, errors=encode_errors(errors)
        ),
        None,
    )


def _failed(
    job: ClaimedJob,
    result: TaskResult | None,
    exception: BaseException,
    started: float,
    task: Any = None,
    *,
    cancellation: threading.Event | None = None,
) -> Finished:
    error = error_for(exception)
    requested = cancellation is not None and cancellation.is_set()
    outcome, retry_in = failure_outcome(job, task, exception, error, cancel_requested=requested)
    return Finished(
        job=job,
        outcome=outcome,
        result=result,
        duration=time.monotonic() - started,
        error=error,
        retry_in=retry_in,
        exception=exception,
    )


def crashed_attempt(job: ClaimedJob, exception: BaseException) -> Finished:
    """The outcome of an attempt whose running itself broke (not the task): failed for good."""
    error = error_for(exception)
    outcome = Outcome(
        id=job.id,
        attempt=job.attempt,
        status=JobStatus.FAILED,
        errors=encode_errors([*task_errors(job.errors), error]),
    )
    return Finished(
        job=job, outcome=outcome, result=None, duration=0.0, error=error, exception=exception
    )


_JSON_TYPES = {dict: "an object", list: "an array", str: "a string", bool: "a boolean"}


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, int | float) and not isinstance(value, bool):
        return "a number"
    return _JSON_TYPES.get(type(value), type(value).__name__)


def check_stored_arguments(job: ClaimedJob) -> None:
    """Refuse ``args`` that are not a list and ``kwargs`` that are not a dict of names.

    Unpacked as they are, a dict in ``args`` would pass its keys as positional arguments.
    """
    if not isinstance(job.args, list):
        raise InvalidStoredArguments(f"args must be a JSON array, not {_json_type(job.args)}")
    if not isinstance(job.kwargs, dict):
        raise InvalidStoredArguments(f"kwargs must be a JSON object, not {_json_type(job.kwargs)}")
    for key in job.kwargs:
        if not isinstance(key, str):
            raise InvalidStoredArguments(f"kwargs keys must be strings, not {key!r}")


def not_run(job: ClaimedJob) -> Finished:
    """The outcome of a claimed job someone asked to cancel before the attempt began: it is
    cancelled without running (its errors, if any, stay as they were)."""
    return Finished(
        job=job,
        outcome=Outcome(id=job.id, attempt=job.attempt, status=JobStatus.CANCELLED),
        result=None,
        duration=0.0,
    )


def run_job(
    job: ClaimedJob, sender: type, cancellations: dict[Any, threading.Event] | None = None
) -> Finished:
    """Run one attempt of ``job`` in this thread and describe its outcome.

    ``cancellations``: per job id, the flag set when someone asks the job to stop, shared
    with whoever asks. Most jobs are never asked, so a flag is made only when needed: by
    the asker (``setdefault``, already set), or here for a task that reads it through its
    context (``StalwartTaskContext``). Set before the attempt begins, the task is not run.
    """
    started = time.monotonic()
    if cancellations is None:
        cancellations = {}
    cancellation = cancellations.get(job.id)
    if cancellation is not None and cancellation.is_set():
        return not_run(job)
    reset = False
    try:
        try:
            task = bind_task(
                resolve_task(job.task_path),
                priority=job.priority,
                queue_name=job.queue_name,
                run_after=job.run_after,
                backend=job.backend,
            )
            check_stored_arguments(job)
        except Exception as exception:  # noqa: BLE001 - an unrunnable job fails, the worker goes on
            return _failed(job, None, exception, started)
        result = make_result(
            task,
            job_id=job.id,
            status=TaskResultStatus.RUNNING,
            enqueued_at=job.enqueued_at,
            started_at=job.started_at,
            finished_at=None,
            last_attempted_at=job.last_attempted_at,
            args=job.args,
            kwargs=job.kwargs,
            backend=job.backend,
            errors=task_errors(job.errors),
            worker_ids=list(job.worker_ids),
        )
        signals.send(task_started, "task_started", sender=sender, task_result=result)
        try:
            if task.takes_context:
                # setdefault: the asker's flag if it came first, ours for it to set if not.
                cancellation = cancellations.setdefault(job.id, threading.Event())
                context = StalwartTaskContext(task_result=result, cancellation=cancellation)
                value = task.call(context, *job.args, **job.kwargs)
            else:
                value = task.call(*job.args, **job.kwargs)
            # One look at this thread's connections: which the task left in a transaction,
            # and each made fit for the next job (closing one left open rolls it back).
            left_open = reset_connections_after_job()
            reset = True
            if left_open:
                raise TransactionLeftOpen(left_open)
        except BaseException as exception:  # noqa: BLE001 - SystemExit and friends fail the job only
            return _failed(
                job, result, exception, started, task, cancellation=cancellations.get(job.id)
            )
        try:
            value = normalize_return_value(value)
        except (TypeError, ValueError) as exception:
            # Never retried, whatever the task's retry_on: the task ran, and would return
            # the same value again; a retry would only repeat its side effects.
            return _failed(job, result, exception, started)
        return Finished(
            job=job,
            outcome=Outcome(
                id=job.id,
                attempt=job.attempt,
                status=JobStatus.SUCCESSFUL,
                return_value=None if value is None else dumps(value),
            ),
            result=result,
            duration=time.monotonic() - started,
            return_value=value,
        )
    finally:
        if not reset:
            reset_connections_after_job()


def _left_open(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` (open) is still inside a transaction."""
    return connection.in_atomic_block or not connection.get_autocommit()


def reset_connections_after_job() -> list[str]:
    """Make this thread's connections fit for the next job, without reconnecting needlessly;
    return the aliases of those the job left inside a transaction.

    A connection left inside a transaction (or with autocommit off) is closed, which rolls the
    transaction back; one that saw errors is kept only if it still answers. Healthy connections
    are reused across jobs whatever ``CONN_MAX_AGE`` says: a worker thread is a long request.
    """
    left_open = []
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        if _left_open(connection):
            left_open.append(connection.alias)
            abandoned = True
        else:
            abandoned = connection.closed_in_transaction
        try:
            if abandoned:
                # Forget the job's transaction, then its connection: closing rolls it back.
                connection.in_atomic_block = False
                connection.closed_in_transaction = False
                connection.close()
            elif connection.errors_occurred:
                if connection.is_usable():
                    connection.errors_occurred = False
                else:
                    connection.close()
        except DatabaseError:
            pass
        if abandoned or connection.errors_occurred:
            connection.connection = None  # whatever happened above, reconnect on next use
    return left_open
