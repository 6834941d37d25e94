"""The benchmark's own tables: what a task writes, and a row the size of a job's.

No migrations: the benchmark creates them with ``migrate --run-syncdb``.
"""

import uuid

from django.db import models


class Record(models.Model):
    """What the one-insert task writes: a small row, as a job that records something."""

    value = models.IntegerField()
    note = models.CharField(max_length=64)

    def __str__(self) -> str:
        return self.note


class JobSizedRow(models.Model):
    """A row shaped like a new job's (the columns an enqueue writes), for the reference
    ``Model.objects.create()`` that a single enqueue is compared with."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    task_path = models.CharField(max_length=255)
    backend = models.CharField(max_length=64)
    queue_name = models.CharField(max_length=64)
    priority = models.SmallIntegerField()
    status = models.CharField(max_length=16)
    args = models.JSONField()
    kwargs = models.JSONField()
    run_after = models.DateTimeField(null=True)
    available_at = models.DateTimeField()
    enqueued_at = models.DateTimeField()
    max_attempts = models.IntegerField()
    attempt = models.IntegerField()
    worker_ids = models.JSONField()
    errors = models.JSONField()
    # Nullable as the job's are (DJ001: NULL is what an enqueue writes there).
    concurrency_key = models.CharField(max_length=255, null=True)  # noqa: DJ001
    concurrency_limit = models.IntegerField(null=True)
    unique_key = models.CharField(max_length=255, null=True)  # noqa: DJ001

    def __str__(self) -> str:
        return str(self.id)
