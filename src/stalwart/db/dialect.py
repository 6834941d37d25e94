"""How each database takes parameters, tells the time and locks rows: what every concern's
statements build on.

``Dialect`` is the root of every concern's mixin (``claims``, ``slots``, ``control``…): it
binds the statements to one connection and says, for the database at hand, how a UUID or a
datetime goes as a parameter, what "now" is in SQL, and how a statement locks the rows it
reads. Each database's differences follow, one class each: PostgreSQL, MySQL, SQLite.
"""

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from django.db import transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.utils import timezone

from stalwart.models import Job


def marks(values: Sequence) -> str:
    """One ``%s`` per value, comma-separated: the inside of ``IN (…)``."""
    return ", ".join(["%s"] * len(values))


class Dialect:
    """Statements bound to one connection: parameters, the clock, row locks.

    An instance is bound to one connection (one thread's) and cheap to make: take one from
    ``statements_for(connection)`` when needed rather than keeping it.
    """

    vendor: ClassVar[str]

    def __init__(self, connection: BaseDatabaseWrapper) -> None:
        self.connection = connection

    def uuid_param(self, value: uuid.UUID) -> Any:
        return Job._meta.pk.get_db_prep_value(value, self.connection)

    def datetime_param(self, value: datetime | None) -> Any:
        if value is None:
            return None
        return self.connection.ops.adapt_datetimefield_value(value)

    def now_param(self) -> Any:
        return self.datetime_param(timezone.now())

    def now_sql(self) -> tuple[str, list]:
        """SQL for the database clock's "now", and its parameters: only the database's clock
        decides when a job is due, a retry may run or a row is old (where the database has
        a clock to offer; SQLite lives on one host, whose clock it uses)."""
        return "%s", [self.now_param()]

    def ago_sql(self) -> str:
        """SQL for "the database clock minus %s seconds"."""
        raise NotImplementedError

    def ago_params(self, seconds: float) -> list:
        return [seconds]

    def database_now(self, cursor: Any) -> datetime:
        """The database clock (the host clock where the database has none to offer)."""
        return timezone.now()

    # Locks rows as a statement reads them (after ORDER BY id: so in id order), or nothing
    # where the database has one writer at a time anyway.
    row_lock: ClassVar[str] = ""

    def take_write_lock(self, cursor: Any) -> None:
        """Make the transaction a writer before it reads (SQLite: no read-then-upgrade)."""

    def wait_briefly_for_locks(self, cursor: Any) -> None:
        """For the rest of this transaction, give up on a lock after a moment (where the
        database can): for writes that may wait on an application's transaction."""

    def without_jit(self, cursor: Any) -> None:
        """For the rest of this transaction, run queries without compiling them (where the
        database would): a bulk statement over thousands of rows is priced high enough to
        be compiled, which costs more than running it."""

    def error_count_sql(self, column: str) -> str:
        """SQL for the length of the JSON array in ``column`` (a job's failed attempts)."""
        raise NotImplementedError

    # Helpers for steps of several statements (MySQL's concerns write most of theirs so).

    def _atomic(self) -> Any:
        """One transaction for a step of several statements (joins the caller's, if any)."""
        return transaction.atomic(using=self.connection.alias, savepoint=False)

    def _ids(self, rows: Sequence) -> list:
        """The job ids in the first column of ``rows``, as parameters."""
        return [self.uuid_param(self._uuid(row[0])) for row in rows]

    def _uuid(self, value: Any) -> uuid.UUID:
        """A job id read from a cursor (a UUID, or its text where the driver gives text)."""
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


class PostgreSQLDialect(Dialect):
    """The database's clock (``now()``) in every statement; locks that give up early."""

    # psycopg takes UUIDs and aware datetimes as they are: no adaptation per value.
    def uuid_param(self, value: Any) -> Any:
        return value

    def datetime_param(self, value: Any) -> Any:
        return value

    def now_sql(self) -> tuple[str, list]:
        return "now()", []

    def ago_sql(self) -> str:
        return "now() - make_interval(secs => %s)"

    def database_now(self, cursor: Any) -> Any:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]

    row_lock = "FOR UPDATE"

    def wait_briefly_for_locks(self, cursor: Any) -> None:
        cursor.execute("SET LOCAL lock_timeout = '50ms'")

    def without_jit(self, cursor: Any) -> None:
        cursor.execute("SET LOCAL jit = off")  # this transaction only (PgBouncer-safe)

    def error_count_sql(self, column: str) -> str:
        return f"jsonb_array_length({column})"


# MySQL's clock: UTC whatever the session's time zone (Django stores UTC in ``DATETIME(6)``
# columns when ``USE_TZ`` is on).
MYSQL_NOW = "UTC_TIMESTAMP(6)"
# The error a unique index raises on a duplicate: an answer (a twin, a lease taken), not a
# failure, where it is caught inside a savepoint.
MYSQL_DUPLICATE_KEY = 1062
# The session's innodb_lock_wait_timeout while a brief one is in force, kept on Django's
# connection object (an attribute of Stalwart's own on it).
_SAVED_LOCK_WAIT = "stalwart_lock_wait_timeout"


class MySQLDialect(Dialect):
    """The database's clock (``UTC_TIMESTAMP(6)``); steps of several statements, each one
    short transaction (``_atomic``); no ``SET LOCAL``."""

    def now_sql(self) -> tuple[str, list]:
        return MYSQL_NOW, []

    def ago_sql(self) -> str:
        return f"{MYSQL_NOW} - INTERVAL %s MICROSECOND"

    def ago_params(self, seconds: float) -> list:
        return [round(seconds * 1_000_000)]

    def database_now(self, cursor: Any) -> Any:
        cursor.execute(f"SELECT {MYSQL_NOW}")
        return cursor.fetchone()[0].replace(tzinfo=UTC)

    def error_count_sql(self, column: str) -> str:
        return f"JSON_LENGTH({column})"

    row_lock = "FOR UPDATE"

    def wait_briefly_for_locks(self, cursor: Any) -> None:
        # InnoDB counts lock waits in whole seconds, and has no SET LOCAL: the session's
        # value is kept on the connection, and put back after the finish that follows.
        if getattr(self.connection, _SAVED_LOCK_WAIT, None) is None:
            cursor.execute("SELECT @@SESSION.innodb_lock_wait_timeout")
            setattr(self.connection, _SAVED_LOCK_WAIT, cursor.fetchone()[0])
        cursor.execute("SET SESSION innodb_lock_wait_timeout = 1")

    def _restore_lock_wait(self, cursor: Any) -> None:
        previous = getattr(self.connection, _SAVED_LOCK_WAIT, None)
        # In a transaction an error has doomed, nothing more can run: the next finish on
        # this connection puts it back (until then, its lock waits are brief).
        if previous is None or self.connection.needs_rollback:
            return
        setattr(self.connection, _SAVED_LOCK_WAIT, None)
        cursor.execute("SET SESSION innodb_lock_wait_timeout = %s", [previous])


class SQLiteDialect(Dialect):
    """One writer at a time, on one host: the host clock, and the write lock up front."""

    def error_count_sql(self, column: str) -> str:
        return f"json_array_length({column})"

    def ago_sql(self) -> str:
        return "%s"

    def ago_params(self, seconds: float) -> list:
        return [self.datetime_param(timezone.now() - timedelta(seconds=seconds))]

    def take_write_lock(self, cursor: Any) -> None:
        # A write that changes nothing still begins a write transaction: the lock is ours
        # before anything is read, so a later write never has to upgrade a stale read.
        cursor.execute("UPDATE stalwart_lease SET name = name WHERE 0")
