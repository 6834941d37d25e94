"""Stalwart: a database-backed backend for Django's ``django.tasks``."""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _distribution_version

from stalwart.batches import Batch, BatchProgress, batch, get_batch
from stalwart.bulk import Call, aenqueue_many, enqueue_many
from stalwart.cancellation import acancel, cancel
from stalwart.context import StalwartTaskContext
from stalwart.task import Exponential, Fixed, StalwartTask, task
from stalwart.workflows import After, aenqueue_after, chain, enqueue_after

__all__ = [
    "After",
    "Batch",
    "BatchProgress",
    "Call",
    "Exponential",
    "Fixed",
    "StalwartTask",
    "StalwartTaskContext",
    "acancel",
    "aenqueue_after",
    "aenqueue_many",
    "batch",
    "cancel",
    "chain",
    "enqueue_after",
    "enqueue_many",
    "get_batch",
    "task",
]
# One place for the version: pyproject.toml, read back from the installed distribution (a
# source tree put on the path without being installed has none to read).
try:
    __version__: str = _distribution_version("django-stalwart")
except PackageNotFoundError:  # pragma: no cover - only outside any installation
    __version__ = "0+unknown"
