"""Per-task options: retries, timeout, concurrency limit, uniqueness.

``StalwartBackend.task_class`` is ``StalwartTask``, so on Django 6.1 the options go straight
into ``@task(...)``::

    @task(max_attempts=5, retry_on=(ConnectionError,), timeout=60)
    def sync_account(account_id): ...

Django 6.0's ``@task`` accepts no extra options; ``stalwart.task`` takes the same arguments
and works on both. Unknown options fail at import (``TypeError`` naming the option); invalid
values fail with ``InvalidTask`` naming the option and the task.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Literal, overload

from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME, Task, task_backends
from django.tasks.base import DEFAULT_TASK_PRIORITY
from django.tasks.exceptions import InvalidTask

from stalwart.exceptions import (
    InvalidStoredArguments,
    InvalidTaskArguments,
    TaskNotFound,
    TransactionLeftOpen,
)
from stalwart.serialization import normalize

if TYPE_CHECKING:
    from stalwart.context import StalwartTaskContext

    # django-stubs makes Task generic in its parameters and return value; Django's class is
    # not subscriptable, so the type checker alone sees the parameters.
    _AnyTask = Task[..., Any]
else:
    _AnyTask = Task


# Failures a retry cannot cure: the same call would fail the same way again.
NEVER_RETRIED = (InvalidStoredArguments, InvalidTaskArguments, TaskNotFound, TransactionLeftOpen)


@dataclass(frozen=True, slots=True)
class Exponential:
    """Wait ``base * 2**(n-1)`` seconds (±50%) after the n-th failure, at most ``maximum``."""

    base: float = 1.0
    maximum: float = 3600.0
    jitter: bool = True

    def __call__(self, failures: int) -> float:
        delay = self.base * 2 ** min(max(failures - 1, 0), 64)
        if self.jitter:
            delay *= random.uniform(0.5, 1.5)  # noqa: S311 - spreading retries, not secrecy
        return float(min(delay, self.maximum))


@dataclass(frozen=True, slots=True)
class Fixed:
    """Wait the same ``seconds`` after every failure."""

    seconds: float

    def __call__(self, failures: int) -> float:
        return self.seconds


def _is_exception_class(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseException)


@dataclass(frozen=True, slots=True, kw_only=True)
class StalwartTask(_AnyTask):
    """A ``django.tasks.Task`` with Stalwart's options. All default to "off"."""

    # Retries: with max_attempts set, exceptions matching retry_on are retried after
    # backoff(failures) seconds until max_attempts attempts have failed. A worker that dies
    # while running the job counts as a failed attempt too.
    max_attempts: int | None = None
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = Exception
    backoff: Callable[[int], float] | float = Exponential()
    # Timeout: an attempt running longer fails (or is retried) with JobTimedOut.
    timeout: float | None = None
    # Concurrency: at most concurrency_limit jobs with one key are ready or running at once.
    concurrency_limit: int | None = None
    concurrency_key: str | Callable[..., Any] | None = None
    concurrency_group: str | None = None
    # A running job's slot counts as free once this long has passed since its attempt began.
    concurrency_duration: float | timedelta | None = None
    # Uniqueness: enqueueing a job equal to one still waiting returns the waiting one.
    unique: bool | str | Callable[..., Any] = False
    unique_while_running: bool = False

    def __post_init__(self) -> None:
        self._check_options()
        Task.__post_init__(self)

    def _fail(self, option: str, problem: str) -> InvalidTask:
        name = f"{self.func.__module__}.{self.func.__qualname__}"
        return InvalidTask(f"Task {name!r}: option {option!r} {problem}.")

    def _check_options(self) -> None:
        if self.max_attempts is not None and (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or not 1 <= self.max_attempts <= 1000
        ):
            raise self._fail(
                "max_attempts", f"must be a whole number from 1 to 1000, not {self.max_attempts!r}"
            )
        retry_on = self.retry_on if isinstance(self.retry_on, tuple) else (self.retry_on,)
        if not retry_on or not all(_is_exception_class(kind) for kind in retry_on):
            raise self._fail(
                "retry_on", f"must be an exception class or a tuple of them, not {self.retry_on!r}"
            )
        if isinstance(self.backoff, bool) or not (
            callable(self.backoff) or isinstance(self.backoff, int | float)
        ):
            raise self._fail(
                "backoff",
                f"must be seconds or a callable taking the number of "
                f"failures, not {self.backoff!r}",
            )
        if isinstance(self.backoff, int | float) and self.backoff < 0:
            raise self._fail("backoff", f"must not be negative, not {self.backoff!r}")
        if self.timeout is not None and (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, int | float)
            or self.timeout <= 0
        ):
            raise self._fail(
                "timeout", f"must be a positive number of seconds, not {self.timeout!r}"
            )
        self._check_concurrency_options()

    def _check_concurrency_options(self) -> None:
        if self.concurrency_limit is not None and (
            isinstance(self.concurrency_limit, bool)
            or not isinstance(self.concurrency_limit, int)
            or self.concurrency_limit < 1
        ):
            raise self._fail(
                "concurrency_limit",
                f"must be a whole number of at least 1, not {self.concurrency_limit!r}",
            )
        for option in ("concurrency_key", "concurrency_group", "concurrency_duration"):
            if self.concurrency_limit is None and getattr(self, option):
                raise self._fail(option, "needs concurrency_limit as well")
        if self.concurrency_group is not None and (
            not isinstance(self.concurrency_group, str) or not self.concurrency_group
        ):
            raise self._fail(
                "concurrency_group", f"must be a non-empty string, not {self.concurrency_group!r}"
            )
        if self.concurrency_key is not None and not (
            isinstance(self.concurrency_key, str) or callable(self.concurrency_key)
        ):
            raise self._fail(
                "concurrency_key",
                f"must be a format string or a callable, not {self.concurrency_key!r}",
            )
        duration = self.concurrency_duration
        if duration is not None and (
            isinstance(duration, bool)
            or not isinstance(duration, int | float | timedelta)
            or not 0 < self._seconds(duration) <= 10**9
        ):
            raise self._fail(
                "concurrency_duration",
                f"must be a positive number of seconds or a timedelta, not {duration!r}",
            )
        if not isinstance(self.unique, bool | str) and not callable(self.unique):
            raise self._fail(
                "unique", f"must be True, a format string or a callable, not {self.unique!r}"
            )
        if self.unique_while_running and not self.unique:
            raise self._fail("unique_while_running", "needs unique as well")

    @staticmethod
    def _seconds(value: float | timedelta) -> float:
        return value.total_seconds() if isinstance(value, timedelta) else float(value)

    # -- what the worker and the backend ask of a task ----------------------------------------

    @property
    def concurrency_duration_seconds(self) -> float | None:
        """``concurrency_duration`` in seconds, or None for slots that never expire."""
        duration = self.concurrency_duration
        return None if duration is None else self._seconds(duration)

    def should_retry(self, exception: BaseException) -> bool:
        """Whether a failure with ``exception`` earns another attempt (cap permitting)."""
        if isinstance(exception, NEVER_RETRIED):
            return False  # the same call would fail the same way
        retry_on = self.retry_on if isinstance(self.retry_on, tuple) else (self.retry_on,)
        return self.max_attempts is not None and isinstance(exception, retry_on)

    def retry_delay(self, failures: int) -> float:
        if isinstance(self.backoff, int | float):
            return float(self.backoff)
        return max(float(self.backoff(failures)), 0.0)

    def concurrency_key_for(self, args: list[Any], kwargs: dict[str, Any]) -> str | None:
        """The key whose slots this call's job needs, or None without a limit."""
        if self.concurrency_limit is None:
            return None
        group = self.concurrency_group or self.module_path
        if self.concurrency_key is None:
            return _fit(group)
        value = _apply(self.concurrency_key, args, kwargs, self, "concurrency_key")
        return _fit(f"{group}:{value}")

    def unique_key_for(self, args: list[Any], kwargs: dict[str, Any]) -> str | None:
        """The key that makes two calls the same job, or None when not unique."""
        if not self.unique:
            return None
        if self.unique is True:
            # By parameter name, defaults filled in: f(1), f(x=1) and f(x=1, y=2) with y=2
            # by default are one call; so are f(a=1, b=2) and f(b=2, a=1).
            try:
                named = _named_arguments(self, args, kwargs)
            except TypeError:
                named = {"args": args, "kwargs": kwargs}  # does not fit the signature: as given
            material = json.dumps([self.module_path, named], sort_keys=True, separators=(",", ":"))
        else:
            material = f"{self.module_path}:{_apply(self.unique, args, kwargs, self, 'unique')}"
        return hashlib.sha256(material.encode()).hexdigest()


