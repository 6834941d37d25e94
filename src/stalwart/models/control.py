"""Queue pauses and concurrency keys: small tables that steer the queue."""

from django.db import models


class QueuePause(models.Model):
    """A paused queue: workers on every host stop claiming from it within a poll interval."""

    queue_name = models.CharField(max_length=64, primary_key=True)
    paused_at = models.DateTimeField()

    class Meta:
        db_table = "stalwart_queue_pause"

    def __str__(self) -> str:
        return f"{self.queue_name} (paused at {self.paused_at})"


class ConcurrencyKey(models.Model):
    """One row per concurrency key: its limit, and the row lock that hands out its slots.

    Slots are not counted here: the holders are the key's jobs that are ready or running, so
    a slot can never leak; this row is locked while a slot is taken or handed on.
    """

    key = models.CharField(max_length=255, primary_key=True)
    slot_limit = models.PositiveIntegerField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "stalwart_concurrency_key"

    def __str__(self) -> str:
        return f"{self.key} (limit {self.slot_limit})"
