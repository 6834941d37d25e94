"""``stalwart.cancel(...)``: cancel jobs from application code.

A waiting job (scheduled, blocked or ready) is cancelled at once, in one fenced statement:
a worker claiming it at the same moment either got it first (it runs) or finds it gone. A
running job is asked to stop; its task sees the request through its context
(``context.cancel_requested``) and stops if it checks. Finished jobs are left alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, Task, TaskResult

if TYPE_CHECKING:
    from stalwart.control import Cancelled


def _job_id(job: TaskResult[..., Any] | str) -> str:
    import uuid

    value = job.id if isinstance(job, TaskResult) else job
    try:
        return str(uuid.UUID(str(value)))
    except ValueError:
        raise ValueError(f"{value!r} is not a job id.") from None


def cancel(
    *jobs: TaskResult[..., Any] | str,
    task: Task[..., Any] | str | None = None,
    queue: str | None = None,
    everything: bool = False,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    dry_run: bool = False,
    batch_size: int | None = None,
) -> Cancelled:
    """Cancel jobs: by result or id, every job of a ``task``, of a ``queue``, or all of them
    (``everything=True``). Returns ``Cancelled(cancelled=..., requested=...)``: waiting jobs
    cancelled, running jobs asked to stop. Bulk cancels go in batches of ``batch_size``
    rows, one short transaction each."""
    from stalwart.control import BATCH_SIZE, Selection, cancel_jobs
    from stalwart.queues import validate_queue_name

    task_path = task.module_path if isinstance(task, Task) else task
    if queue is not None:
        validate_queue_name(queue)
    selection = Selection(
        ids=[_job_id(job) for job in jobs],
        task_path=task_path,
        queue_name=queue,
        everything=everything,
    )
    return cancel_jobs(
        selection, backend=backend, dry_run=dry_run, batch_size=batch_size or BATCH_SIZE
    )


async def acancel(
    *jobs: TaskResult[..., Any] | str,
    task: Task[..., Any] | str | None = None,
    queue: str | None = None,
    everything: bool = False,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    dry_run: bool = False,
    batch_size: int | None = None,
) -> Cancelled:
    """The async twin of ``cancel``."""
    return await sync_to_async(cancel, thread_sensitive=True)(
        *jobs,
        task=task,
        queue=queue,
        everything=everything,
        backend=backend,
        dry_run=dry_run,
        batch_size=batch_size,
    )
