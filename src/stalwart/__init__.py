"""Stalwart: a database-backed backend for Django's ``django.tasks``."""

from stalwart.bulk import Call, aenqueue_many, enqueue_many

__all__ = ["Call", "aenqueue_many", "enqueue_many"]
__version__ = "0.1.0.dev0"
