"""``queue check``: is everything in place to run, without starting anything?

Each problem is one sentence naming what is wrong and where: the setting, the database, the
migration, the recurring entry.
"""

from typing import TYPE_CHECKING, Any, cast

from django.conf import settings
from django.core import checks
from django.db import DatabaseError, connections
from django.db.migrations.executor import MigrationExecutor

from stalwart import catalog
from stalwart.db.hints import explain, migrate_command

if TYPE_CHECKING:
    from django.db.backends.mysql.base import DatabaseWrapper as MySQLWrapper
    from django.db.backends.postgresql.base import DatabaseWrapper as PostgreSQLWrapper

MIN_POSTGRESQL = (12, 0)  # MATERIALIZED common table expressions
MIN_SQLITE = (3, 35, 0)  # UPDATE ... RETURNING
MIN_MYSQL = (8, 0)  # FOR UPDATE SKIP LOCKED
MIN_MARIADB = (10, 6)  # FOR UPDATE SKIP LOCKED


def server_version(alias: str) -> str:
    """The database server and its version, as ``queue check`` reports it."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        major, minor = divmod(cast("PostgreSQLWrapper", connection).pg_version, 10000)
        return f"PostgreSQL {major}.{minor}"
    if connection.vendor == "mysql":
        mysql = cast("MySQLWrapper", connection)
        name = "MariaDB" if mysql.mysql_is_mariadb else "MySQL"
        return f"{name} {'.'.join(map(str, mysql.mysql_version))}"
    if connection.vendor == "sqlite":
        import sqlite3

        return f"SQLite {sqlite3.sqlite_version}"
    return connection.display_name


def database_problems(alias: str) -> list[str]:
    """Can we reach the database, is it a version we support, are our tables migrated?"""
    connection = connections[alias]
    where = f"DATABASES[{alias!r}]"
    try:
        connection.ensure_connection()
    except DatabaseError as error:
        return [explain(error, alias)]
    problems = []
    if connection.vendor == "postgresql":
        version = divmod(cast("PostgreSQLWrapper", connection).pg_version, 10000)
        if version < MIN_POSTGRESQL:
            problems.append(
                f"{where} is PostgreSQL {version[0]}; Stalwart needs 12 or newer "
                "(for FOR UPDATE SKIP LOCKED inside a MATERIALIZED common table expression)."
            )
    elif connection.vendor == "sqlite":
        import sqlite3

        if sqlite3.sqlite_version_info < MIN_SQLITE:
            problems.append(
                f"{where} is SQLite {sqlite3.sqlite_version}; Stalwart needs 3.35 or newer "
                "(for UPDATE ... RETURNING)."
            )
    elif connection.vendor == "mysql":
        mysql = cast("MySQLWrapper", connection)
        mariadb = mysql.mysql_is_mariadb
        needed = MIN_MARIADB if mariadb else MIN_MYSQL
        if mysql.mysql_version[:2] < needed:
            problems.append(
                f"{where} is {server_version(alias)}; Stalwart needs "
                f"{'MariaDB 10.6' if mariadb else 'MySQL 8.0'} or newer "
                "(for FOR UPDATE SKIP LOCKED)."
            )
    else:
        problems.append(
            f"{where} is {connection.vendor}; Stalwart supports PostgreSQL, MySQL, MariaDB "
            "and SQLite."
        )
        return problems
    executor = MigrationExecutor(connection)
    targets = [key for key in executor.loader.graph.leaf_nodes() if key[0] == "stalwart"]
    pending = executor.migration_plan(targets)
    if pending:
        names = ", ".join(f"{migration.app_label}.{migration.name}" for migration, _ in pending)
        problems.append(f"{where} lacks migrations: {names}. Run '{migrate_command(alias)}'.")
    return problems


def task_module_problems() -> list[str]:
    """Task modules of the project (apps' ``tasks``, recurring, ``task_modules``) that fail
    to import: workers would fail every job of their tasks."""
    loaded = catalog.load()
    if loaded is None:
        return []
    return [
        f"{where}: module {module!r} cannot be imported: {error}"
        for module, (where, error) in loaded.failed.items()
    ]


# Warnings of Django's system checks that 'queue check' counts as errors: warnings so that
# they do not stop 'migrate' and 'runserver', which run the checks first.
PROMOTED_WARNINGS = frozenset({"stalwart.W004"})


def _text(message: checks.CheckMessage) -> str:
    return f"{message.id}: {message.msg}" + (f" ({message.hint})" if message.hint else "")


def system_check_messages(databases: list[str] | None = None) -> list[checks.CheckMessage]:
    """Django's system checks (ours included), run once, silenced ones left out; with
    ``databases``, the checks that ask those databases too (Django's ``database`` tag)."""
    return [
        message
        for message in checks.run_checks(include_deployment_checks=False, databases=databases)
        if not message.is_silenced()
    ]


def system_check_problems(messages: list[checks.CheckMessage] | None = None) -> list[str]:
    """The errors among Django's system checks, and the warnings ``queue check`` promotes."""
    if messages is None:
        messages = system_check_messages()
    return [
        _text(message)
        for message in messages
        if message.is_serious() or message.id in PROMOTED_WARNINGS
    ]


def system_check_warnings(messages: list[checks.CheckMessage] | None = None) -> list[str]:
    """The other warnings (each problem is reported once: as an error, or as a warning)."""
    if messages is None:
        messages = system_check_messages()
    return [
        _text(message)
        for message in messages
        if not message.is_serious() and message.id not in PROMOTED_WARNINGS
    ]


def all_problems(backend: Any, messages: list[checks.CheckMessage] | None = None) -> list[str]:
    """Django's system checks (ours included: recurring entries among them), task modules,
    then the database."""
    problems = system_check_problems(messages) + task_module_problems()
    if backend.config.database in settings.DATABASES:
        problems += database_problems(backend.config.database)
    return problems
