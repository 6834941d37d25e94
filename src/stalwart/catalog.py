"""The task catalog: the modules a process takes tasks from, imported once, up front.

A job row names its task by a dotted path. Importing whatever a row names would run the
top-level code of any module on the database's say-so, so no process ever does. Instead,
the first time a process resolves a task path, it imports the project's task modules:

- the ``tasks`` module of each installed app (Django's ``autodiscover_modules("tasks")``);
- the module of each ``OPTIONS["recurring"]`` entry's task;
- each module listed in ``OPTIONS["task_modules"]``;

of every Stalwart backend in ``TASKS``. From then on, task paths are looked up only among
modules already imported (those, and whatever they and the project imported).
"""

import os
import threading
from dataclasses import dataclass
from importlib import import_module
from importlib.util import find_spec

from django.apps import apps

from stalwart import events
from stalwart.aliases import stalwart_backends


@dataclass(frozen=True, slots=True)
class Catalog:
    """What loading the task modules did: each module imported, each one that failed."""

    loaded: dict[str, str]  # module name -> where it was named (a setting, an app)
    failed: dict[str, tuple[str, str]]  # module name -> (where it was named, the error)


def project_task_modules() -> list[tuple[str, str]]:
    """``(module, where it is named)`` for every task module of the project, in load order."""
    named = [(f"{config.name}.tasks", f"app {config.label!r}") for config in apps.get_app_configs()]
    for backend in stalwart_backends():
        where = f"TASKS[{backend.alias!r}]['OPTIONS']"
        for entry in backend.config.recurring:
            module = entry.task_path.rpartition(".")[0]
            if module:
                named.append((module, f"{where}['recurring'][{entry.key!r}]"))
        for index, module in enumerate(backend.config.task_modules):
            named.append((module, f"{where}['task_modules'][{index}]"))
    return named


def _is_optional_app_module(module: str, where: str) -> bool:
    """An app without a ``tasks`` module is fine (as in ``autodiscover_modules``)."""
    if not where.startswith("app "):
        return False
    try:
        return find_spec(module) is None
    except ImportError:
        return False


def build_catalog(named: list[tuple[str, str]]) -> Catalog:
    """Import each named module; record what loaded and what failed (never raise)."""
    loaded: dict[str, str] = {}
    failed: dict[str, tuple[str, str]] = {}
    for module, where in named:
        if module in loaded or module in failed:
            continue
        if _is_optional_app_module(module, where):
            continue
        try:
            import_module(module)
        except Exception as error:  # noqa: BLE001 - recorded; jobs of its tasks fail saying so
            failed[module] = (where, f"{type(error).__name__}: {error}")
            events.emit(
                "task_module_failed", module=module, named_by=where, error=failed[module][1]
            )
        else:
            loaded[module] = where
    return Catalog(loaded=loaded, failed=failed)


class _Loader:
    """Loads the catalog once per process, whatever the threads and forks."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.catalog: Catalog | None = None
        self.loading_thread: int | None = None

    def load(self) -> Catalog | None:
        """The catalog, loaded on first use in this process. None only while it is loading
        in this very thread (a task module that resolves a task path as it is imported)."""
        if self.catalog is not None:
            return self.catalog
        with self.lock:
            if self.catalog is None:
                if self.loading_thread == threading.get_ident():
                    return None
                self.loading_thread = threading.get_ident()
                try:
                    self.catalog = build_catalog(project_task_modules())
                finally:
                    self.loading_thread = None
        return self.catalog

    def after_fork_in_child(self) -> None:
        # A thread of the parent may have held the lock at the fork; it does not exist here.
        self.lock = threading.RLock()
        self.loading_thread = None


_loader = _Loader()
load = _loader.load
os.register_at_fork(after_in_child=_loader.after_fork_in_child)
