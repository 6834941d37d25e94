"""Every statement on the queue's tables, chosen by the connection's vendor.

A module per concern (``claims``, ``slots``, ``uniqueness``, ``leases``, ``control``…) holds
what every database writes and, beside it, each database's differences; ``postgresql``,
``mysql`` and ``sqlite`` each list one database's (see docs/explanation/database-layer.md).
"""

import functools

from django.db.backends.base.base import BaseDatabaseWrapper

from stalwart.db.rows import ClaimedJob, Death, Interruption, NewJob, Outcome, Released
from stalwart.db.statements import Statements
from stalwart.exceptions import ConfigurationError

__all__ = [
    "ClaimedJob",
    "Death",
    "Interruption",
    "NewJob",
    "Outcome",
    "Released",
    "Statements",
    "statements_for",
]


@functools.cache
def _statement_classes() -> dict[str, type[Statements]]:
    from stalwart.db.mysql import MySQLStatements
    from stalwart.db.postgresql import PostgreSQLStatements
    from stalwart.db.sqlite import SQLiteStatements

    return {
        "mysql": MySQLStatements,
        "postgresql": PostgreSQLStatements,
        "sqlite": SQLiteStatements,
    }


def statements_for(connection: BaseDatabaseWrapper) -> Statements:
    """The statements for this connection's database, bound to this very connection.

    Nothing here keeps the connection: a thread's connection object must be free to go with
    its thread (what the statements cache is cached per database alias).
    """
    statements = _statement_classes().get(connection.vendor)
    if statements is None:
        raise ConfigurationError(
            f"Stalwart does not support the {connection.vendor!r} database of "
            f"DATABASES[{connection.alias!r}]; use PostgreSQL, MySQL, MariaDB or SQLite."
        )
    return statements(connection)
