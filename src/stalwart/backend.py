"""``StalwartBackend``: Django's task backend API, with jobs stored in the database.

The module loads without Stalwart's app installed (its models, and ``stalwart.db``, which
needs them, are imported when first used), so that a project that forgot ``"stalwart"`` in
``INSTALLED_APPS`` gets the system check ``stalwart.E004`` and an ``ImproperlyConfigured``
at enqueue that say so, not a ``RuntimeError`` from deep in Django's model registry.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any, cast

from django.db import transaction
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone

from stalwart import events, signals
from stalwart.calls import call_signature, check_call, check_importable
from stalwart.checks import check_backend, require_app
from stalwart.conf import Options, read_options
from stalwart.exceptions import TaskNotFound
from stalwart.ids import uuid7, uuid7s
from stalwart.queues import validate_queue_name
from stalwart.resolution import resolve_task
from stalwart.serialization import encode_arguments, normalize_arguments
from stalwart.task import StalwartTask

if TYPE_CHECKING:
    from django.core.checks import CheckMessage

    from stalwart.bulk import CallArguments
    from stalwart.interface import Backend
    from stalwart.jobs import JobStore


class StalwartBackend(BaseTaskBackend):
    """Stores each enqueued task call as a row; ``queue work`` / ``queue supervise`` run them."""

    task_class = StalwartTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.config: Options = read_options(alias, params)
        if self.config.metrics:
            from stalwart.metrics import tally

            tally.install(self.config.database)

    @cached_property
    def store(self) -> JobStore:
        """The job table's statements, on this backend's database."""
        require_app()
        from stalwart.jobs import JobStore

        return JobStore(self.config.database, notify=self.config.listen_notify)

    def validate_task(self, task: Task[..., Any]) -> None:
        """Refuse a task no worker could run: one defined inside a function, or with a queue
        that ``QUEUES`` does not allow or whose name is invalid (``InvalidTask``)."""
        qualname = getattr(task.func, "__qualname__", "")
        if "<locals>" in qualname:
            # Django's sentence, and why: the worker finds a task by its module and name.
            raise InvalidTask(
                f"Task function must be defined at a module level: {qualname!r} is defined "
                "inside a function, so a worker process could not import it."
            )
        if self.queues and task.queue_name not in self.queues:
            allowed = ", ".join(repr(name) for name in sorted(self.queues))
            raise InvalidTask(
                f"Queue {task.queue_name!r} is not valid for backend. TASKS[{self.alias!r}]"
                f"['QUEUES'] allows {allowed}: add {task.queue_name!r} to it, or set it to [] "
                "to allow any queue name."
            )
        super().validate_task(task)
        validate_queue_name(task.queue_name)

    # -- enqueue -----------------------------------------------------------------------------

    def enqueue[**P, R](
        self, task: Task[P, R], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> TaskResult[P, R]:
        """Enqueue one call of ``task``: one row in the job table, in the current
        transaction of the queue's database. The result's status is ``READY``."""
        return self._enqueue(task, [(args, kwargs)], bulk=False)[0]

    def enqueue_many[**P, R](
        self, task: Task[P, R], calls: Iterable[CallArguments]
    ) -> list[TaskResult[P, R]]:
        """Enqueue many calls of one task in as few INSERT statements as possible.

        ``calls`` yields ``(args, kwargs)`` pairs (``stalwart.Call`` objects are such pairs).
        Every call is validated before anything is written: one bad call enqueues none.
        """
        listed = list(calls)
        # The ids made together, in one step: a bulk enqueue makes thousands.
        return self._enqueue(task, listed, bulk=True, ids=uuid7s(len(listed)))

    def _enqueue[**P, R](
        self,
        task: Task[P, R],
        calls: Iterable[CallArguments],
        *,
        bulk: bool,
        ids: Sequence[uuid.UUID] = (),
        pending: bool = False,
    ) -> list[TaskResult[P, R]]:
        """``pending``: the jobs wait for parents (``enqueue_after``, which writes the edges)
        and are released by the dispatcher once those are done."""
        return self.enqueue_fresh(task, calls, bulk=bulk, ids=ids, pending=pending)[0]

    def enqueue_fresh[**P, R](
        self,
        task: Task[P, R],
        calls: Iterable[CallArguments],
        *,
        bulk: bool = True,
        ids: Sequence[uuid.UUID] = (),
        pending: bool = False,
    ) -> tuple[list[TaskResult[P, R]], list[TaskResult[P, R]]]:
        """Enqueue calls of ``task`` as ``_enqueue`` does; return every call's result and,
        apart, those of the jobs this call created: a call of a unique task whose key a
        twin holds creates none, and its result is the twin's (``enqueue_after`` and
        batches attach only the jobs created)."""
        require_app()
        from stalwart.db import NewJob
        from stalwart.db.hints import noted
        from stalwart.models import JobStatus
        from stalwart.results import make_result

        store = self.store
        self.validate_task(task)
        check_importable(task)
        signature = call_signature(task)
        now = timezone.now()
        run_after = task.run_after
        available_at = run_after if run_after is not None and run_after > now else now
        status = (
            JobStatus.PENDING
            if pending
            else JobStatus.SCHEDULED
            if available_at > now
            else JobStatus.READY
        ).value
        task_path = task.module_path
        limit = self.config.max_arguments_size
        max_attempts = self.max_attempts_for(task)
        # The task's own options, for a Stalwart task with a limit or a unique key.
        guarded = (
            task
            if isinstance(task, StalwartTask)
            and (task.concurrency_limit is not None or bool(task.unique))
            else None
        )
        rows: list[NewJob] = []
        results: list[TaskResult[P, R]] = []
        # Whether a call binds depends only on its shape (how many positional arguments,
        # which keyword names): the calls of one enqueue_many() are checked once per shape.
        fitting: set[tuple[int, frozenset[str]]] = set()
        for index, (args, kwargs) in enumerate(calls):
            try:
                if signature is not None:
                    shape = (len(args), frozenset(kwargs))
                    if shape not in fitting:
                        check_call(task, signature, args, kwargs)
                        fitting.add(shape)
                plain_args, plain_kwargs = normalize_arguments(args, kwargs)
                encoded_args, encoded_kwargs = encode_arguments(plain_args, plain_kwargs, limit)
            except InvalidTask as error:
                if bulk:
                    error.add_note(
                        f"Raised for call {index + 1} (counting from 1) of enqueue_many(); "
                        "nothing was enqueued."
                    )
                raise
            job_id = ids[index] if ids else uuid7()
            concurrency_key = unique_key = None
            if guarded is not None:
                concurrency_key = guarded.concurrency_key_for(plain_args, plain_kwargs)
                unique_key = guarded.unique_key_for(plain_args, plain_kwargs)
            rows.append(
                NewJob(
                    id=job_id,
                    task_path=task_path,
                    backend=self.alias,
                    queue_name=task.queue_name,
                    priority=task.priority,
                    status=status,
                    args=encoded_args,
                    kwargs=encoded_kwargs,
                    run_after=run_after,
                    available_at=available_at,
                    enqueued_at=now,
                    max_attempts=max_attempts,
                    concurrency_key=concurrency_key,
                    concurrency_limit=(
                        guarded.concurrency_limit if guarded and concurrency_key else None
                    ),
                    concurrency_duration=(
                        guarded.concurrency_duration_seconds
                        if guarded and concurrency_key
                        else None
                    ),
                    unique_key=unique_key,
                    unique_while_running=bool(
                        guarded and unique_key and guarded.unique_while_running
                    ),
                    max_interruptions=self.config.max_interruptions,
                )
            )
            results.append(
                make_result(
                    task,
                    job_id=job_id,
                    status=TaskResultStatus.READY,
                    enqueued_at=now,
                    started_at=None,
                    finished_at=None,
                    last_attempted_at=None,
                    args=plain_args,
                    kwargs=plain_kwargs,
                    backend=self.alias,
                    errors=[],
                    worker_ids=[],
                )
            )
        if not rows:
            return [], []
        fresh = results
        with noted(self.config.database):  # a missing table says what to run, say
            # A pending job takes no concurrency slot until it is released; it holds its
            # unique key at once, as any waiting job.
            if guarded is not None and (not pending or bool(guarded.unique)):
                results, fresh = self._insert_guarded(guarded, rows, results)
            else:
                store.insert(rows)
        # Announce the jobs once they exist for everyone: at commit, or now in autocommit.
        transaction.on_commit(partial(self._send_enqueued, fresh), using=self.config.database)
        for result in fresh:
            events.emit("job_enqueued", job=result.id, task=task_path, queue=task.queue_name)
        return results, fresh

    def _insert_guarded[**P, R](
        self, task: StalwartTask, rows: list[Any], results: list[TaskResult[P, R]]
    ) -> tuple[list[TaskResult[P, R]], list[TaskResult[P, R]]]:
        """Insert jobs with a concurrency key or a unique key; a duplicate returns its twin.

        Returns every call's result, and those of the jobs actually created.
        """
        stored = self.store.insert_guarded(rows)
        keys = sorted(
            {
                row.concurrency_key
                for row in rows
                if row.concurrency_key is not None and row.status != "pending"
            }
        )
        if keys:
            # Slots are handed out once the jobs exist for everyone (the dispatcher's sweep
            # catches any this misses).
            transaction.on_commit(
                partial(self.store.unblock, keys, limit=task.concurrency_limit),
                using=self.config.database,
                robust=True,
            )
        from stalwart.db import NewJob

        final: list[TaskResult[P, R]] = []
        fresh: list[TaskResult[P, R]] = []
        for result, outcome in zip(results, stored, strict=True):
            if isinstance(outcome, NewJob):
                final.append(result)
                fresh.append(result)
                continue
            events.emit("job_deduplicated", task=task.module_path, job=str(outcome))
            # The waiting twin is a job of this very task (its key includes the task's path).
            final.append(cast("TaskResult[P, R]", self.get_result(str(outcome))))
        return final, fresh

    def enqueue_after[**P, R](
        self,
        task: Task[P, R],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        parents: Sequence[tuple[str, str]],
    ) -> TaskResult[P, R]:
        """Enqueue one call of ``task`` to run once ``parents`` are done: ``(job id,
        on_failure)`` pairs, in order. Every parent must be a job of this backend that
        exists; otherwise ``InvalidDependency`` and nothing is written. The job and its
        dependencies are written in one transaction of the queue's database.

        A call of a unique task whose key a twin holds (a job that waits, for parents or
        not, or runs with ``unique_while_running``) returns the twin, as ``enqueue`` does,
        and writes nothing: the twin does not start waiting for these parents."""
        require_app()
        from stalwart.db.dependencies import insert_dependencies
        from stalwart.exceptions import InvalidDependency
        from stalwart.models import Dependency, Job

        parent_ids = [uuid.UUID(job_id) for job_id, _ in parents]
        database = self.config.database
        with transaction.atomic(using=database):
            found = set(
                Job.objects.using(database)
                .filter(pk__in=parent_ids, backend=self.alias)
                .values_list("pk", flat=True)
            )
            missing = [str(job_id) for job_id in parent_ids if job_id not in found]
            if missing:
                raise InvalidDependency(
                    f"{task.module_path} cannot run after job(s) {', '.join(missing)}: no such "
                    f"job in backend {self.alias!r} (never enqueued there, or already "
                    "deleted by retention). Nothing was enqueued."
                )
            results, fresh = self.enqueue_fresh(task, [(args, kwargs)], bulk=False, pending=True)
            result = results[0]
            if not fresh:
                return result  # a unique task's twin holds the key: nothing else to write
            # The parents' workers release it as soon as they finish (Job.has_dependants):
            # marked in this transaction, so that a parent claimed once it commits is known
            # to have it (a worker finishing a parent meanwhile waits for the commit).
            self._mark_parents(parent_ids)
            child = uuid.UUID(result.id)
            insert_dependencies(
                database,
                [
                    Dependency(child=child, parent=parent, position=position, on_failure=policy)
                    for position, (parent, (_, policy)) in enumerate(
                        zip(parent_ids, parents, strict=True)
                    )
                ],
            )
            self._resolve_if_parents_ended(child, parent_ids)
            # A listening dispatcher may sleep until its next due job: wake it (at commit),
            # so that it looks at pending jobs every polling_interval from now on.
            self.store.notify_scheduled(due_in=0)
        return result

    def _resolve_if_parents_ended(self, child: uuid.UUID, parent_ids: list[uuid.UUID]) -> None:
        """A parent that had already ended before its dependant was enqueued is seen by no
        worker's or dispatcher's look at jobs that end: decide the dependant now, in the
        enqueue's transaction (released, or cancelled, as its parents' states say).

        So is a parent gone since the enqueue found it (retention deleted it meanwhile: it
        had no dependant yet to keep it, and the delete committed while this enqueue waited
        for its lock): one still to end is counted, not one that ended."""
        from stalwart.db import dependencies
        from stalwart.models import Job
        from stalwart.ticks import database_now

        database = self.config.database
        unended = (
            Job.objects.using(database)
            .filter(pk__in=parent_ids)
            .exclude(status__in=["successful", "failed", "cancelled"])
            .count()
        )
        if unended == len(set(parent_ids)):
            return
        _, _, queues = dependencies.resolve(database, [child], now=database_now(database))
        self.store.wake(queues)

    def _mark_parents(self, parent_ids: list[uuid.UUID]) -> None:
        """Set ``has_dependants`` on the parents that lack it, locking them in id order
        (as every lock of job rows is taken: no deadlock with a claim or a cancel).

        The failed parents are locked in the same statement: deciding the dependant
        (``_resolve_if_parents_ended``) locks them, and, taken there, after the others,
        those locks would be out of id order (a retry or retention that locks a failed
        parent, then wants one locked here, deadlocked with this enqueue)."""
        from django.db.models import Q

        from stalwart.models import Job

        jobs = Job.objects.using(self.config.database)
        locked = list(
            jobs.select_for_update()
            .filter(Q(has_dependants=False) | Q(status="failed"), pk__in=parent_ids)
            .order_by("pk")
            .values_list("pk", "has_dependants")
        )
        unmarked = [pk for pk, marked in locked if not marked]
        if unmarked:
            jobs.filter(pk__in=unmarked).update(has_dependants=True)

    def enqueue_with_id[**P, R](
        self,
        task: Task[P, R],
        args: Sequence[Any],
        kwargs: Mapping[str, Any],
        job_id: uuid.UUID,
    ) -> TaskResult[P, R]:
        """Enqueue one call under an id chosen beforehand (the scheduler records it first)."""
        return self._enqueue(task, [(args, kwargs)], bulk=False, ids=[job_id])[0]

    def _send_enqueued(self, results: Sequence[TaskResult[Any, Any]]) -> None:
        for result in results:
            signals.send(task_enqueued, "task_enqueued", sender=type(self), task_result=result)

    def max_attempts_for(self, task: Task[..., Any]) -> int:
        """How many times a job of ``task`` may be attempted before it is failed for good."""
        own = task.max_attempts if isinstance(task, StalwartTask) else None
        return own or self.config.max_attempts

    # -- results -----------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        """The job ``result_id`` as a ``TaskResult``, read from the database now;
        ``TaskResultDoesNotExist`` if there is no such job (or it was deleted)."""
        require_app()
        from stalwart.models import Job
        from stalwart.results import result_from_job

        try:
            job_id = uuid.UUID(str(result_id))
        except ValueError:
            raise TaskResultDoesNotExist(result_id) from None
        try:
            job = Job.objects.using(self.config.database).get(pk=job_id)
        except Job.DoesNotExist:
            raise TaskResultDoesNotExist(result_id) from None
        try:
            task = resolve_task(job.task_path)
        except TaskNotFound as error:
            raise InvalidTask(
                f"Job {result_id} was enqueued for {error.path!r}, which {error.reason}."
            ) from None
        return result_from_job(job, task)

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        """Django's system checks for this backend (``stalwart.E…``/``W…``)."""
        return check_backend(self, **kwargs)


if TYPE_CHECKING:
    # What the modules below take a Stalwart backend to be (stalwart.interface): mypy holds
    # this class to it here.
    _is_a_backend: type[Backend] = StalwartBackend
