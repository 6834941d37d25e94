"""From a stored task path back to the task object: only ``django.tasks`` tasks qualify.

Nothing else named in the database is ever called: a path that imports to a plain function,
a class, or anything that is not a ``Task`` registered under exactly that path is refused.
"""

import functools
from importlib import import_module

from django.tasks import Task

from stalwart.exceptions import TaskNotFound


@functools.lru_cache(maxsize=1024)
def resolve_task(path: str) -> Task:
    """The task object at ``path``, or ``TaskNotFound`` saying why not."""
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise TaskNotFound(path, "is not a dotted path to a task")
    # Nested qualified names (Class.method) are not module-level tasks.
    try:
        module = import_module(module_name)
    except ImportError as error:
        raise TaskNotFound(path, f"cannot be imported: {error}") from None
    candidate = getattr(module, attribute, None)
    if candidate is None:
        raise TaskNotFound(path, f"does not exist: module {module_name!r} has no {attribute!r}")
    if not isinstance(candidate, Task):
        raise TaskNotFound(
            path, f"is a {type(candidate).__name__}, not a django.tasks task; refusing to run it"
        )
    if candidate.module_path != path:
        raise TaskNotFound(path, f"is an alias of the task {candidate.module_path!r}")
    return candidate
