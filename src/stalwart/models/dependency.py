"""Dependencies: a job that runs after other jobs (``stalwart.enqueue_after``, ``chain``)."""

from django.db import models


class OnFailure(models.TextChoices):
    """What a dependant does when its parent fails for good, is cancelled, or is gone."""

    CANCEL = "cancel", "Cancel the dependant"
    RUN = "run", "Run the dependant anyway"


class Dependency(models.Model):
    """One edge: ``child`` runs after ``parent``. Written with the child, in the same
    transaction, and never changed: whether it holds is read from the parent's state.

    No foreign keys: retention deletes finished jobs, and a child whose parent is gone is
    resolved (cancelled, or run, as ``on_failure`` says), never stranded."""

    id = models.BigAutoField(primary_key=True)
    child = models.UUIDField()
    parent = models.UUIDField()
    # The parent's place in the child's list: ``context.parent_results()`` keeps that order.
    position = models.PositiveSmallIntegerField()
    on_failure = models.CharField(max_length=8, choices=OnFailure.choices)

    class Meta:
        db_table = "stalwart_dependency"
        constraints = [
            models.UniqueConstraint(fields=["child", "parent"], name="stalwart_dependency_edge"),
        ]
        indexes = [
            # A job's dependants (the job page, cancelling a parent).
            models.Index(fields=["parent"], name="stalwart_dependency_parent"),
        ]

    def __str__(self) -> str:
        return f"{self.child} after {self.parent} ({self.on_failure})"
