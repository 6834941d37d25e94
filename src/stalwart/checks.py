"""System checks for Stalwart backends (run by ``manage.py check`` and ``queue check``).

The backend's own ``check()`` runs them, through Django's tasks check: so they run even
when Stalwart's app is not installed (and say so, ``stalwart.E004``), wherever the project's
tasks are imported.
"""

import difflib
import re
from typing import Any

from django.conf import settings
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from stalwart.aliases import stalwart_aliases, stalwart_backends
from stalwart.binding import recurring_problems

SUPPORTED_VENDORS = ("postgresql", "sqlite", "mysql")

# Why USE_TZ = False is refused, for the system check and for the commands that run processes.
USE_TZ_REQUIRED = (
    "Stalwart needs USE_TZ = True: heartbeats, due times and retries are compared with the "
    "database clock in UTC, and naive local times would prune live processes as dead and "
    "crash the scheduler."
)
USE_TZ_HINT = "Set USE_TZ = True in your settings (Django's default)."


APP_NOT_INSTALLED = (
    "'stalwart' is not in INSTALLED_APPS, and a TASKS entry uses Stalwart's backend: its "
    "tables, its 'queue' command and its processes come with its app."
)
APP_HINT = "Add \"stalwart\" to INSTALLED_APPS, then run 'python manage.py migrate'."

# The keys Django's task backends read in a TASKS entry.
TASKS_KEYS = ("BACKEND", "QUEUES", "OPTIONS")


def app_installed() -> bool:
    from django.apps import apps

    return apps.is_installed("stalwart")


def require_app() -> None:
    """Raise ``ImproperlyConfigured`` naming the fix unless Stalwart's app is installed."""
    if not app_installed():
        raise ImproperlyConfigured(f"{APP_NOT_INSTALLED} {APP_HINT}")


def check_tasks_keys(alias: str) -> list[checks.CheckMessage]:
    """Keys of ``TASKS[alias]`` that look like typos of the ones Django reads: as written,
    they are ignored, and the backend runs without what they say."""
    messages: list[checks.CheckMessage] = []
    for key in getattr(settings, "TASKS", {}).get(alias, {}):
        if key in TASKS_KEYS or not isinstance(key, str):
            continue
        close = difflib.get_close_matches(key.upper(), TASKS_KEYS, n=1, cutoff=0.6)
        if close:
            messages.append(
                checks.Error(
                    f"TASKS[{alias!r}][{key!r}] is not a setting of a task backend, so it is "
                    "ignored.",
                    hint=f"Did you mean {close[0]!r}? A TASKS entry takes "
                    f"{', '.join(repr(known) for known in TASKS_KEYS)}.",
                    id="stalwart.E005",
                )
            )
    return messages


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Project-wide settings Stalwart cannot run with (reported once, not per backend)."""
    if settings.USE_TZ or not uses_stalwart():
        return []
    return [checks.Error(USE_TZ_REQUIRED, hint=USE_TZ_HINT, id="stalwart.E003")]


def uses_stalwart() -> bool:
    """Whether some TASKS entry is a Stalwart backend (entries that fail to load are not)."""
    return bool(stalwart_aliases())


def check_backend(backend: Any, **kwargs: Any) -> list[checks.CheckMessage]:
    """Problems with one Stalwart backend's configuration, each naming its setting."""
    messages: list[checks.CheckMessage] = check_tasks_keys(backend.alias)
    config = backend.config
    messages.extend(
        checks.Error(
            error,
            hint="Fix the entry, or remove it. The scheduler ('queue supervise') will not "
            "start until then; the rest of the site works without it.",
            id="stalwart.E006",
        )
        for error in config.recurring_errors
    )
    if not app_installed():
        # Reported once, by the first Stalwart backend; without the app, nothing else can
        # be checked (the models are not there).
        if stalwart_aliases()[:1] == [backend.alias]:
            messages.append(checks.Error(APP_NOT_INSTALLED, hint=APP_HINT, id="stalwart.E004"))
        return messages
    where = f"TASKS[{backend.alias!r}]['OPTIONS']['database']"
    if config.database not in settings.DATABASES:
        messages.append(
            checks.Error(
                f"{where} is {config.database!r}, which is not in DATABASES.",
                id="stalwart.E001",
            )
        )
        return messages
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
        # Without the option, Stalwart makes it IMMEDIATE (stalwart.db.sqlite_defaults).
        mode = (connection.settings_dict.get("OPTIONS") or {}).get("transaction_mode")
        if mode is not None and str(mode).upper() != "IMMEDIATE":
            messages.append(
                checks.Warning(
                    f"DATABASES[{config.database!r}] is SQLite with "
                    f"OPTIONS['transaction_mode'] = {mode!r}, not 'IMMEDIATE'.",
                    hint="Transactions that read before they enqueue can fail with 'database "
                    "is locked' while workers write; IMMEDIATE takes the write lock up front. "
                    "Remove the option to have Stalwart set it.",
                    id="stalwart.W001",
                )
            )
    messages.extend(check_isolation(config.database, connection))
    messages.extend(check_pool(backend, connection))
    messages.extend(check_pooler(backend, connection))
    messages.extend(check_recurring(backend))
    return messages


