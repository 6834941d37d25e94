"""Raw rows of job columns, read with a plain cursor, turned into Python values as the ORM
would turn them (Django's own converters for each column, on each database)."""

import json
from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

from stalwart.models import Job

# Caches are per database alias, never per connection: each thread has its own connection
# object, and a cache entry that refers to one would keep it (and its socket) alive for ever.
_converters: dict[tuple[str, tuple[str, ...]], tuple[list[list], list]] = {}


def _detached(converter: Any, connection: BaseDatabaseWrapper) -> Any:
    """``converter``, holding no reference to ``connection``: a method of its ``ops`` is
    bound again, at each call, to the ``ops`` of the connection that decodes."""
    if getattr(converter, "__self__", None) is not connection.ops:
        return converter
    function = converter.__func__

    def convert(value: Any, expression: Any, connection: BaseDatabaseWrapper) -> Any:
        return function(connection.ops, value, expression, connection)

    return convert


def _row_converters(connection: BaseDatabaseWrapper, names: Sequence[str]) -> tuple[list, list]:
    """Django's own converters for these Job columns on this database (cached per alias)."""
    key = (connection.alias, tuple(names))
    if key not in _converters:
        table = Job._meta.db_table
        per_column = []
        for name in names:
            column = Job._meta.get_field(name).get_col(table)
            converters = connection.ops.get_db_converters(column) + column.get_db_converters(
                connection
            )
            per_column.append([_detached(converter, connection) for converter in converters])
        _converters[key] = (
            per_column,
            [Job._meta.get_field(name).get_col(table) for name in names],
        )
    return _converters[key]


def decode_rows(connection: BaseDatabaseWrapper, names: Sequence[str], rows: Sequence) -> list:
    """Turn raw rows of Job columns into Python values, as the ORM would."""
    per_column, columns = _row_converters(connection, names)
    decoded = []
    for row in rows:
        values = []
        for raw, converters, column in zip(row, per_column, columns, strict=True):
            value = raw
            for converter in converters:
                value = converter(value, column, connection)
            values.append(value)
        decoded.append(values)
    return decoded


def decode_json(value: Any) -> Any:
    """A JSON column's value from a raw cursor (text on some drivers, decoded on others)."""
    return json.loads(value) if isinstance(value, str | bytes) else value
