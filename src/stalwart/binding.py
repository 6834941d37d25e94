"""A recurring entry bound to the project: the task its path names, with the entry's
backend, queue and priority; and why an entry cannot be enqueued.

Nothing here touches the database or Stalwart's models, so the system checks can ask it
while the app registry is still loading (or when Stalwart's app is missing).
"""

from typing import TYPE_CHECKING, Any, cast

from django.tasks import Task, task_backends
from django.tasks.exceptions import InvalidTask

from stalwart.exceptions import TaskNotFound
from stalwart.recurring import RecurringTask
from stalwart.resolution import resolve_task
from stalwart.serialization import encode_arguments, normalize_arguments

if TYPE_CHECKING:
    from stalwart.interface import Backend


def bound_task(entry: RecurringTask, alias: str) -> Task:
    """The entry's task as it will be enqueued (raises if it cannot be)."""
    changes: dict = {"backend": alias}
    if entry.queue_name is not None:
        changes["queue_name"] = entry.queue_name
    if entry.priority is not None:
        changes["priority"] = entry.priority
    return resolve_task(entry.task_path).using(**changes)


def check_entry(entry: RecurringTask, alias: str) -> str | None:
    """Why this recurring task cannot be enqueued (task, queue, arguments), or None."""
    try:
        task = bound_task(entry, alias)
        # Recurring entries are OPTIONS of a Stalwart backend: alias is one.
        backend = cast("Backend", task_backends[alias])
        backend.validate_task(task)
        plain_args, plain_kwargs = normalize_arguments(entry.args, entry.kwargs)
        encode_arguments(plain_args, plain_kwargs, backend.config.max_arguments_size)
    except (TaskNotFound, InvalidTask) as error:
        return f"{entry.key}: {error}"
    return None


def recurring_problems(backend: Any) -> list[str]:
    """The recurring entries of ``backend`` that cannot be enqueued, each named by its
    setting (the messages of ``stalwart.W004``)."""
    where = f"TASKS[{backend.alias!r}]['OPTIONS']['recurring']"
    problems = []
    for entry in backend.config.recurring:
        problem = check_entry(entry, backend.alias)
        if problem is not None:
            key, _, reason = problem.partition(": ")
            problems.append(f"{where}[{key!r}]: {reason}")
    return problems
