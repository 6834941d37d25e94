"""Tasks the tests enqueue. Each records what a user would check."""

import os
import signal
import time

from django.db import connection, transaction
from django.tasks import TaskContext, task
from django.utils import timezone

from tests.testapp.models import Execution


@task
def noop() -> None:
    return None


@task
def add(a: int, b: int) -> int:
    return a + b


@task
def echo(*args, **kwargs) -> dict:
    return {"args": list(args), "kwargs": kwargs}


@task
async def async_add(a: int, b: int) -> int:
    return a + b


@task(takes_context=True)
def whoami(context: TaskContext) -> dict:
    result = context.task_result
    return {"id": result.id, "attempt": context.attempt, "worker_ids": result.worker_ids}


@task
def fail(message: str = "boom") -> None:
    raise ValueError(message)


@task
def exit_process() -> None:
    raise SystemExit(3)


@task
def interrupt() -> None:
    raise KeyboardInterrupt


@task
def returns_unserializable() -> object:
    return {"when": object()}


@task(takes_context=True)
def record(context: TaskContext, label: str = "", sleep: float = 0.0) -> int:
    """Write one Execution row per run: the side table concurrency tests count."""
    started = timezone.now()
    if sleep:
        time.sleep(sleep)
    Execution.objects.create(
        job_id=context.task_result.id,
        label=label,
        attempt=context.attempt,
        pid=os.getpid(),
        started_at=started,
        finished_at=timezone.now(),
    )
    return os.getpid()


@task
def leave_transaction_open() -> None:
    """A badly behaved task: it enters a transaction and never leaves it."""
    transaction.atomic().__enter__()
    Execution.objects.create(job_id="abandoned", pid=os.getpid(), started_at=timezone.now())


@task
def break_connection() -> None:
    """A badly behaved task: it kills its own database connection."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    else:
        connection.connection.close()


@task
def kill_own_process() -> None:
    """A poison job: it takes its worker process down with it, every time."""
    os.kill(os.getpid(), signal.SIGKILL)