MAX_KEY_LENGTH = 255


def _fit(key: str) -> str:
    """Keys longer than the column holds are replaced by a digest (equal keys stay equal)."""
    if len(key) <= MAX_KEY_LENGTH:
        return key
    return f"sha256:{hashlib.sha256(key.encode()).hexdigest()}"


def _named_arguments(task: StalwartTask, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by parameter name, defaults included (the context left out)."""
    signature = inspect.signature(task.func)
    leading = [None] if task.takes_context else []
    bound = signature.bind_partial(*leading, *args, **kwargs)
    bound.apply_defaults()
    named = dict(bound.arguments)
    if task.takes_context:
        named.pop(next(iter(signature.parameters)), None)
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            named.update(named.pop(parameter.name, {}))
    return named


def _apply(
    spec: Any, args: list[Any], kwargs: dict[str, Any], task: StalwartTask, option: str
) -> str:
    """Compute a key: a format string sees the arguments by name (and position); a callable
    is called with the call's own arguments."""
    try:
        if isinstance(spec, str):
            value = spec.format(*args, **_named_arguments(task, args, kwargs))
        else:
            value = spec(*args, **kwargs)
    except (KeyError, IndexError, AttributeError, TypeError, ValueError) as error:
        raise task._fail(option, f"could not be computed for this call: {error!r}") from None
    if not isinstance(value, str):
        value = json.dumps(normalize(value, option), sort_keys=True)
    return value


@overload
def task[**P, R](
    function: Callable[P, R],
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: Literal[False] = False,
    **options: Any,
) -> Task[P, R]: ...
@overload
def task[**P, R](
    function: Callable[Concatenate[StalwartTaskContext, P], R],
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: Literal[True],
    **options: Any,
) -> Task[P, R]: ...
@overload
def task[**P, R](
    function: None = None,
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: Literal[False] = False,
    **options: Any,
) -> Callable[[Callable[P, R]], Task[P, R]]: ...
@overload
def task[**P, R](
    function: None = None,
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: Literal[True],
    **options: Any,
) -> Callable[[Callable[Concatenate[StalwartTaskContext, P], R]], Task[P, R]]: ...
def task(
    function: Callable[..., Any] | None = None,
    *,
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    **options: Any,
) -> Task[..., Any] | Callable[[Callable[..., Any]], Task[..., Any]]:
    """Like ``django.tasks.task``, with Stalwart's options, on Django 6.0 and 6.1 alike.

    With a Stalwart backend, the task is a ``StalwartTask``; ``options`` are its options
    (``max_attempts``, ``retry_on``, ``backoff``, ``timeout``, ``concurrency_limit``,
    ``concurrency_key``, ``concurrency_group``, ``concurrency_duration``, ``unique``,
    ``unique_while_running``)."""
    if "run_after" in options:
        raise TypeError(
            "run_after cannot be defined statically with the @task decorator. "
            "Use .using(run_after=...) to set it dynamically."
        )

    def wrapper(func: Callable[..., Any]) -> Task[..., Any]:
        task_class = task_backends[backend].task_class
        return task_class(
            func=func,
            priority=priority,
            queue_name=queue_name,
            backend=backend,
            takes_context=takes_context,
            run_after=None,
            **options,
        )

    return wrapper(function) if function else wrapper
