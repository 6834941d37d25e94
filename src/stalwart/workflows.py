"""Jobs that run after other jobs: ``enqueue_after`` and ``chain``.

::

    import stalwart

    fetched = fetch_rates.enqueue("EUR")
    report = stalwart.enqueue_after([fetched], build_report, month=11)
    stalwart.enqueue_after([stalwart.After(report, on_failure="run")], clean_up)

    charge_then_ship = stalwart.chain(
        (charge, stalwart.Call(order_id=7)),
        (ship, stalwart.Call(order_id=7)),
        notify_customer,
    )

A dependant is ``pending`` until every job it runs after has succeeded; then it is
claimable as any job (its priority, queue, ``run_after`` and concurrency key apply from
there). If a parent fails for good, is cancelled, or is deleted, the dependant is cancelled
(``on_failure="cancel"``, the default), and so are its own dependants, or it runs anyway
(``on_failure="run"``). A task that takes its context reads its parents' results with
``context.parent_results()``. See docs/how-to/workflows.md.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import transaction
from django.tasks import Task, TaskResult

from stalwart.aliases import is_stalwart
from stalwart.bulk import Call
from stalwart.exceptions import InvalidDependency, NotAStalwartBackend

if TYPE_CHECKING:
    from stalwart.interface import Backend

ON_FAILURE = ("cancel", "run")


class After:
    """A job to run after, and what its dependant does if it fails for good, is cancelled
    or is deleted: ``"cancel"`` (the default: the dependant and its own dependants are
    cancelled) or ``"run"`` (the dependant runs anyway, once the parent has finished).

    ``job`` is a ``TaskResult`` (what ``enqueue`` returned) or a job's id.
    """

    __slots__ = ("backend", "job_id", "on_failure")
    backend: str | None  # None for a bare id: the task's backend is checked at enqueue

    def __init__(self, job: TaskResult[Any, Any] | str, *, on_failure: str = "cancel") -> None:
        if on_failure not in ON_FAILURE:
            raise InvalidDependency(
                f"on_failure={on_failure!r} is not one of {', '.join(map(repr, ON_FAILURE))}."
            )
        if isinstance(job, TaskResult):
            self.job_id, self.backend = str(job.id), job.backend
        elif isinstance(job, str):
            self.job_id, self.backend = job, None
        else:
            raise InvalidDependency(
                f"A job to run after is a TaskResult or a job id, not {type(job).__name__} "
                f"({job!r})."
            )
        self.on_failure = on_failure

    def __repr__(self) -> str:
        return f"After({self.job_id!r}, on_failure={self.on_failure!r})"


def _backend(task: Task[..., Any], verb: str) -> Backend:
    backend = task.get_backend()
    if not is_stalwart(backend):
        raise NotAStalwartBackend(
            f"{verb}() needs a Stalwart backend; task {task.module_path!r} uses "
            f"{type(backend).__qualname__} (TASKS[{task.backend!r}])."
        )
    return backend


type Parents = Iterable[TaskResult[Any, Any] | After | str] | TaskResult[Any, Any] | After


def _parents(task: Task[..., Any], after: Parents) -> list[tuple[str, str]]:
    """``after`` as (job id, on_failure) pairs, checked: no job twice, none of another
    backend, at least one."""
    pairs: list[tuple[str, str]] = []
    seen: set[uuid.UUID] = set()
    for parent in _as_afters(after):
        if parent.backend is not None and parent.backend != task.backend:
            raise InvalidDependency(
                f"{task.module_path} (backend {task.backend!r}) cannot run after job "
                f"{parent.job_id} of backend {parent.backend!r}: a job runs after jobs of "
                "its own backend only."
            )
        try:
            job_id = uuid.UUID(parent.job_id)
        except ValueError:
            raise InvalidDependency(f"{parent.job_id!r} is not a job id.") from None
        if job_id in seen:
            raise InvalidDependency(f"Job {job_id} is listed twice in after=.")
        seen.add(job_id)
        pairs.append((str(job_id), parent.on_failure))
    if not pairs:
        raise InvalidDependency(
            f"enqueue_after() for {task.module_path} got no job to run after: call "
            "task.enqueue() for a job that waits for nothing."
        )
    return pairs


def _as_afters(after: Any, on_failure: str = "cancel") -> list[After]:
    """``after`` as a list of ``After``: one result, id or ``After``, or an iterable of
    them; anything else is an ``InvalidDependency``."""
    if isinstance(after, (TaskResult, After, str)):
        after = [after]
    try:
        items = list(after)
    except TypeError:
        raise InvalidDependency(
            f"after={after!r}: give the jobs to run after as a list of TaskResults, job ids "
            "or After(...)."
        ) from None
    return [
        item if isinstance(item, After) else After(item, on_failure=on_failure) for item in items
    ]


def enqueue_after[**P, R](
    after: Parents,
    task: Task[P, R],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> TaskResult[P, R]:
    """Enqueue ``task(*args, **kwargs)`` to run once every job in ``after`` has succeeded
    (or, for an ``After(..., on_failure="run")``, finished).

    The result's status is ``READY`` (the job is stored as ``pending`` until then). Inside
    ``transaction.atomic()`` the job exists only if the transaction commits. An unknown
    job, a job of another backend, a job listed twice: ``InvalidDependency``, and nothing
    is enqueued.

    A job of a unique task holds its key while it waits for its parents. A call whose key
    another job holds (one that waits, or runs with ``unique_while_running``) returns that
    job's result, as ``enqueue`` does, and stores nothing: that job does not start waiting
    for ``after``.
    """
    backend = _backend(task, "enqueue_after")
    return backend.enqueue_after(task, args, kwargs, _parents(task, after))


async def aenqueue_after[**P, R](
    after: Parents,
    task: Task[P, R],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> TaskResult[P, R]:
    """The async twin of ``enqueue_after``."""
    backend = _backend(task, "aenqueue_after")
    parents = _parents(task, after)
    return await sync_to_async(backend.enqueue_after, thread_sensitive=True)(
        task, args, kwargs, parents
    )


type Step = Task[..., Any] | tuple[Task[..., Any], Call | tuple[Sequence[Any], dict[str, Any]]]


def chain(
    *steps: Step,
    after: Iterable[TaskResult[Any, Any] | After | str] = (),
    on_failure: str = "cancel",
) -> list[TaskResult[Any, Any]]:
    """Enqueue jobs that run one after another: each step runs once the one before it has
    succeeded, and reads its result with ``context.parent_results()[0]``.

    A step is a task (called with no arguments) or a ``(task, Call(...))`` pair. The first
    step runs after ``after`` (if given). ``on_failure`` is each link's: ``"cancel"`` (a
    failed link cancels the rest) or ``"run"``. All steps are enqueued in one transaction
    of their database, or none. Returns the steps' results, in order.
    """
    if not steps:
        raise InvalidDependency("chain() needs at least one step.")
    calls: list[tuple[Task[..., Any], Sequence[Any], dict[str, Any]]] = []
    for index, step in enumerate(steps, start=1):
        if isinstance(step, Task):
            calls.append((step, (), {}))
            continue
        try:
            task, (args, kwargs) = step
        except (TypeError, ValueError):
            raise InvalidDependency(
                f"Step {index} of chain() is {step!r}: a step is a task, or a (task, "
                "Call(...)) pair."
            ) from None
        if not isinstance(task, Task):
            raise InvalidDependency(f"Step {index} of chain() names {task!r}, which is not a task.")
        calls.append((task, tuple(args), dict(kwargs)))
    if on_failure not in ON_FAILURE:
        raise InvalidDependency(
            f"on_failure={on_failure!r} is not one of {', '.join(map(repr, ON_FAILURE))}."
        )
    first = calls[0][0]
    database = _backend(first, "chain").config.database
    before: list[Any] = _as_afters(after, on_failure) if after else []
    results: list[TaskResult[Any, Any]] = []
    with transaction.atomic(using=database):
        for task, args, kwargs in calls:
            if before:
                result = enqueue_after(before, task, *args, **kwargs)
            else:
                result = task.enqueue(*args, **kwargs)
            results.append(result)
            before = [After(result, on_failure=on_failure)]
    return results
