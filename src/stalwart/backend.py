"""``StalwartBackend``: Django's task backend API, with jobs stored in the database.

The module loads without Stalwart's app installed (its models, and ``stalwart.db``, which
needs them, are imported when first used), so that a project that forgot ``"stalwart"`` in
``INSTALLED_APPS`` gets the system check ``stalwart.E004`` and an ``ImproperlyConfigured``
at enqueue that say so, not a ``RuntimeError`` from deep in Django's model registry.
"""

import uuid
from collections.abc import Iterable, Mapping, Sequence
from functools import cached_property, partial
from typing import Any

from django.db import transaction
from django.tasks import Task, TaskResult, TaskResultStatus
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued
from django.utils import timezone

from stalwart import events, signals
from stalwart.calls import call_signature, check_call, check_importable
from stalwart.checks import require_app
from stalwart.conf import Options, read_options
from stalwart.exceptions import TaskNotFound
from stalwart.ids import uuid7, uuid7s
from stalwart.queues import validate_queue_name
from stalwart.resolution import resolve_task
from stalwart.serialization import encode_arguments, normalize_arguments
from stalwart.task import StalwartTask


class StalwartBackend(BaseTaskBackend):
    """Stores each enqueued task call as a row; ``queue work`` / ``queue supervise`` run them."""

    task_class = StalwartTask
    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: Mapping[str, Any]) -> None:
        super().__init__(alias, params)
        self.config: Options = read_options(alias, params)
        if self.config.metrics:
            from stalwart.metrics import tally

            tally.install(self.config.database)

    @cached_property
    def store(self) -> Any:
        require_app()
        from stalwart.jobs import JobStore

        return JobStore(self.config.database, notify=self.config.listen_notify)

    def validate_task(self, task: Task) -> None:
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

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any]) -> TaskResult:
        return self._enqueue(task, [(args, kwargs)], bulk=False)[0]

    def enqueue_many(
        self, task: Task, calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]]
    ) -> list[TaskResult]:
        """Enqueue many calls of one task in as few INSERT statements as possible.

        ``calls`` yields ``(args, kwargs)`` pairs (``stalwart.Call`` objects are such pairs).
        Every call is validated before anything is written: one bad call enqueues none.
        """
        calls = list(calls)
        # The ids made together, in one step: a bulk enqueue makes thousands.
        return self._enqueue(task, calls, bulk=True, ids=uuid7s(len(calls)))

    def _enqueue(
        self,
        task: Task,
        calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]],
        *,
        bulk: bool,
        ids: Sequence[uuid.UUID] = (),
    ) -> list[TaskResult]:
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
        scheduled = run_after is not None and run_after > now
        status = (JobStatus.SCHEDULED if scheduled else JobStatus.READY).value
        available_at = run_after if scheduled else now
        task_path = task.module_path
        limit = self.config.max_arguments_size
        max_attempts = self.max_attempts_for(task)
        guarded = isinstance(task, StalwartTask) and bool(
            task.concurrency_limit is not None or task.unique
        )
        rows: list[NewJob] = []
        results: list[TaskResult] = []
        # Whether a call binds depends only on its shape (how many positional arguments,
        # which keyword names): the calls of one enqueue_many() are checked once per shape.
        fitting: set[tuple[int, frozenset]] = set()
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
            if guarded:
                concurrency_key = task.concurrency_key_for(plain_args, plain_kwargs)
                unique_key = task.unique_key_for(plain_args, plain_kwargs)
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
                    concurrency_limit=task.concurrency_limit if concurrency_key else None,
                    concurrency_duration=(
                        task.concurrency_duration_seconds if concurrency_key else None
                    ),
                    unique_key=unique_key,
                    unique_while_running=bool(unique_key and task.unique_while_running),
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
            return []
        fresh = results
        with noted(self.config.database):  # a missing table says what to run, say
            if guarded:
                results, fresh = self._insert_guarded(task, rows, results)
            else:
                store.insert(rows)
        # Announce the jobs once they exist for everyone: at commit, or now in autocommit.
        transaction.on_commit(partial(self._send_enqueued, fresh), using=self.config.database)
        for result in fresh:
            events.emit("job_enqueued", job=result.id, task=task_path, queue=task.queue_name)
        return results

    def _insert_guarded(
        self, task: Task, rows: list[Any], results: list[TaskResult]
    ) -> tuple[list[TaskResult], list[TaskResult]]:
        """Insert jobs with a concurrency key or a unique key; a duplicate returns its twin.

        Returns every call's result, and those of the jobs actually created.
        """
        stored = self.store.insert_guarded(rows)
        keys = sorted({row.concurrency_key for row in rows if row.concurrency_key is not None})
        if keys:
            # Slots are handed out once the jobs exist for everyone (the dispatcher's sweep
            # catches any this misses).
            transaction.on_commit(
                partial(self.store.unblock, keys, limit=task.concurrency_limit),
                using=self.config.database,
                robust=True,
            )
        from stalwart.db import NewJob

        final, fresh = [], []
        for result, outcome in zip(results, stored, strict=True):
            if isinstance(outcome, NewJob):
                final.append(result)
                fresh.append(result)
                continue
            events.emit("job_deduplicated", task=task.module_path, job=str(outcome))
            final.append(self.get_result(str(outcome)))
        return final, fresh

    def enqueue_with_id(
        self, task: Task, args: Sequence[Any], kwargs: Mapping[str, Any], job_id: uuid.UUID
    ) -> TaskResult:
        """Enqueue one call under an id chosen beforehand (the scheduler records it first)."""
        return self._enqueue(task, [(args, kwargs)], bulk=False, ids=[job_id])[0]

    def _send_enqueued(self, results: list[TaskResult]) -> None:
        for result in results:
            signals.send(task_enqueued, "task_enqueued", sender=type(self), task_result=result)

    def max_attempts_for(self, task: Task) -> int:
        """How many times a job of ``task`` may be attempted before it is failed for good."""
        return getattr(task, "max_attempts", None) or self.config.max_attempts

    # -- results -----------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
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

    def check(self, **kwargs: Any) -> list:
        from stalwart.checks import check_backend

        return check_backend(self, **kwargs)