def check_isolation(alias: str, connection: Any) -> list[checks.CheckMessage]:
    """MySQL/MariaDB at an isolation level other than READ COMMITTED (Django's default)."""
    if connection.vendor != "mysql":
        return []
    level = (connection.settings_dict.get("OPTIONS") or {}).get("isolation_level")
    if level is None or str(level).lower() == "read committed":
        return []
    return [
        checks.Warning(
            f"DATABASES[{alias!r}] is MySQL/MariaDB with OPTIONS['isolation_level'] = "
            f"{level!r}, not 'read committed'.",
            hint="Above READ COMMITTED, InnoDB's locking reads also lock the gaps between "
            "index entries: claims and enqueues wait on each other, and deadlock more. "
            "Remove the option (Django's default is 'read committed').",
            id="stalwart.W006",
        )
    ]


# A MySQL/MariaDB collation that ignores case (_ci) or accents (_ai): utf8mb4_general_ci
# (MariaDB's default), utf8mb4_0900_ai_ci (MySQL 8's), utf8mb4_uca1400_ai_ci (MariaDB 11's).
_LOOSE_COLLATION = re.compile(r"_(ci|ai)(_|$)", re.IGNORECASE)


def table_collations(connection: Any) -> list[str]:
    """The collations of the text columns of Stalwart's tables on a MySQL/MariaDB connection;
    before ``migrate`` has made them, the database's default (which they will get)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT collation_name FROM information_schema.columns "
            "WHERE table_schema = DATABASE() AND table_name LIKE %s "
            "AND collation_name IS NOT NULL",
            ["stalwart\\_%"],
        )
        found = sorted(row[0] for row in cursor.fetchall())
        if not found:
            cursor.execute("SELECT @@collation_database")
            found = [cursor.fetchone()[0]]
    return found


def check_collation(
    app_configs: Any = None, databases: Any = None, **kwargs: Any
) -> list[checks.CheckMessage]:
    """MySQL/MariaDB queue databases whose collation ignores case or accents. It asks the
    server, so it is a database check: Django runs it for the databases it is given
    (``check --database ALIAS``, ``migrate``; ``queue check`` gives the queue's)."""
    messages: list[checks.CheckMessage] = []
    seen: set[str] = set()
    for backend in stalwart_backends():
        alias = backend.config.database
        if alias in seen or alias not in (databases or ()) or alias not in settings.DATABASES:
            continue
        seen.add(alias)
        connection = connections[alias]
        if connection.vendor != "mysql":
            continue
        loose = [name for name in table_collations(connection) if _LOOSE_COLLATION.search(name)]
        if not loose:
            continue
        name = settings.DATABASES[alias].get("NAME") or "your_database"
        messages.append(
            checks.Warning(
                f"DATABASES[{alias!r}] compares Stalwart's text columns with the collation "
                f"{loose[0]!r}, which ignores case or accents: the queues 'Emails' and "
                "'emails' are one queue, and unique or concurrency keys that differ only in "
                "case are one key.",
                hint=f"Use utf8mb4_bin: ALTER DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE "
                "utf8mb4_bin before 'migrate' creates the tables; tables made already keep "
                "theirs: ALTER TABLE stalwart_job CONVERT TO CHARACTER SET utf8mb4 COLLATE "
                "utf8mb4_bin, and likewise each stalwart_ table. See 'Use MySQL or MariaDB' "
                "in Stalwart's documentation.",
                id="stalwart.W007",
            )
        )
    return messages


def pool_size(pool: Any) -> int:
    """The most connections Django's ``OPTIONS["pool"]`` lets one process open (psycopg_pool
    defaults: ``min_size`` 4, ``max_size`` equal to ``min_size``)."""
    if not isinstance(pool, dict):
        return 4
    minimum = pool.get("min_size", 4)
    maximum = pool.get("max_size")
    return maximum if isinstance(maximum, int) else minimum


def check_pool(backend: Any, connection: Any) -> list[checks.CheckMessage]:
    """A connection pool too small for a worker: its job threads would wait for connections.

    Only job threads take connections from the pool; the queue's own (main loop, heartbeat,
    LISTEN) bypass it (see ``stalwart.db.session``).
    """
    pool = connection.settings_dict.get("OPTIONS", {}).get("pool")
    if connection.vendor != "postgresql" or not pool:
        return []
    needed = max(worker.threads for worker in backend.config.workers)
    size = pool_size(pool)
    if size >= needed:
        return []
    return [
        checks.Warning(
            f"DATABASES[{backend.config.database!r}]['OPTIONS']['pool'] lets a process open "
            f"{size} connections; a worker of TASKS[{backend.alias!r}] has {needed} job threads, "
            "each of which may hold one.",
            hint=f"Set the pool's 'max_size' to at least {needed} (each process has its own "
            "pool), or a job thread past the limit waits for a connection, then fails its "
            "job with OperationalError: couldn't get a connection.",
            id="stalwart.W005",
        )
    ]


def check_pooler(backend: Any, connection: Any) -> list[checks.CheckMessage]:
    """Settings that cannot work behind a pooler in transaction mode (``transaction_pooler``),
    and a ``listen_database`` that would hear no notification."""
    config = backend.config
    options = f"TASKS[{backend.alias!r}]['OPTIONS']"
    messages: list[checks.CheckMessage] = []
    if config.listen_database is not None and connection.vendor == "postgresql":
        alias = config.listen_database
        if alias not in settings.DATABASES:
            return [
                checks.Error(
                    f"{options}['listen_database'] is {alias!r}, which is not in DATABASES.",
                    id="stalwart.E010",
                )
            ]
        listening = connections[alias]
        if listening.vendor != "postgresql" or (
            listening.settings_dict.get("NAME") != connection.settings_dict.get("NAME")
        ):
            messages.append(
                checks.Error(
                    f"{options}['listen_database'] is {alias!r}, which is not the database "
                    f"of DATABASES[{config.database!r}]: workers listening there would hear "
                    "no notification (NOTIFY reaches the sessions of its own database only).",
                    hint="Point it at the same PostgreSQL database, with a direct connection "
                    "(past the pooler).",
                    id="stalwart.E011",
                )
            )
        elif config.transaction_pooler and _same_server(listening, connection):
            messages.append(
                checks.Error(
                    f"{options}['listen_database'] is {alias!r}, which reaches PostgreSQL "
                    f"where DATABASES[{config.database!r}] does, through the pooler: a LISTEN "
                    "there is lost when the pooler hands the server connection to another "
                    "client, and workers would fall back to polling.",
                    hint="Give it PostgreSQL's own HOST and PORT, not the pooler's.",
                    id="stalwart.E012",
                )
            )
    if not config.transaction_pooler or connection.vendor != "postgresql":
        return messages
    database = f"DATABASES[{config.database!r}]"
    if (connection.settings_dict.get("OPTIONS") or {}).get("prepare_threshold") is not None:
        messages.append(
            checks.Warning(
                f"{database}['OPTIONS']['prepare_threshold'] is set, and {options}"
                "['transaction_pooler'] says the database is reached through a pooler in "
                "transaction mode: psycopg's server-side prepared statements live on one "
                "server connection, and the next transaction may get another ('prepared "
                "statement ... does not exist').",
                hint="Remove it (Django's default, None, prepares nothing), or make sure the "
                "pooler carries prepared statements (PgBouncer 1.21 or later with "
                "max_prepared_statements set; Debian 12's 1.18 cannot).",
                id="stalwart.W010",
            )
        )
    if not connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        messages.append(
            checks.Warning(
                f"{database}['DISABLE_SERVER_SIDE_CURSORS'] is not True, and {options}"
                "['transaction_pooler'] says the database is reached through a pooler in "
                "transaction mode: QuerySet.iterator() in your tasks would open server-side "
                "cursors, which do not survive the pooler.",
                hint=f"Set {database}['DISABLE_SERVER_SIDE_CURSORS'] = True, as Django's "
                "documentation asks for transaction pooling.",
                id="stalwart.W011",
            )
        )
    return messages


def _same_server(one: Any, other: Any) -> bool:
    return all(
        (one.settings_dict.get(key) or "") == (other.settings_dict.get(key) or "")
        for key in ("HOST", "PORT")
    )


def check_recurring(backend: Any) -> list[checks.CheckMessage]:
    # A warning, not an error: the scheduler skips a broken entry and carries on, and an error
    # here would stop 'migrate' and 'runserver' too. 'queue check' fails on it.
    return [checks.Warning(problem, id="stalwart.W004") for problem in recurring_problems(backend)]
