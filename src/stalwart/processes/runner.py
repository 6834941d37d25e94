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

from django.tasks import TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_started
from django.utils import timezone

from stalwart import events, signals
from stalwart.context import StalwartTaskContext
from stalwart.db import ClaimedJob, Interruption, Outcome
from stalwart.exceptions import (
    InvalidStoredArguments,
    JobCancelled,
    TaskNotFound,
    TransactionLeftOpen,
)
from stalwart.models import JobStatus
from stalwart.processes import job_connections
from stalwart.processes.job_connections import lost_connection
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
    # Set when the attempt was interrupted, not failed (its connection was lost): the job is
    # given back (``release``), and ``outcome`` is not written.
    interruption: Interruption | None = None
    # Set when the attempt never began because this worker lacks the task (a rolling
    # deploy): why; the job waits (``outcome``: scheduled) for a worker that has it.
    deferred: str | None = None


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


def errors_after(job: ClaimedJob, error: TaskError) -> list[dict]:
    """The job's stored errors with this attempt's appended: the error, and which attempt
    it ended, when, in which process (the newest claimant)."""
    return [
        *job.errors,
        {
            "exception_class_path": error.exception_class_path,
            "traceback": error.traceback,
            "attempt": job.attempt,
            "at": timezone.now().isoformat(),
            "process": job.worker_ids[-1] if job.worker_ids else "",
        },
    ]


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
    errors = errors_after(job, error)
    if cancel_requested or isinstance(exception, JobCancelled):
        outcome = Outcome(
            id=job.id,
            attempt=job.attempt,
            status=JobStatus.CANCELLED,
            errors=dumps(errors),
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
                errors=dumps(errors),
                retry_in=delay,  # counted on the database's clock when it is written
            ),
            delay,
        )
    return (
        Outcome(id=job.id, attempt=job.attempt, status=JobStatus.FAILED, errors=dumps(errors)),
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


def interrupted(
    job: ClaimedJob,
    result: TaskResult | None,
    exception: BaseException,
    lost: BaseException,
    started: float,
) -> Finished:
    """An attempt whose body lost its database connection (a restart, a failover, a session
    ended by the server): not the job's fault. It goes back to run again, free, as an
    interruption (charged only past the job's ``max_interruptions``, with this error)."""
    finished = _failed(job, result, exception, started)
    assert finished.error is not None  # noqa: S101 - _failed always describes the error
    finished.interruption = Interruption(
        job.id,
        job.attempt,
        cause=f"its database connection was lost: {type(lost).__name__}: {str(lost).strip()[:300]}",
        error_class=finished.error.exception_class_path,
        error_text=finished.error.traceback,
    )
    return finished


def crashed_attempt(job: ClaimedJob, exception: BaseException) -> Finished:
    """The outcome of an attempt whose running itself broke (not the task): failed for good."""
    error = error_for(exception)
    outcome = Outcome(
        id=job.id,
        attempt=job.attempt,
        status=JobStatus.FAILED,
        errors=dumps(errors_after(job, error)),
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


def deferred_for_another_worker(
    job: ClaimedJob, missing: TaskNotFound, grace: float
) -> Finished | None:
    """A job whose task this worker cannot find, though another release of the project may
    have it (a rolling deploy: a task added in the new release, claimed by a worker still on
    the old code): it waits, and goes to whichever worker claims it next, for up to
    ``grace`` seconds since its first attempt began; then None (it fails with TaskNotFound).
    Neither charged nor an interruption: its body never began. Each wait is a quarter of the
    time waited so far, from 1 s to 60 s."""
    waited = (timezone.now() - job.started_at).total_seconds() if job.started_at else 0.0
    if waited >= grace:
        return None
    delay = min(max(waited / 4, 1.0), 60.0)
    return Finished(
        job=job,
        outcome=Outcome(id=job.id, attempt=job.attempt, status=JobStatus.SCHEDULED, retry_in=delay),
        result=None,
        duration=0.0,
        retry_in=delay,
        deferred=f"{missing} (waited {waited:.0f} s of {grace:g} s)",
    )


def _runnable_task(job: ClaimedJob, started: float, grace: float) -> Any:
    """The job's task, bound as it was enqueued, with arguments it can take; or, if there is
    none, the attempt's outcome: failed, or deferred for another worker."""
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
        if isinstance(exception, TaskNotFound) and exception.elsewhere:
            deferred = deferred_for_another_worker(job, exception, grace)
            if deferred is not None:
                return deferred
        return _failed(job, None, exception, started)
    return task


def run_job(
    job: ClaimedJob,
    sender: type,
    cancellations: dict[Any, threading.Event] | None = None,
    *,
    task_not_found_grace: float = 0.0,
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
        task = _runnable_task(job, started, task_not_found_grace)
        if isinstance(task, Finished):
            return task
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
            left_open = job_connections.after_job()
            reset = True
            if left_open:
                raise TransactionLeftOpen(left_open)
        except BaseException as exception:  # noqa: BLE001 - SystemExit and friends fail the job only
            asked = cancellations.get(job.id)
            lost = lost_connection(exception)
            if lost is not None and not (asked is not None and asked.is_set()):
                return interrupted(job, result, exception, lost, started)
            return _failed(job, result, exception, started, task, cancellation=asked)
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
            job_connections.after_job()
