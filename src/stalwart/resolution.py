"""From a stored task path back to the task object: only ``django.tasks`` tasks qualify.

A path read from the database is never imported. It is looked up among the modules this
process has already imported, after loading the project's task modules once (see
``stalwart.catalog``); a path to any other module is refused without importing anything.
Nothing else named in the database is ever called either: a path that leads to a plain
function, a class, or anything that is not a ``Task`` registered under exactly that path is
refused.
"""

import functools
import sys

from django.tasks import Task

from stalwart import catalog
from stalwart.exceptions import TaskNotFound

# Where a task must live for workers to find it, for the messages of TaskNotFound.
WHERE_TASKS_LIVE = (
    "Stalwart imports only each installed app's 'tasks' module, the modules of "
    "OPTIONS['recurring'] and those listed in OPTIONS['task_modules'], and never a module "
    "named by a job"
)


@functools.lru_cache(maxsize=1024)
def resolve_task(path: str) -> Task:
    """The task object at ``path``, or ``TaskNotFound`` saying why not."""
    module_name, _, attribute = path.rpartition(".")
    if not module_name or not attribute:
        raise TaskNotFound(path, "is not a dotted path to a task")
    loaded = catalog.load()
    module = sys.modules.get(module_name)
    if module is None:
        failure = loaded.failed.get(module_name) if loaded is not None else None
        if failure is not None:
            where, error = failure
            raise TaskNotFound(
                path,
                f"cannot be imported: module {module_name!r} (named by {where}) failed "
                f"to import: {error}",
                elsewhere=True,
            )
        raise TaskNotFound(
            path,
            f"is in module {module_name!r}, which is not one of the project's task modules: "
            f"{WHERE_TASKS_LIVE}. Add {module_name!r} to TASKS[...]['OPTIONS']['task_modules'] "
            "if its tasks are meant to run",
            elsewhere=True,
        )
    candidate = getattr(module, attribute, None)
    if candidate is None:
        raise TaskNotFound(
            path, f"does not exist: module {module_name!r} has no {attribute!r}", elsewhere=True
        )
    if not isinstance(candidate, Task):
        raise TaskNotFound(
            path, f"is a {type(candidate).__name__}, not a django.tasks task; refusing to run it"
        )
    if candidate.module_path != path:
        raise TaskNotFound(path, f"is an alias of the task {candidate.module_path!r}")
    return candidate
