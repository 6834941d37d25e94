"""The queue's own connections: named, and bounded in time.

A thread that keeps the queue's books (a role's main loop, its heartbeat, the listener) calls
``bookkeeping()`` once. From then on every connection that thread opens to the alias carries,
on PostgreSQL, in its startup packet (so at no cost, and for the session's whole life):

- an ``application_name`` such as ``stalwart:worker:4242``, so operators see which process a
  session belongs to;
- a ``statement_timeout`` and a ``lock_timeout``, so no application transaction can wedge the
  queue's own writes: a wait ends in an error, which the caller retries or reports, instead
  of a process that hangs for ever;
- a ``connect_timeout``;
- psycopg's ``prepare_threshold``, set so that it prepares the statements that ask for it
  (the worker's finish-and-claim, see ``stalwart.db.claims.postgresql``) and no other, unless
  ``DATABASES`` sets one.

They are startup parameters, not ``SET`` commands: behind a pooler in transaction mode a
``SET`` would stay on the server connection and reach whichever client gets it next. Such a
pooler cannot carry them either: PgBouncer refuses the ``options`` parameter, or drops it
when told to ignore it. So with ``pooled`` (the setting ``transaction_pooler``) the timeouts
are not sent at all, nor is anything prepared, and ``application_name`` (which PgBouncer
passes on) and the ``connect_timeout`` are kept. A pooler nobody told us about that refuses
the ``options`` parameter gets a connection without the timeouts and without prepared
statements (and one ``session_options_refused`` event).

On MySQL and MariaDB, which have no startup parameters for them, the same bounds are set on
each new session right after it connects: ``innodb_lock_wait_timeout`` and
``lock_wait_timeout`` (row and metadata locks; whole seconds, 1 at least) for the lock
timeout, and MariaDB's ``max_statement_time`` (every statement) or MySQL's
``max_execution_time`` (SELECTs only) for the statement timeout. Since MySQL bounds no
UPDATE or DELETE that runs long, the client bounds every answer too: ``read_timeout`` and
``write_timeout`` of the statement timeout plus ``CLIENT_MARGIN`` seconds (the connection is
then lost, and the loop reconnects).

Job threads are left alone: their connections belong to the application's code. They alone
use Django's connection pool, if ``OPTIONS["pool"]`` sets one up.
"""

import math
import secrets
import sys
from collections.abc import Callable
from typing import Any

from django.db import connections

from stalwart import events

# psycopg prepares a statement once it has run this many times: never, unless the statement
# asks to be (``prepare=True``). Without a threshold (None) it would not even then.
PREPARED_WHEN_ASKED = sys.maxsize
# MySQL/MariaDB: seconds the client waits for an answer past the statement timeout.
CLIENT_MARGIN = 2


def bookkeeping(
    alias: str,
    *,
    application_name: str,
    statement_timeout: float,
    lock_timeout: float,
    on_statement: Callable[[], None] | None = None,
    connect_timeout: int | None = None,
    pooled: bool = False,
) -> None:
    """Make this thread's connections to ``alias`` bookkeeping sessions (see above).

    ``on_statement`` is called after every statement the thread runs there, whatever its
    outcome: a statement that returned is proof that the thread is not stuck.
    ``connect_timeout``: seconds (2 at least, as libpq has it); by default the statement
    timeout's. ``pooled``: ``alias`` is reached through a pooler in transaction mode, where
    no session parameter can be set.
    """
    connection = connections[alias]
    if connection.vendor == "postgresql":
        options = dict(connection.settings_dict.get("OPTIONS") or {})
        if options.pop("pool", None) and connection.connection is not None:
            connection.close()  # give a pooled connection back before leaving the pool
        # Bookkeeping sessions bypass Django's pool (OPTIONS["pool"]): a pool's connections
        # are opened with the parameters of whichever thread built it, and are handed to any
        # thread; these must carry the parameters below, and never reach application code.
        if "connect_timeout" not in options:
            options["connect_timeout"] = max(2, connect_timeout or math.ceil(statement_timeout))
        # Ours, unless DATABASES names the sessions: never a name this thread's wrapper
        # already carries, which in a forked child is its parent's (the child's main thread
        # is the parent's, wrapper and all).
        configured = (connections.settings[alias].get("OPTIONS") or {}).get("application_name")
        options["application_name"] = (configured or application_name)[:63]
        # A copy: the dict is shared by every thread's wrapper of this alias.
        connection.settings_dict = {**connection.settings_dict, "OPTIONS": options}
        if pooled:
            # psycopg's server-side prepared statements are session state too (and PgBouncer
            # before 1.21 cannot carry them in transaction mode): never for the queue's own.
            options.pop("prepare_threshold", None)
        else:
            options.setdefault("prepare_threshold", PREPARED_WHEN_ASKED)
            _with_timeouts(connection, statement_timeout, lock_timeout)
            _statement_names_of_its_own(connection)
        if connection.connection is not None:
            connection.close()  # the next statement opens a session with these parameters
    elif connection.vendor == "mysql":
        options = dict(connection.settings_dict.get("OPTIONS") or {})
        options.setdefault(
            "connect_timeout", max(2, connect_timeout or math.ceil(statement_timeout))
        )
        # The client's own bound on an answer: MySQL 8 has no server-side bound on an UPDATE
        # or a DELETE that runs long (max_execution_time covers SELECTs only).
        for timeout in ("read_timeout", "write_timeout"):
            options.setdefault(timeout, math.ceil(statement_timeout) + CLIENT_MARGIN)
        connection.settings_dict = {**connection.settings_dict, "OPTIONS": options}
        _bounded_mysql_sessions(connection, statement_timeout, lock_timeout)
        if connection.connection is not None:
            connection.close()  # the next statement opens a session with these bounds
    if on_statement is not None:
        connection.execute_wrappers.append(_calling_after(on_statement))


