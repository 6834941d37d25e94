"""Which database errors are worth retrying, decided once, at the boundary.

Transient: serialization failures, deadlocks, lock and statement timeouts, a lost or refused
connection, SQLite's "database is locked". Everything else propagates as it is.

MySQL and MariaDB (mysqlclient) give no SQLSTATE on their exceptions, only the server's
error number (``args[0]``): those numbers are classified here beside the SQLSTATEs.
"""

import sqlite3

from django.db import DatabaseError, DataError, IntegrityError, InterfaceError

from stalwart.db.hints import is_misconfigured

# SQLSTATE classes and codes (PostgreSQL, and MySQL where it reports them).
_TRANSIENT_SQLSTATE_PREFIXES = ("08", "40", "57P")
_TRANSIENT_SQLSTATES = {"55P03", "57014", "53300"}
# MySQL/MariaDB error numbers: deadlock (1213), lock wait timeout (1205), too many
# connections (1040), statement timeouts (MariaDB's max_statement_time 1969, MySQL's
# max_execution_time 3024), and the client's lost or refused connections.
_MYSQL_LOCK_WAIT = 1205
_MYSQL_CONNECTION_LOST = {2002, 2003, 2006, 2013, 2055, 4031}
_MYSQL_TRANSIENT = {1205, 1213, 1040, 1969, 3024} | _MYSQL_CONNECTION_LOST
_MYSQL_DUPLICATE_KEY = 1062
_SQLITE_TRANSIENT = ("database is locked", "database table is locked", "database is busy")


def _sqlstate(error: BaseException) -> str | None:
    return getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)


def mysql_errno(error: BaseException) -> int | None:
    """The MySQL/MariaDB server's error number behind ``error`` (None for other drivers)."""
    cause = error.__cause__ or error
    if type(cause).__module__.partition(".")[0] != "MySQLdb":
        return None
    number = cause.args[0] if cause.args else None
    return number if isinstance(number, int) else None


def is_transient(error: BaseException) -> bool:
    """Whether retrying the whole transaction may succeed (not for a database or a role the
    server does not know: the settings are wrong, and retrying only delays saying so)."""
    if isinstance(error, InterfaceError):
        return True  # the connection is closed or broken: a new one may work
    if not isinstance(error, DatabaseError) or is_misconfigured(error):
        return False
    cause = error.__cause__ or error
    if isinstance(cause, sqlite3.OperationalError):
        return any(text in str(cause).lower() for text in _SQLITE_TRANSIENT)
    number = mysql_errno(error)
    if number is not None:
        return number in _MYSQL_TRANSIENT
    state = _sqlstate(cause)
    if state:
        return state in _TRANSIENT_SQLSTATES or state.startswith(_TRANSIENT_SQLSTATE_PREFIXES)
    # psycopg raises OperationalError (or a subclass: ConnectionTimeout) without a SQLSTATE
    # when the connection is lost or cannot be made.
    return any(
        kind.__name__ == "OperationalError" and kind.__module__.partition(".")[0] == "psycopg"
        for kind in type(cause).__mro__
    )


def is_connection_lost(error: BaseException) -> bool:
    """The connection is gone, or cannot be made (as opposed to a statement that failed on
    a working connection: a deadlock, a lock timeout)."""
    if isinstance(error, InterfaceError):
        return True
    if not isinstance(error, DatabaseError):
        return False
    cause = error.__cause__ or error
    number = mysql_errno(error)
    if number is not None:
        return number in _MYSQL_CONNECTION_LOST
    state = _sqlstate(cause)
    if state:
        return state.startswith("08") or state in ("57P01", "57P02", "57P03")
    return not isinstance(cause, sqlite3.Error) and is_transient(error)


def is_unique_conflict(error: BaseException) -> bool:
    """A unique index refused a write (a racing twin): worth one more try, which will see it."""
    if not isinstance(error, IntegrityError):
        return False
    cause = error.__cause__ or error
    return (
        _sqlstate(cause) == "23505"
        or mysql_errno(error) == _MYSQL_DUPLICATE_KEY
        or "UNIQUE constraint failed" in str(cause)
    )


# SQLSTATE classes of errors about the data a statement carries, not about the database:
# data exceptions, integrity violations, program limits (a row or index entry too large).
_DATA_SQLSTATE_CLASSES = ("22", "23", "54")


def refuses_the_data(error: BaseException) -> bool:
    """The database refused what a statement carried (a value too long, a constraint), as
    opposed to being unable to run it at all (gone, full, read-only, missing a table)."""
    if isinstance(error, DataError | IntegrityError):
        return True
    state = _sqlstate(error.__cause__ or error)
    return state is not None and state[:2] in _DATA_SQLSTATE_CLASSES


def is_lock_wait(error: BaseException) -> bool:
    """A lock (or another transaction's uncommitted row) was waited on too long."""
    return _sqlstate(error.__cause__ or error) == "55P03" or mysql_errno(error) == _MYSQL_LOCK_WAIT
