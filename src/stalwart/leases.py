"""Leases: the database decides who does a cluster-wide chore, once per interval.

``try_acquire`` reports contention as ``False`` (held by someone else, or locked by a
transaction in progress); a database failure raises. Losing leaves the caller's transaction
usable. A lease expires on its own (database clock), so a holder that dies frees it.
"""

from django.db import connections

from stalwart.db import statements_for
from stalwart.db.retry import retry_transient


def try_acquire(name: str, holder: str, ttl: float, *, database: str) -> bool:
    """Take (or renew) the lease ``name`` for ``ttl`` seconds; True if we now hold it."""

    def acquire() -> bool:
        connection = connections[database]
        with connection.cursor() as cursor:
            return statements_for(connection).acquire_lease(
                cursor, name=name, holder=holder, ttl=ttl
            )

    return retry_transient(database, acquire, what="acquire a lease")


def release(name: str, holder: str, *, database: str) -> bool:
    """Give the lease up now if we hold it; True if we did."""

    def give_up() -> bool:
        connection = connections[database]
        with connection.cursor() as cursor:
            return statements_for(connection).release_lease(cursor, name=name, holder=holder)

    return retry_transient(database, give_up, what="release a lease")
