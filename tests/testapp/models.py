"""A side table the test tasks write to: one row per execution of a job."""

from django.db import models


class Execution(models.Model):
    job_id = models.CharField(max_length=36, db_index=True)
    label = models.CharField(max_length=64, default="")
    attempt = models.IntegerField(default=0)
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True)

    class Meta:
        app_label = "testapp"

    def __str__(self) -> str:
        return f"{self.label or 'execution'} of {self.job_id} (attempt {self.attempt})"
