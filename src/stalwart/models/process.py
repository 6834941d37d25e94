"""The process table: one row per live supervisor, worker, dispatcher or scheduler."""

from django.db import models


class Process(models.Model):
    """A registered process. Heartbeats use the database clock."""

    class Kind(models.TextChoices):
        SUPERVISOR = "supervisor", "Supervisor"
        WORKER = "worker", "Worker"
        DISPATCHER = "dispatcher", "Dispatcher"
        SCHEDULER = "scheduler", "Scheduler"

    id = models.BigAutoField(primary_key=True)
    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=128, unique=True)
    pid = models.IntegerField()
    hostname = models.CharField(max_length=255)
    supervisor = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    last_heartbeat_at = models.DateTimeField()
    metadata = models.JSONField(default=dict)

    class Meta:
        db_table = "stalwart_process"
        indexes = [
            models.Index(fields=["last_heartbeat_at"], name="stalwart_process_heartbeat"),
            models.Index(fields=["supervisor"], name="stalwart_process_supervisor"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} (pid {self.pid} on {self.hostname})"