def _with_timeouts(connection: Any, statement_timeout: float, lock_timeout: float) -> None:
    """Add the timeouts to the ``options`` startup parameter of ``connection``'s sessions."""
    options = connection.settings_dict["OPTIONS"]
    server = (
        f"-c statement_timeout={_milliseconds(statement_timeout)} "
        f"-c lock_timeout={_milliseconds(lock_timeout)}"
    )
    options["options"] = f"{options['options']} {server}" if options.get("options") else server
    _without_refused_options(connection)


def _bounded_mysql_sessions(connection: Any, statement_timeout: float, lock_timeout: float) -> None:
    """Set the timeouts on each new MySQL/MariaDB session of this thread, as it connects."""
    connect = connection.get_new_connection

    def get_new_connection(conn_params: dict) -> Any:
        raw = connect(conn_params)
        if "mariadb" in raw.get_server_info().lower():
            statement = f"max_statement_time = {statement_timeout:.3f}"
        else:
            statement = f"max_execution_time = {max(1, round(statement_timeout * 1000))}"
        cursor = raw.cursor()
        try:
            wait = max(1, math.ceil(lock_timeout))
            # Row locks (InnoDB's), and metadata locks (LOCK TABLES, an ALTER TABLE): an
            # UPDATE or a DELETE waits for either, and on MySQL nothing else bounds it.
            cursor.execute(
                f"SET SESSION innodb_lock_wait_timeout = {wait}, "
                f"SESSION lock_wait_timeout = {wait}, SESSION {statement}"
            )
        finally:
            cursor.close()
        return raw

    connection.get_new_connection = get_new_connection


def _statement_names_of_its_own(connection: Any) -> None:
    """Number the prepared statements of each new session from a random start.

    psycopg names every connection's statements ``_pg3_0``, ``_pg3_1``... Behind a pooler in
    transaction mode that nobody told us about, a transaction may run on a server session
    where another client prepared a statement of the same name, and psycopg would run theirs
    in place of ours: another worker's finish-and-claim with another limit (claiming more
    jobs than asked for), or a statement of other parameters (an error at every turn). A name
    of our own is missing there instead, an error the finish-and-claim answers by running
    unprepared from then on."""
    connect = connection.get_new_connection

    def get_new_connection(conn_params: dict) -> Any:
        raw = connect(conn_params)
        # psycopg's prepared statement cache, private. Should it ever change shape, the
        # session prepares nothing rather than risk the names every client shares.
        manager = getattr(raw, "_prepared", None)
        if manager is not None and isinstance(getattr(manager, "_prepared_idx", None), int):
            manager._prepared_idx = secrets.randbits(62)
        else:
            raw.prepare_threshold = None
        return raw

    connection.get_new_connection = get_new_connection


def _milliseconds(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _calling_after(callback: Callable[[], None]) -> Callable[..., Any]:
    def wrapper(execute: Callable, sql: str, params: Any, many: bool, context: dict) -> Any:
        try:
            return execute(sql, params, many, context)
        finally:
            callback()

    return wrapper


def _without_refused_options(connection: Any) -> None:
    """Connect without the ``options`` startup parameter if the server (a pooler) refuses
    it, and remember to, rather than fail every connection."""
    connect = connection.get_new_connection

    def get_new_connection(conn_params: dict) -> Any:
        try:
            return connect(conn_params)
        except Exception as error:
            if "options" not in conn_params or "unsupported startup parameter" not in str(error):
                raise
        options = dict(connection.settings_dict["OPTIONS"])
        options.pop("options", None)
        # A pooler, most likely: it would lose a prepared statement with its server session.
        if options.get("prepare_threshold") == PREPARED_WHEN_ASKED:
            options.pop("prepare_threshold")
        connection.settings_dict = {**connection.settings_dict, "OPTIONS": options}
        events.emit(
            "session_options_refused",
            application_name=conn_params.get("application_name"),
            reason="the server (a pooler?) refuses the 'options' startup parameter: the "
            "queue's statement_timeout and lock_timeout are not set on its connections",
        )
        kept = {key: value for key, value in conn_params.items() if key != "options"}
        if "prepare_threshold" in kept:
            kept["prepare_threshold"] = options.get("prepare_threshold")
        return connect(kept)

    connection.get_new_connection = get_new_connection
