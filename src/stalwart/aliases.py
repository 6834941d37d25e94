"""Which ``TASKS`` aliases are Stalwart's: the one place that knows.

A backend is Stalwart's when its class is ``stalwart.backend.StalwartBackend`` or a
subclass of it. This module recognises the class by its dotted path in the class's method
resolution order, without importing it: the backend imports most of Stalwart, and what
asks the question (the task catalog, the system checks, the commands, the dashboard,
SQLite's connection defaults) stands below it. A backend it recognises is typed as
``stalwart.interface.Backend``, for the same reason.
"""

from typing import TYPE_CHECKING, Any, TypeGuard

from django.conf import settings
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, task_backends

if TYPE_CHECKING:
    from stalwart.interface import Backend

# What a TASKS entry's "BACKEND" names to use Stalwart.
BACKEND_PATH = "stalwart.backend.StalwartBackend"


def is_stalwart_class(candidate: object) -> bool:
    """Whether ``candidate`` is Stalwart's backend class, or a subclass of it."""
    return isinstance(candidate, type) and any(
        f"{klass.__module__}.{klass.__qualname__}" == BACKEND_PATH for klass in candidate.__mro__
    )


def is_stalwart(backend: object) -> TypeGuard["Backend"]:
    """Whether ``backend`` (an entry of ``django.tasks.task_backends``) is Stalwart's."""
    return is_stalwart_class(type(backend))


def stalwart_aliases() -> list[str]:
    """The ``TASKS`` aliases whose backend is Stalwart's, the default first. An entry whose
    backend fails to load is not among them (Django's own check reports it)."""
    aliases = []
    for alias in getattr(settings, "TASKS", {}):
        try:
            backend = task_backends[alias]
        except Exception:  # noqa: BLE001, S112 - Django's own check reports broken backends
            continue
        if is_stalwart(backend):
            aliases.append(alias)
    return sorted(aliases, key=lambda alias: alias != DEFAULT_TASK_BACKEND_ALIAS)


def stalwart_backends() -> list[Any]:
    """The Stalwart backends of ``TASKS``, in the order of ``stalwart_aliases()``."""
    return [task_backends[alias] for alias in stalwart_aliases()]
