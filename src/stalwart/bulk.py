"""Enqueueing many calls of one task at once: ``enqueue_many(task, [Call(...), ...])``."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, overload

from asgiref.sync import sync_to_async
from django.tasks import Task, TaskResult

from stalwart.aliases import is_stalwart
from stalwart.exceptions import NotAStalwartBackend

if TYPE_CHECKING:
    from stalwart.interface import Backend


class Call(Sequence[Any]):
    """The arguments of one call: ``Call(1, 2, key="value")``.

    It is an ``(args, kwargs)`` pair, so a plain list of such pairs works too.
    """

    __slots__ = ("args", "kwargs")

    def __init__(self, /, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.kwargs = kwargs

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> Sequence[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return (self.args, self.kwargs)[index]

    def __len__(self) -> int:
        return 2

    def __iter__(self) -> Iterator[Any]:
        yield self.args
        yield self.kwargs

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Call) and (self.args, self.kwargs) == (other.args, other.kwargs)

    # Unhashable, since its arguments may be lists and dicts. The ignore: object declares
    # __hash__ a method, and None is how Python spells "unhashable" (as for list).
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        parts = [repr(arg) for arg in self.args]
        parts += [f"{key}={value!r}" for key, value in self.kwargs.items()]
        return f"Call({', '.join(parts)})"


# One call's arguments, as enqueue_many() takes them: a Call, or an (args, kwargs) pair.
CallArguments = Call | tuple[Sequence[Any], Mapping[str, Any]]


def _backend(task: Task[..., Any]) -> Backend:
    backend = task.get_backend()
    if not is_stalwart(backend):
        raise NotAStalwartBackend(
            f"enqueue_many() needs a Stalwart backend; task {task.module_path!r} uses "
            f"{type(backend).__qualname__} (TASKS[{task.backend!r}])."
        )
    return backend


def enqueue_many[**P, R](
    task: Task[P, R], calls: Iterable[CallArguments]
) -> list[TaskResult[P, R]]:
    """Enqueue one job per call, in as few INSERT statements as possible.

    All calls are validated first; if one is invalid, none is enqueued. Inside
    ``transaction.atomic()`` the jobs exist only if the transaction commits.
    """
    return _backend(task).enqueue_many(task, calls)


async def aenqueue_many[**P, R](
    task: Task[P, R], calls: Iterable[CallArguments]
) -> list[TaskResult[P, R]]:
    """The async twin of ``enqueue_many``."""
    backend = _backend(task)
    return await sync_to_async(backend.enqueue_many, thread_sensitive=True)(task, list(calls))
