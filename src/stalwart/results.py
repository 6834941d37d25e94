"""Building ``django.tasks.TaskResult`` objects from stored jobs."""

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.base import TaskError

from stalwart.models import Job, JobStatus


def task_errors(stored: Iterable[dict[str, str]]) -> list[TaskError]:
    return [
        TaskError(exception_class_path=error["exception_class_path"], traceback=error["traceback"])
        for error in stored
    ]


def bind_task(
    task: Task, *, priority: int, queue_name: str, run_after: datetime | None, backend: str
) -> Task:
    """The task as it was enqueued (``using()`` options included)."""
    if (task.priority, task.queue_name, task.run_after, task.backend) == (
        priority,
        queue_name,
        run_after,
        backend,
    ):
        return task
    return task.using(
        priority=priority, queue_name=queue_name, run_after=run_after, backend=backend
    )


def make_result(
    task: Task,
    *,
    job_id: Any,
    status: TaskResultStatus,
    enqueued_at: datetime | None,
    started_at: datetime | None,
    finished_at: datetime | None,
    last_attempted_at: datetime | None,
    args: list,
    kwargs: dict,
    backend: str,
    errors: list[TaskError],
    worker_ids: list[str],
    return_value: Any = None,
) -> TaskResult:
    result: TaskResult = TaskResult(
        task=task,
        id=str(job_id),
        status=status,
        enqueued_at=enqueued_at,
        started_at=started_at,
        finished_at=finished_at,
        last_attempted_at=last_attempted_at,
        args=args,
        kwargs=kwargs,
        backend=backend,
        errors=errors,
        worker_ids=worker_ids,
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", return_value)
    return result


def result_from_job(job: Job, task: Task) -> TaskResult:
    """A stored job as a ``TaskResult``."""
    return make_result(
        bind_task(
            task,
            priority=job.priority,
            queue_name=job.queue_name,
            run_after=job.run_after,
            backend=job.backend,
        ),
        job_id=job.id,
        status=JobStatus(job.status).task_result_status,
        enqueued_at=job.enqueued_at,
        started_at=job.started_at,
        finished_at=job.finished_at,
        last_attempted_at=job.last_attempted_at,
        args=job.args,
        kwargs=job.kwargs,
        backend=job.backend,
        errors=task_errors(job.errors),
        worker_ids=list(job.worker_ids),
        return_value=job.return_value,
    )
