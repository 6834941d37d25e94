"""The context a task with ``takes_context=True`` receives: Django's, a cancel request, and
the results of the jobs it runs after.

Cancelling a running job is cooperative: nothing is killed. ``stalwart.cancel()`` marks the
job; its worker learns of the mark within a heartbeat interval (the look it already takes at
the jobs it holds) and sets the flag that ``cancel_requested`` reads. A task that works in
steps checks it between them and stops, by raising ``JobCancelled``
(``raise_if_cancelled()`` does both); the job is then ``cancelled``.
"""

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.tasks import TaskContext

from stalwart.exceptions import JobCancelled

if TYPE_CHECKING:
    # django-stubs makes TaskContext generic (in its task's parameters and return value);
    # Django's class is not subscriptable, so the type checker alone sees the parameters.
    _AnyTaskContext = TaskContext[..., Any]
else:
    _AnyTaskContext = TaskContext


# The ignore below: django-stubs (6.1) declares TaskContext a plain dataclass, while Django's
# is frozen (@dataclass(frozen=True, slots=True, kw_only=True)), as this one must be to
# inherit from it; mypy believes the stub and calls the inheritance invalid.
@dataclass(frozen=True, slots=True, kw_only=True)
class StalwartTaskContext(_AnyTaskContext):  # type: ignore[misc]
    """``django.tasks.TaskContext``, plus whether someone asked the job to stop."""

    cancellation: threading.Event = field(
        default_factory=threading.Event, repr=False, compare=False
    )

    @property
    def cancel_requested(self) -> bool:
        """True once someone has asked this job to stop (a cheap read: no query)."""
        return self.cancellation.is_set()

    def parent_results(self) -> list[Any]:
        """The results (``TaskResult``) of the jobs this one runs after (``enqueue_after``,
        ``chain``), read from the database now, in the order they were given; a parent
        deleted since is left out. Empty for a job that runs after nothing."""
        import uuid

        from django.tasks import task_backends
        from django.tasks.exceptions import TaskResultDoesNotExist

        from stalwart.db.dependencies import parents_of

        backend: Any = task_backends[self.task_result.backend]
        found = []
        for parent in parents_of(backend.config.database, uuid.UUID(self.task_result.id)):
            try:
                found.append(backend.get_result(str(parent)))
            except TaskResultDoesNotExist:
                continue
        return found

    def batch(self) -> Any:
        """The ``stalwart.Batch`` this job belongs to (as a member or a callback), or
        None. A member may add jobs to it: ``context.batch().enqueue(task, ...)``."""
        import uuid

        from django.tasks import task_backends

        from stalwart.batches import Batch
        from stalwart.db.batches import batch_of

        alias = self.task_result.backend
        backend: Any = task_backends[alias]
        found = batch_of(backend.config.database, uuid.UUID(self.task_result.id))
        return None if found is None else Batch(found, backend=alias)

    def raise_if_cancelled(self) -> None:
        """Raise ``JobCancelled`` if someone has asked this job to stop."""
        if self.cancellation.is_set():
            raise JobCancelled("The job was cancelled while it ran; the task stopped.")
