"""Batches: jobs enqueued together, with callbacks once they are all done."""

from django.db import models


class Batch(models.Model):
    """A group of jobs (``stalwart.batch()``). Open, it takes more jobs; closed, its
    callbacks are enqueued once every member has finished, once (``finished_at`` is set in
    the same transaction).

    ``total`` is the number of members, counted as they are added (in their transaction),
    so a batch's size reads in O(1); the members' states are read through
    ``stalwart_batch_job``."""

    id = models.UUIDField(primary_key=True, editable=False)
    backend = models.CharField(max_length=64)
    label = models.CharField(max_length=255, blank=True, default="")
    created_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    # When its callbacks were enqueued (every member had finished): it takes no more jobs.
    finished_at = models.DateTimeField(null=True, blank=True)
    total = models.PositiveIntegerField(default=0)
    # {"on_success": {"task_path", "args", "kwargs", "queue_name", "priority"}, ...}
    callbacks = models.JSONField(default=dict)

    class Meta:
        db_table = "stalwart_batch"
        indexes = [
            # Closed batches whose callbacks are still to come: what the dispatcher looks at.
            models.Index(
                fields=["closed_at"],
                condition=models.Q(closed_at__isnull=False, finished_at__isnull=True),
                name="stalwart_batch_waiting",
            ),
        ]

    def __str__(self) -> str:
        return f"batch {self.id} ({self.label or 'no label'}, {self.total} jobs)"


class BatchRole(models.TextChoices):
    MEMBER = "member", "Member"
    ON_SUCCESS = "on_success", "On success"
    ON_FAILURE = "on_failure", "On failure"
    ON_FINISH = "on_finish", "On finish"


class BatchJob(models.Model):
    """A job of a batch: a member, or one of its callbacks once enqueued."""

    id = models.BigAutoField(primary_key=True)
    batch = models.UUIDField()
    job = models.UUIDField()
    role = models.CharField(max_length=16, choices=BatchRole.choices)

    class Meta:
        db_table = "stalwart_batch_job"
        constraints = [
            # A job is in one batch at most, once.
            models.UniqueConstraint(fields=["job"], name="stalwart_batch_job_once"),
        ]
        indexes = [
            # A batch's members, newest first (whether one is still to finish), or in order.
            models.Index(fields=["batch", "role", "id"], name="stalwart_batch_job_members"),
        ]

    def __str__(self) -> str:
        return f"{self.job} in batch {self.batch} ({self.role})"
