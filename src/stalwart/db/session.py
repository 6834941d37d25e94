"""The queue's own connections: named, and bounded in time.

A thread that keeps the queue's books (a role's main loop, its heartbeat, the listener) calls
``bookkeeping()`` once. From then on every connection that thread opens to the alias carries
(on PostgreSQL) an ``application_name`` such as ``stalwart:worker:4242``, so operators see
which process a session belongs to, and a ``statement_timeout`` and ``lock_timeout``, so no
application transaction can wedge the queue's own writes: a wait ends in an error, which
the caller retries or reports, instead of a process that hangs for ever. Its connections
also get a ``connect_timeout``.

Job threads are left alone: their connections belong to the application's code.
"""

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.backends.signals import connection_created


@dataclass(frozen=True, slots=True)
class Session:
    application_name: str
    statement_timeout: float  # seconds
    lock_timeout: float  # seconds


def bookkeeping(
    alias: str,
    *,
    application_name: str,
    statement_timeout: float,
    lock_timeout: float,
    on_statement: Callable[[], None] | None = None,
) -> None:
    """Make this thread's connections to ``alias`` bookkeeping sessions (see above).

    ``on_statement`` is called after every statement the thread runs there, whatever its
    outcome: a statement that returned is proof that the thread is not stuck.
    """
    connection_created.connect(_on_connection_created, dispatch_uid="stalwart-bookkeeping")
    connection = connections[alias]
    connection.stalwart_session = Session(application_name[:63], statement_timeout, lock_timeout)
    if connection.vendor == "postgresql":
        options = dict(connection.settings_dict.get("OPTIONS") or {})
        if "connect_timeout" not in options and not options.get("pool"):
            options["connect_timeout"] = max(2, math.ceil(statement_timeout))
        # A copy: the dict is shared by every thread's wrapper of this alias.
        connection.settings_dict = {**connection.settings_dict, "OPTIONS": options}
    if on_statement is not None:
        connection.execute_wrappers.append(_calling_after(on_statement))
    if connection.connection is not None:
        apply_session(connection)


def _calling_after(callback: Callable[[], None]) -> Callable[..., Any]:
    def wrapper(execute: Callable, sql: str, params: Any, many: bool, context: dict) -> Any:
        try:
            return execute(sql, params, many, context)
        finally:
            callback()

    return wrapper


def _on_connection_created(sender: Any, connection: Any, **kwargs: Any) -> None:
    if getattr(connection, "stalwart_session", None) is not None:
        apply_session(connection)


def apply_session(connection: Any) -> None:
    session: Session = connection.stalwart_session
    if connection.vendor != "postgresql":
        return  # SQLite waits for locks as long as OPTIONS['timeout'] says; it has no names
    with connection.connection.cursor() as cursor:  # the raw cursor: no execute wrappers
        cursor.execute(
            "SELECT set_config('application_name', %s, false), "
            "set_config('statement_timeout', %s, false), set_config('lock_timeout', %s, false)",
            [
                session.application_name,
                f"{max(1, round(session.statement_timeout * 1000))}ms",
                f"{max(1, round(session.lock_timeout * 1000))}ms",
            ],
        )
