"""Raw rows of job columns, read with a plain cursor, turned into Python values as the ORM
would turn them (Django's own converters for each column, on each database)."""

import json
from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import Field, JSONField

from stalwart.models import Job

# Caches are per database alias, never per connection: each thread has its own connection
# object, and a cache entry that refers to one would keep it (and its socket) alive for ever.
# Each entry lists only the columns that have converters: on PostgreSQL, 4 of the 19 a claim
# reads (the JSON ones); the others are taken from the row as the driver gave them.
_plans: dict[tuple[str, tuple[str, ...]], list[tuple[int, list, Any]]] = {}


def _detached(converter: Any, connection: BaseDatabaseWrapper) -> Any:
    """``converter``, holding no reference to ``connection``: a method of its ``ops`` is
    bound again, at each call, to the ``ops`` of the connection that decodes."""
    if getattr(converter, "__self__", None) is not connection.ops:
        return converter
    function = converter.__func__

    def convert(value: Any, expression: Any, connection: BaseDatabaseWrapper) -> Any:
        return function(connection.ops, value, expression, connection)

    return convert


# The JSON a job's columns hold most often, decoded without the parser (a new object each
# time: a task may change the list or dict it is given).
_COMMON_JSON = {"[]": list, "{}": dict}


def _json_from_db(value: Any, expression: Any, connection: BaseDatabaseWrapper) -> Any:
    """``JSONField.from_db_value`` for a plain column (not a key transform) and the default
    decoder, with the common empty values made directly: the same values, for less."""
    if value is None:
        return None
    make = _COMMON_JSON.get(value) if isinstance(value, str) else None
    if make is not None:
        return make()
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _simpler(converter: Any) -> Any:
    """A cheaper converter that gives the same values, where there is one."""
    field = getattr(converter, "__self__", None)
    if (
        isinstance(field, JSONField)
        and getattr(converter, "__func__", None) is JSONField.from_db_value
        and field.decoder is None
    ):
        return _json_from_db
    return converter


def _plan(connection: BaseDatabaseWrapper, names: Sequence[str]) -> list[tuple[int, list, Any]]:
    """Django's own converters for these Job columns on this database, as (position,
    converters, column) for each column that has any (cached per alias)."""
    key = (connection.alias, tuple(names))
    plan = _plans.get(key)
    if plan is None:
        table = Job._meta.db_table
        plan = []
        for position, name in enumerate(names):
            field = Job._meta.get_field(name)
            if not isinstance(field, Field):  # a relation's other side: not a column
                raise ValueError(f"{name!r} is not a column of {table}.")
            column = field.get_col(table)
            converters = connection.ops.get_db_converters(column) + column.get_db_converters(
                connection
            )
            if converters:
                detached = [_detached(_simpler(converter), connection) for converter in converters]
                plan.append((position, detached, column))
        _plans[key] = plan
    return plan


def decode_rows(connection: BaseDatabaseWrapper, names: Sequence[str], rows: Sequence) -> list:
    """Turn raw rows of Job columns into Python values, as the ORM would."""
    plan = _plan(connection, names)
    width = len(names)
    decoded = []
    for row in rows:
        if len(row) != width:
            raise ValueError(f"a row of {len(row)} values for {width} columns")
        values = list(row)
        for position, converters, column in plan:
            value = values[position]
            for converter in converters:
                value = converter(value, column, connection)
            values[position] = value
        decoded.append(values)
    return decoded


def decode_json(value: Any) -> Any:
    """A JSON column's value from a raw cursor (text on some drivers, decoded on others)."""
    return json.loads(value) if isinstance(value, str | bytes) else value
