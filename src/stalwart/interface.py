"""A Stalwart backend as Stalwart's own modules use it: a typing ``Protocol``.

``stalwart.backend`` imports most of Stalwart, so a module below it cannot import it, even
for a type, without closing an import circle. Such modules find a backend through
``django.tasks.task_backends``, check it with ``stalwart.aliases.is_stalwart`` (which
narrows it to ``Backend``) or know it is one, and annotate it as ``Backend``.
``StalwartBackend`` is a ``Backend``: mypy holds it to this in ``stalwart.backend``. Only
the type checker reads this module's imports of Stalwart.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from django.tasks import Task, TaskResult

if TYPE_CHECKING:
    from stalwart.conf import Options


class Store(Protocol):
    """The backend's job store (``stalwart.jobs.JobStore``), as far as those modules use it."""

    def wake(self, queue_names: Sequence[str]) -> None: ...

    def notify_scheduled(self, *, due_in: float) -> None: ...


# In the enqueues below, ``calls`` is an iterable of ``stalwart.bulk.CallArguments``, which
# this module cannot name: stalwart.bulk stands above it.
class Backend(Protocol):
    """What Stalwart's modules use of a Stalwart backend (``StalwartBackend``)."""

    queues: set[str]
    config: Options

    @property
    def store(self) -> Store: ...

    def validate_task(self, task: Task[..., Any]) -> None: ...

    def enqueue_many[**P, R](
        self, task: Task[P, R], calls: Iterable[Any]
    ) -> list[TaskResult[P, R]]: ...

    def enqueue_fresh[**P, R](
        self,
        task: Task[P, R],
        calls: Iterable[Any],
        *,
        bulk: bool = True,
        ids: Sequence[uuid.UUID] = (),
        pending: bool = False,
    ) -> tuple[list[TaskResult[P, R]], list[TaskResult[P, R]]]: ...

    def enqueue_after[**P, R](
        self,
        task: Task[P, R],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        parents: Sequence[tuple[str, str]],
    ) -> TaskResult[P, R]: ...

    def enqueue_with_id[**P, R](
        self,
        task: Task[P, R],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        job_id: uuid.UUID,
    ) -> TaskResult[P, R]: ...

    def get_result(self, result_id: str) -> TaskResult[..., Any]: ...
