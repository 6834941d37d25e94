"""Enqueueing many calls of one task at once: ``enqueue_many(task, [Call(...), ...])``."""

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from asgiref.sync import sync_to_async
from django.tasks import Task, TaskResult

from stalwart.exceptions import NotAStalwartBackend


class Call(Sequence):
    """The arguments of one call: ``Call(1, 2, key="value")``.

    It is an ``(args, kwargs)`` pair, so a plain list of such pairs works too.
    """

    __slots__ = ("args", "kwargs")

    def __init__(self, /, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs

    def __getitem__(self, index: int) -> Any:  # type: ignore[override]
        return (self.args, self.kwargs)[index]

    def __len__(self) -> int:
        return 2

    def __iter__(self) -> Iterator[Any]:
        yield self.args
        yield self.kwargs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Call) and (self.args, self.kwargs) == (other.args, other.kwargs)

    __hash__ = None  # type: ignore[assignment] - arguments may be lists and dicts

    def __repr__(self) -> str:
        parts = [repr(arg) for arg in self.args]
        parts += [f"{key}={value!r}" for key, value in self.kwargs.items()]
        return f"Call({', '.join(parts)})"


def _backend(task: Task) -> Any:
    from stalwart.backend import StalwartBackend

    backend = task.get_backend()
    if not isinstance(backend, StalwartBackend):
        raise NotAStalwartBackend(
            f"enqueue_many() needs a Stalwart backend; task {task.module_path!r} uses "
            f"{type(backend).__qualname__} (TASKS[{task.backend!r}])."
        )
    return backend


def enqueue_many(
    task: Task, calls: Iterable[Call | tuple[Sequence[Any], Mapping[str, Any]]]
) -> list[TaskResult]:
    """Enqueue one job per call, in as few INSERT statements as possible.

    All calls are validated first; if one is invalid, none is enqueued. Inside
    ``transaction.atomic()`` the jobs exist only if the transaction commits.
    """
    return _backend(task).enqueue_many(task, calls)


async def aenqueue_many(
    task: Task, calls: Iterable[Call | tuple[Sequence[Any], Mapping[str, Any]]]
) -> list[TaskResult]:
    """The async twin of ``enqueue_many``."""
    backend = _backend(task)
    return await sync_to_async(backend.enqueue_many, thread_sensitive=True)(task, list(calls))
