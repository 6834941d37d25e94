"""A job thread's database connections at each job's boundaries, as Django's request cycle
keeps a web request's.

A job is a request: before and after it, each of the thread's connections is looked at as
Django does at a request's start and end (``close_if_unusable_or_obsolete``). So
``CONN_MAX_AGE`` holds as documented for requests (``0``, Django's default, closes a
connection after each job; a number of seconds keeps it that long; ``None`` for good), and
``CONN_HEALTH_CHECKS`` checks a reused connection before the job's first query. After the
job, a connection the task left inside a transaction is closed, which rolls the transaction
back.

And a job never starts on a connection that died: once the worker has seen the database
fail (an outage of its own loop, or a job that lost its connection), every thread checks
its connections before its next job (``suspect``), whatever ``CONN_HEALTH_CHECKS`` says, and
replaces those that no longer answer.
"""

import threading

from django.db import DatabaseError, connections
from django.db.backends.base.base import BaseDatabaseWrapper

from stalwart.db.errors import is_connection_lost


class Suspicion:
    """How often the worker has seen the database fail; each job thread checks its
    connections before its next job when that number has changed since its last look."""

    def __init__(self) -> None:
        self.generation = 0
        self._seen = threading.local()

    def suspect(self) -> None:
        """The database failed (a restart, an outage): the threads' connections may be dead."""
        self.generation += 1

    def check_now(self) -> bool:
        """Whether this thread has not checked its connections since the last failure."""
        seen = getattr(self._seen, "generation", 0)
        self._seen.generation = self.generation
        return seen != self.generation


def before_job(*, check: bool) -> None:
    """Make this thread's connections fit for a job: Django's look at a request's start;
    with ``check``, each open connection is asked whether it still answers first."""
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        try:
            if check and not connection.is_usable():
                connection.close()
                continue
            connection.close_if_unusable_or_obsolete()
        except DatabaseError:
            connection.connection = None  # whatever happened, reconnect on next use


def _left_open(connection: BaseDatabaseWrapper) -> bool:
    """Whether ``connection`` (open) is still inside a transaction."""
    return connection.in_atomic_block or not connection.get_autocommit()


def after_job() -> list[str]:
    """Make this thread's connections fit for the next job, as Django does at a request's
    end; return the aliases of those the job left inside a transaction.

    A connection left inside a transaction (or with autocommit off) is closed, which rolls
    the transaction back; one that saw errors is kept only if it still answers; one past its
    ``CONN_MAX_AGE`` is closed."""
    left_open = []
    for connection in connections.all(initialized_only=True):
        if connection.connection is None:
            continue
        if _left_open(connection):
            left_open.append(connection.alias)
            abandoned = True
        else:
            abandoned = connection.closed_in_transaction
        try:
            if abandoned:
                # Forget the job's transaction, then its connection: closing rolls it back.
                connection.in_atomic_block = False
                connection.closed_in_transaction = False
                connection.close()
            else:
                connection.close_if_unusable_or_obsolete()
        except DatabaseError:
            pass
        if abandoned or connection.errors_occurred:
            connection.connection = None  # whatever happened above, reconnect on next use
    return left_open


def lost_connection(exception: BaseException) -> DatabaseError | None:
    """The database error behind ``exception`` that says a connection was lost (the
    database restarted, failed over, or ended the session), if any: in the exception itself
    or the chain of exceptions it was raised from or while handling."""
    seen: set[int] = set()
    current: BaseException | None = exception
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DatabaseError) and is_connection_lost(current):
            return current
        current = current.__cause__ or current.__context__
    return None
