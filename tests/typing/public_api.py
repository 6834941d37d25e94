"""What a project's type checker sees of Stalwart's public API: checked by mypy (strict) in
scripts/test's types leg, never run. ``assert_type`` fails the check if a type changes; an
ignore on a call that must be refused fails it if the call is accepted (mypy reports the
ignore as unused)."""

from typing import assert_type

from django.tasks import Task, TaskResult

import stalwart
from stalwart import Call, enqueue_many
from stalwart.control import Cancelled, Selection, pause, retry_failed


@stalwart.task(max_attempts=3, queue_name="sums")
def add(a: int, b: int) -> int:
    return a + b


@stalwart.task(takes_context=True)
def export(context: stalwart.StalwartTaskContext, account_id: int) -> str:
    context.raise_if_cancelled()
    return f"exported {account_id}"


def enqueue_them() -> None:
    # Declared types: what a task's parameters and return value make of it.
    task: Task[[int, int], int] = add
    result: TaskResult[[int, int], int] = add.enqueue(1, 2)
    add.enqueue(1, "2")  # type: ignore[arg-type]  # a str where the task takes an int
    exported: TaskResult[[int], str] = export.enqueue(7)
    export.enqueue("7")  # type: ignore[arg-type]  # the context is not an argument
    results: list[TaskResult[[int, int], int]] = enqueue_many(add, [Call(1, 2), ((3, 4), {})])
    assert_type(result.return_value, int)
    assert_type(stalwart.cancel(queue="sums"), Cancelled)
    assert_type(pause("sums"), bool)
    assert_type(retry_failed(Selection(task_path="typing.add")), int)
    del task, exported, results
