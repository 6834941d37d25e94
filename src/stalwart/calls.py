"""What ``enqueue()`` checks about a call before a job exists, so that a mistake fails in
the code that made it, not later in a worker:

- the task can be found by its path in another process (``check_importable``): a function
  of ``__main__``, of an interactive shell or of ``exec()`` cannot;
- the arguments fit the function's signature (``check_call``): the ``TypeError`` the call
  itself would raise, raised at enqueue.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.tasks import Task

from stalwart.exceptions import ArgumentsDoNotFit, TaskNotImportable


def _defined_where_no_worker_looks(func: Callable[..., Any]) -> str | None:
    """Why a worker process could not import ``func`` by its path, or None."""
    module_name = getattr(func, "__module__", None)
    code = getattr(func, "__code__", None)
    filename = code.co_filename if code is not None else ""
    if module_name == "__main__":
        return "its function is defined in __main__ (the script or command being run)"
    if module_name is None or (filename.startswith("<") and filename.endswith(">")):
        return f"its function is defined interactively ({filename or 'in a shell'})"
    module = sys.modules.get(module_name)
    found = getattr(module, func.__qualname__, None) if module is not None else None
    if not isinstance(found, Task) or found.func is not func:
        return (
            f"module {module_name!r} has no task named {func.__qualname__!r} (was it defined "
            "in a shell, or under another name?)"
        )
    return None


def check_importable(task: Task[..., Any]) -> None:
    """Refuse a task whose path leads nowhere in a worker process."""
    reason = _defined_where_no_worker_looks(task.func)
    if reason is not None:
        raise TaskNotImportable(task.module_path, reason)


@functools.lru_cache(maxsize=1024)
def _signature(func: Callable[..., Any], takes_context: bool) -> inspect.Signature | None:
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # no signature to check against
        return None
    parameters = list(signature.parameters.values())
    if takes_context:
        parameters = parameters[1:]  # the context: the worker passes it
    return signature.replace(parameters=parameters, return_annotation=inspect.Signature.empty)


def call_signature(task: Task[..., Any]) -> inspect.Signature | None:
    """The signature a call of ``task`` must fit (without the context), if it has one."""
    return _signature(task.func, task.takes_context)


def check_call(
    task: Task[..., Any],
    signature: inspect.Signature,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> None:
    """Raise ``ArgumentsDoNotFit`` (a ``TypeError``) if the call would not bind."""
    try:
        signature.bind(*args, **kwargs)
    except TypeError as error:
        raise ArgumentsDoNotFit(task.module_path, str(signature), str(error)) from None
