"""The context a task with ``takes_context=True`` receives: Django's, and a cancel request.

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

    def raise_if_cancelled(self) -> None:
        """Raise ``JobCancelled`` if someone has asked this job to stop."""
        if self.cancellation.is_set():
            raise JobCancelled("The job was cancelled while it ran; the task stopped.")
