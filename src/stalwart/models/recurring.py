"""One row per recurring-task tick that was enqueued: the (key, run time) is unique."""

from django.db import models


class RecurringRun(models.Model):
    """The record that makes a tick happen once, however many schedulers race for it."""

    id = models.BigAutoField(primary_key=True)
    key = models.CharField(max_length=128)
    run_at = models.DateTimeField()
    job_id = models.UUIDField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "stalwart_recurring_run"
        constraints = [
            models.UniqueConstraint(fields=["key", "run_at"], name="stalwart_recurring_run_once")
        ]

    def __str__(self) -> str:
        return f"{self.key} at {self.run_at}"
