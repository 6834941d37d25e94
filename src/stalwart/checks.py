"""System checks for Stalwart backends (run by ``manage.py check`` and ``queue check``)."""

from typing import Any

from django.conf import settings
from django.core import checks

SUPPORTED_VENDORS = ("postgresql", "sqlite")


def check_backend(backend: Any, **kwargs: Any) -> list[checks.CheckMessage]:
    """Problems with one Stalwart backend's configuration, each naming its setting."""
    messages: list[checks.CheckMessage] = []
    config = backend.config
    where = f"TASKS[{backend.alias!r}]['OPTIONS']['database']"
    if config.database not in settings.DATABASES:
        messages.append(
            checks.Error(
                f"{where} is {config.database!r}, which is not in DATABASES.",
                id="stalwart.E001",
            )
        )
        return messages
    from django.db import connections

    connection = connections[config.database]
    if connection.vendor not in SUPPORTED_VENDORS:
        messages.append(
            checks.Error(
                f"DATABASES[{config.database!r}] uses {connection.vendor!r}; Stalwart supports "
                f"{', '.join(SUPPORTED_VENDORS)}.",
                id="stalwart.E002",
            )
        )
    if connection.vendor == "sqlite":
        options = connection.settings_dict.get("OPTIONS", {})
        if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
            messages.append(
                checks.Warning(
                    f"DATABASES[{config.database!r}] is SQLite without "
                    "OPTIONS['transaction_mode'] = 'IMMEDIATE'.",
                    hint="Transactions that read before they enqueue can fail with 'database "
                    "is locked' while workers write; IMMEDIATE takes the write lock up front.",
                    id="stalwart.W001",
                )
            )
    messages.extend(check_recurring(backend))
    return messages


def check_recurring(backend: Any) -> list[checks.CheckMessage]:
    from stalwart.diagnostics import recurring_problems

    # A warning, not an error: the scheduler skips a broken entry and carries on, and an error
    # here would stop 'migrate' and 'runserver' too. 'queue check' fails on it.
    return [checks.Warning(problem, id="stalwart.W004") for problem in recurring_problems(backend)]
