from importlib.util import find_spec
from typing import Any

from django.apps import AppConfig
from django.conf import settings

# Each database's driver and the extra that brings it: (ENGINE's ending, modules, extra).
DRIVERS = (
    (".mysql", ("MySQLdb",), "mysql", "mysqlclient"),
    (".postgresql", ("psycopg", "psycopg2"), "postgresql", "psycopg"),
    (".postgis", ("psycopg", "psycopg2"), "postgresql", "psycopg"),
)


def missing_driver() -> str | None:
    """One line naming the extra to install, if a database's driver is not installed."""
    for alias, entry in settings.DATABASES.items():
        engine = str(entry.get("ENGINE", ""))
        for ending, modules, extra, driver in DRIVERS:
            if engine.endswith(ending) and all(find_spec(module) is None for module in modules):
                return (
                    f"DATABASES[{alias!r}] uses {engine}, whose driver ({driver}) is not "
                    f'installed: pip install "django-stalwart[{extra}]"'
                )
    return None


class StalwartConfig(AppConfig):
    name = "stalwart"
    label = "stalwart"
    verbose_name = "Stalwart task queue"
    default_auto_field = "django.db.models.BigAutoField"

    def __init__(self, app_name: str, app_module: Any) -> None:
        super().__init__(app_name, app_module)
        # Now, before any app's models are imported: that is where Django would load the
        # missing driver and end in a traceback. One line instead, naming the extra.
        problem = missing_driver()
        if problem is not None:
            raise SystemExit(f"error: {problem}")

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
