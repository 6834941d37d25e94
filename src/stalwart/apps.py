from django.apps import AppConfig


class StalwartConfig(AppConfig):
    name = "stalwart"
    label = "stalwart"
    verbose_name = "Stalwart task queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.core import checks

        from stalwart import log
        from stalwart.checks import check_collation, check_settings
        from stalwart.db import sqlite_defaults
        from stalwart.processes import forking  # noqa: F401 - its at-fork hook, registered early

        log.install()
        sqlite_defaults.install()
        checks.register(check_settings)
        checks.register(check_collation, checks.Tags.database)
