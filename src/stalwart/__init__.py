"""Stalwart: a database-backed backend for Django's ``django.tasks``."""

from stalwart.bulk import Call, aenqueue_many, enqueue_many
from stalwart.cancellation import acancel, cancel
from stalwart.context import StalwartTaskContext
from stalwart.task import Exponential, Fixed, StalwartTask, task

__all__ = [
    "Call",
    "Exponential",
    "Fixed",
    "StalwartTask",
    "StalwartTaskContext",
    "acancel",
    "aenqueue_many",
    "cancel",
    "enqueue_many",
    "task",
]
__version__ = "0.1.0.dev0"
