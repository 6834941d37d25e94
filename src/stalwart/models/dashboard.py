"""The dashboard's place in the Django admin: a model with no table, holding permissions."""

from django.db import models

# Each action of the dashboard (and of nothing else) needs its own permission.
PERMISSIONS: list[tuple[str, str]] = [
    ("view_dashboard", "Can view the Stalwart dashboard"),
    ("retry_job", "Can retry failed jobs"),
    ("discard_job", "Can discard failed jobs"),
    ("cancel_job", "Can cancel jobs"),
    ("run_job_now", "Can run scheduled jobs now"),
    ("pause_queue", "Can pause and resume queues"),
    ("enqueue_recurring", "Can enqueue a recurring task now"),
]


class Dashboard(models.Model):
    """Never queried, never created (``managed = False``): it gives the dashboard an entry
    on the admin's index page and an owner for its permissions."""

    class Meta:
        managed = False
        db_table = "stalwart_dashboard"
        default_permissions = ()
        # A list of Meta's own type (django-stubs: names may be lazy strings), equal to
        # PERMISSIONS, as the migrations recorded it.
        permissions = [(codename, name) for codename, name in PERMISSIONS]
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"

    def __str__(self) -> str:
        return "Stalwart dashboard"
