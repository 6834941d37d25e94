"""Batches: many jobs enqueued as one group, and callbacks once they are all done.

::

    import stalwart

    with stalwart.batch(
        on_success=(email_owner, stalwart.Call(upload_id=7)),
        on_failure=alert_ops,
        label="upload 7",
    ) as rows:
        rows.enqueue_many(import_row, [stalwart.Call(upload_id=7, line=n) for n in lines])

The ``with`` block closes the batch as it ends (``close()`` does it too, for a batch
kept open longer). Once a batch is closed and every member has finished, the dispatcher
enqueues its callbacks, once: ``on_success`` if every member succeeded, ``on_failure`` if
any failed for good or was cancelled, ``on_finish`` in either case. A callback (a task, or a
``(task, Call(...))`` pair) that takes its context reads the batch with ``context.batch()``.
A member can add jobs to its own batch (``context.batch().enqueue(...)``) until the batch
has finished. See docs/how-to/batches.md.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.tasks import Task, TaskResult, task_backends
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils import timezone

from stalwart.aliases import is_stalwart
from stalwart.bulk import Call, CallArguments
from stalwart.calls import call_signature, check_call, check_importable
from stalwart.exceptions import InvalidBatch, NotAStalwartBackend
from stalwart.ids import uuid7, uuid7s
from stalwart.serialization import normalize_arguments

if TYPE_CHECKING:
    from stalwart.interface import Backend

WAITING_STATES = ("pending", "scheduled", "blocked", "ready")
# Members cancelled per call of stalwart.cancel (SQLite takes at most 32,766 parameters).
CANCEL_CHUNK = 1000


@dataclass(frozen=True, slots=True)
class BatchProgress:
    """A batch's members by state, read in one statement."""

    total: int
    waiting: int  # pending, scheduled, blocked or ready
    running: int
    succeeded: int
    failed: int
    cancelled: int
    deleted: int  # finished, then deleted by retention

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed + self.cancelled + self.deleted

    @classmethod
    def from_counts(cls, total: int, counts: dict[str, int]) -> BatchProgress:
        """From the members by job state (``db.batches.member_counts``)."""
        return cls(
            total=total,
            waiting=sum(counts.get(state, 0) for state in WAITING_STATES),
            running=counts.get("running", 0),
            succeeded=counts.get("successful", 0),
            failed=counts.get("failed", 0),
            cancelled=counts.get("cancelled", 0),
            deleted=counts.get("deleted", 0),
        )


def _backend(alias: str) -> Backend:
    backend = task_backends[alias]
    if not is_stalwart(backend):
        raise NotAStalwartBackend(
            f"Batches need a Stalwart backend; TASKS[{alias!r}] is {type(backend).__qualname__}."
        )
    return backend


def _refuse_unique_callback(task: Task[..., Any], where: str) -> None:
    """A callback is enqueued once, when its batch finishes, as a job of the batch: a
    unique task's enqueue then may answer with a twin, which is not. Refused, as a clear
    error. (A member may be unique: see ``Batch.enqueue_many``.)

    ``unique`` is an option of ``StalwartTask``, read here by name (a plain Django task has
    none): ``stalwart.task`` names the task context in its types, and the context opens
    batches, so importing it here would close an import circle."""
    if getattr(task, "unique", None):
        raise InvalidBatch(
            f"{where}task {task.module_path} is unique, and a unique task cannot be a "
            "batch's callback (its enqueue may answer with a twin that is not the batch's). "
            "Nothing was stored."
        )


def _callback_spec(name: str, value: Any, backend: str) -> dict[str, Any]:
    """A callback as stored: its task's path, queue, priority and normalized arguments."""
    if isinstance(value, Task):
        task, args, kwargs = value, (), {}
    else:
        try:
            task, (args, kwargs) = value
        except (TypeError, ValueError):
            raise InvalidBatch(
                f"{name}={value!r}: a callback is a task, or a (task, Call(...)) pair."
            ) from None
        if not isinstance(task, Task):
            raise InvalidBatch(f"{name}={value!r}: {task!r} is not a task.")
    if task.backend != backend:
        raise InvalidBatch(
            f"{name}: task {task.module_path} uses backend {task.backend!r}, and the batch "
            f"{backend!r}: a callback runs on its batch's backend."
        )
    _refuse_unique_callback(task, f"{name}: ")
    check_importable(task)
    signature = call_signature(task)
    if signature is not None:
        check_call(task, signature, args, kwargs)
    plain_args, plain_kwargs = normalize_arguments(args, kwargs)
    return {
        "task_path": task.module_path,
        "queue_name": task.queue_name,
        "priority": task.priority,
        "args": plain_args,
        "kwargs": plain_kwargs,
    }


