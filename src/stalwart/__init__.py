"""Stalwart: a database-backed backend for Django's ``django.tasks``."""

from stalwart.bulk import Call, aenqueue_many, enqueue_many
from stalwart.task import Exponential, Fixed, StalwartTask, task

__all__ = ["Call", "Exponential", "Fixed", "StalwartTask", "aenqueue_many", "enqueue_many", "task"]
__version__ = "0.1.0.dev0"
