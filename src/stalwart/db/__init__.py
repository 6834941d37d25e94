"""Per-database SQL for the hot paths, chosen by the connection's vendor."""

import weakref

from django.db.backends.base.base import BaseDatabaseWrapper

from stalwart.db.base import ClaimedJob, Death, NewJob, Outcome, Released, Statements
from stalwart.exceptions import ConfigurationError

__all__ = ["ClaimedJob", "Death", "NewJob", "Outcome", "Released", "Statements", "statements_for"]

_statements: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _statement_classes() -> dict[str, type[Statements]]:
    from stalwart.db.postgresql import PostgreSQLStatements
    from stalwart.db.sqlite import SQLiteStatements

    return {"postgresql": PostgreSQLStatements, "sqlite": SQLiteStatements}


def statements_for(connection: BaseDatabaseWrapper) -> Statements:
    """The statements for this connection's database."""
    statements = _statements.get(connection)
    if statements is None:
        classes = _statement_classes()
        if connection.vendor not in classes:
            raise ConfigurationError(
                f"Stalwart does not support the {connection.vendor!r} database of "
                f"DATABASES[{connection.alias!r}]; use PostgreSQL or SQLite."
            )
        statements = _statements[connection] = classes[connection.vendor](connection)
    return statements