class Batch:
    """A batch of jobs: ``enqueue`` and ``enqueue_many`` add members, ``close`` ends
    the adding, ``progress`` and ``results`` read it. Made by ``stalwart.batch()`` (a new
    one), ``stalwart.get_batch(id)`` or ``context.batch()``."""

    def __init__(self, batch_id: uuid.UUID | str, *, backend: str = "default") -> None:
        self.id = str(batch_id)
        self.backend = backend

    def __repr__(self) -> str:
        return f"<Batch {self.id} of backend {self.backend!r}>"

    @property
    def _database(self) -> str:
        return _backend(self.backend).config.database

    def _row(self) -> Any:
        from stalwart.models import Batch as BatchRow

        try:
            return BatchRow.objects.using(self._database).get(pk=uuid.UUID(self.id))
        except BatchRow.DoesNotExist:
            raise InvalidBatch(f"No batch has the id {self.id}.") from None

    @property
    def label(self) -> str:
        return self._row().label

    # -- adding ------------------------------------------------------------------------------

    def enqueue(self, task: Task[..., Any], /, *args: Any, **kwargs: Any) -> TaskResult[Any, Any]:
        """Enqueue one call of ``task`` as a member of this batch."""
        return self.enqueue_many(task, [Call(*args, **kwargs)])[0]

    def enqueue_many(
        self, task: Task[..., Any], calls: Iterable[CallArguments]
    ) -> list[TaskResult[Any, Any]]:
        """Enqueue many calls of ``task`` as members, in one transaction with their count:
        all or none. ``InvalidBatch`` if the batch has finished (its callbacks are enqueued)
        or is another backend's.

        A call of a unique task whose key a twin holds (a waiting job, of this batch, of
        another, or of none) enqueues nothing: its result is the twin's, as ``enqueue``
        returns it, and the twin does not become a member (nor is it counted)."""
        from stalwart.db.batches import add_members

        if task.backend != self.backend:
            raise InvalidBatch(
                f"Task {task.module_path} uses backend {task.backend!r}; batch {self.id} is "
                f"of backend {self.backend!r}."
            )
        backend = _backend(self.backend)
        listed = list(calls)
        with transaction.atomic(using=backend.config.database):
            results, fresh = backend.enqueue_fresh(task, listed, ids=uuid7s(len(listed)))
            added = add_members(
                backend.config.database,
                uuid.UUID(self.id),
                [uuid.UUID(result.id) for result in fresh],
            )
            if not added:
                raise InvalidBatch(
                    f"Batch {self.id} has finished (or does not exist): it takes no more "
                    "jobs. Nothing was enqueued."
                )
        return results

    def close(self) -> None:
        """End the adding: the callbacks come once every member has finished.
        ``InvalidBatch`` if it was closed already."""
        from stalwart.db.batches import close

        if not close(self._database, uuid.UUID(self.id), timezone.now()):
            self._row()  # a batch that does not exist says so
            raise InvalidBatch(f"Batch {self.id} is closed already.")
        # A listening dispatcher may sleep until its next due job: wake it (at commit, in a
        # transaction), so that it watches this batch every polling_interval.
        _backend(self.backend).store.notify_scheduled(due_in=0)

    def cancel(self) -> Any:
        """Cancel the members still waiting, ask the running ones to stop (as
        ``stalwart.cancel``), and close the batch if it is open: its callbacks then come
        once the running members have stopped (``on_failure`` and ``on_finish``, cancelled
        members being failures). Returns the ``Cancelled`` counts."""
        from stalwart.cancellation import cancel
        from stalwart.control import Cancelled
        from stalwart.db.batches import close, member_ids

        database = self._database
        batch_id = uuid.UUID(self.id)
        ids = [str(job_id) for job_id in member_ids(database, batch_id)]
        counts = Cancelled(0, 0)
        for start in range(0, len(ids), CANCEL_CHUNK):  # a statement's parameters are few
            done = cancel(*ids[start : start + CANCEL_CHUNK], backend=self.backend)
            counts = Cancelled(counts.cancelled + done.cancelled, counts.requested + done.requested)
        if close(database, batch_id, timezone.now()):
            _backend(self.backend).store.notify_scheduled(due_in=0)
        return counts

    def __enter__(self) -> Batch:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        # An error in the block leaves the batch open: its members run, its callbacks wait
        # for a close() that says the batch is whole.
        if kind is None:
            self.close()

    # -- reading -----------------------------------------------------------------------------

    def progress(self) -> BatchProgress:
        """The members by state (a read of the batch's members, one statement)."""
        from stalwart.db.batches import member_counts

        row = self._row()
        return BatchProgress.from_counts(
            row.total, member_counts(self._database, row.id, row.total)
        )

    @property
    def closed(self) -> bool:
        return self._row().closed_at is not None

    @property
    def finished(self) -> bool:
        """Whether its callbacks have been enqueued (every member had finished)."""
        return self._row().finished_at is not None

    def results(self) -> list[TaskResult[Any, Any]]:
        """The members' results, in the order they were added (deleted ones left out)."""
        from stalwart.db.batches import member_ids

        backend = _backend(self.backend)
        found = []
        for job_id in member_ids(self._database, uuid.UUID(self.id)):
            try:
                found.append(backend.get_result(str(job_id)))
            except TaskResultDoesNotExist:
                continue
        return found


def batch(
    *,
    on_success: Any = None,
    on_failure: Any = None,
    on_finish: Any = None,
    label: str = "",
    backend: str = "default",
) -> Batch:
    """Open a new batch, with the callbacks to enqueue once it is closed and every member
    has finished. Each callback is a task or a ``(task, Call(...))`` pair, checked now as an
    enqueue checks a call (``InvalidBatch``, or the enqueue's own error, and nothing is
    stored)."""
    from stalwart.models import Batch as BatchRow

    if len(label) > 255:
        raise InvalidBatch(f"A batch's label is at most 255 characters, not {len(label)}.")
    stalwart_backend = _backend(backend)
    callbacks = {
        name: _callback_spec(name, value, backend)
        for name, value in (
            ("on_success", on_success),
            ("on_failure", on_failure),
            ("on_finish", on_finish),
        )
        if value is not None
    }
    row = BatchRow.objects.using(stalwart_backend.config.database).create(
        id=uuid7(),
        backend=backend,
        label=label,
        created_at=timezone.now(),
        callbacks=callbacks,
    )
    return Batch(row.id, backend=backend)


def get_batch(batch_id: uuid.UUID | str, *, backend: str = "default") -> Batch:
    """The batch ``batch_id``; ``InvalidBatch`` if there is none."""
    try:
        found = Batch(uuid.UUID(str(batch_id)), backend=backend)
    except ValueError:
        raise InvalidBatch(f"{batch_id!r} is not a batch id.") from None
    found._row()
    return found
