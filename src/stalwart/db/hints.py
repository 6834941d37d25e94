"""What to tell a person about a database error: what the database said, in one line, where
Stalwart tried, and what to do about it.

The driver's message alone misleads: a database that does not exist and a table that does
not exist both say "does not exist", and a refused connection may not say which settings
led there. So errors are sorted here, once, by what they mean for the person reading.
"""

import contextlib
import sqlite3
from collections.abc import Iterator
from typing import Any

from django.db import DatabaseError, connections

MISSING_DATABASE = "missing database"
CREDENTIALS = "credentials"
UNREACHABLE = "unreachable"
MISSING_TABLES = "missing tables"

_PG_CONNECT_FAILURES = (
    "connection refused",
    "could not connect",
    "connection failed",
    "could not translate host name",
    "name or service not known",
    "timeout expired",
    "no such file or directory",
    "network is unreachable",
    "no route to host",
)


# MySQL/MariaDB error numbers: unknown database, access denied, no such table, and the
# client's "can't connect" (socket, TCP, unknown host).
_MYSQL_MEANINGS = {
    1049: MISSING_DATABASE,
    1044: CREDENTIALS,
    1045: CREDENTIALS,
    1146: MISSING_TABLES,
    2002: UNREACHABLE,
    2003: UNREACHABLE,
    2005: UNREACHABLE,
}


def _mysql_meaning(number: object, text: str) -> str | None:
    """MySQL/MariaDB: the server's error number says what it means."""
    meaning = _MYSQL_MEANINGS.get(number)  # type: ignore[call-overload]
    return None if meaning == MISSING_TABLES and "stalwart_" not in text else meaning


def one_line(error: BaseException) -> str:
    """The error's text on one line (psycopg's have several)."""
    return " ".join(str(error).split())


def classify(error: BaseException) -> str | None:  # noqa: PLR0911 - one return a meaning
    """What a database error means for a person: one of the constants above, or None."""
    cause = error.__cause__ or error
    text = str(cause).lower()
    state = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    if type(cause).__module__.partition(".")[0] == "MySQLdb" and cause.args:
        return _mysql_meaning(cause.args[0], text)
    if state == "3D000" or ("database" in text and "does not exist" in text and "fatal" in text):
        return MISSING_DATABASE
    if state in ("28P01", "28000") or any(
        phrase in text
        for phrase in ("password authentication failed", "no pg_hba.conf entry", 'role "')
    ):
        return CREDENTIALS
    if (
        state == "42P01"
        or "no such table: stalwart_" in text
        or ('relation "stalwart_' in text and "does not exist" in text)
    ):
        return MISSING_TABLES
    if isinstance(cause, sqlite3.OperationalError) and "unable to open database file" in text:
        return UNREACHABLE
    if not isinstance(cause, sqlite3.Error) and any(p in text for p in _PG_CONNECT_FAILURES):
        return UNREACHABLE
    return None


def is_misconfigured(error: BaseException) -> bool:
    """Errors no retry can cure: the settings point at a database, or with credentials, the
    server does not know."""
    return classify(error) in (MISSING_DATABASE, CREDENTIALS)


def where(alias: str) -> str:
    """Where ``DATABASES[alias]`` points: ``PostgreSQL at db.internal:5432, database 'shop'``."""
    settings_dict: dict[str, Any] = connections[alias].settings_dict
    name = settings_dict.get("NAME")
    if connections[alias].vendor == "sqlite":
        return f"the SQLite file {str(name)!r}"
    host = settings_dict.get("HOST") or "the local socket"
    if connections[alias].vendor == "mysql":
        # (display_name asks the server whether it is MariaDB: it may be out of reach.)
        port = settings_dict.get("PORT") or "3306"
        return f"MySQL/MariaDB at {host}:{port}, database {name!r}"
    port = settings_dict.get("PORT") or "5432"
    return f"{connections[alias].display_name} at {host}:{port}, database {name!r}"


def create_command(alias: str, database: object) -> str:
    if connections[alias].vendor == "mysql":
        return f"CREATE DATABASE {database} CHARACTER SET utf8mb4"
    return f"createdb {database}"


def migrate_command(alias: str) -> str:
    return "python manage.py migrate" + ("" if alias == "default" else f" --database {alias}")


def advice(error: BaseException, alias: str) -> str | None:
    """What a person should do about a database error, naming where Stalwart tried, or
    None for an error that needs no more than its own text."""
    kind = classify(error)
    name = f"DATABASES[{alias!r}]"
    if kind == MISSING_DATABASE:
        database = connections[alias].settings_dict.get("NAME")
        return (
            f"{name} names the database {database!r}, which does not exist on the server "
            f"({where(alias)}). Create it ({create_command(alias, database)}), then run "
            f"'{migrate_command(alias)}'."
        )
    if kind == CREDENTIALS:
        user = connections[alias].settings_dict.get("USER")
        return (
            f"The server refused {name}'s credentials (USER {user!r}, {where(alias)}): "
            "check USER and PASSWORD."
        )
    if kind == UNREACHABLE:
        return (
            f"Cannot connect to {name}, {where(alias)}: is the database server running "
            "there, and do its settings point at it?"
        )
    if kind == MISSING_TABLES:
        return (
            f"Stalwart's tables are missing from {name} ({where(alias)}): run "
            f"'{migrate_command(alias)}'."
        )
    return None


def explain(error: BaseException, alias: str) -> str:
    """One line: what to do (if there is more to say) and what the database said."""
    said = one_line(error)
    hint = advice(error, alias)
    if hint is None:
        return f"DATABASES[{alias!r}] ({where(alias)}) said: {said}"
    return f"{hint} The database said: {said}"


@contextlib.contextmanager
def noted(alias: str) -> Iterator[None]:
    """Add the advice, if any, to a database error raised within (as a note: the error
    itself is unchanged, for code that catches it)."""
    try:
        yield
    except DatabaseError as error:
        try:
            hint = advice(error, alias)
        except Exception:  # noqa: BLE001 - the error matters more than its note
            hint = None
        if hint is not None:
            error.add_note(hint)
        raise
