"""Counters every process adds to: what the metrics endpoint reports as Prometheus counters."""

from django.db import models


class Counter(models.Model):
    """One counter (or one bucket of a histogram), per queue and task where that applies.

    Processes add what they counted every few seconds, in one statement
    (``stalwart.metrics.tally``): so the figures add up across processes and hosts, and
    survive restarts, and any web process can serve them.
    """

    id = models.BigAutoField(primary_key=True)
    name = models.CharField(max_length=64)
    queue_name = models.CharField(max_length=64, default="", blank=True)
    task_path = models.CharField(max_length=255, default="", blank=True)
    # A histogram bucket's upper bound ("0.5", "+Inf"); "" for a plain counter.
    le = models.CharField(max_length=16, default="", blank=True)
    value = models.FloatField(default=0)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "stalwart_counter"
        constraints = [
            models.UniqueConstraint(
                fields=["name", "queue_name", "task_path", "le"], name="stalwart_counter_key"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name}{{{self.queue_name},{self.task_path},{self.le}}} = {self.value}"
