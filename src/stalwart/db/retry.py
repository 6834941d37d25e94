"""Retrying whole transactions that failed for a transient reason, with jittered backoff."""

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator

from django.db import DatabaseError, InterfaceError, connections

from stalwart import events
from stalwart.db.errors import is_connection_lost, is_lock_wait, is_transient, is_unique_conflict

_local = threading.local()


@contextlib.contextmanager
def lost_connections_to_the_caller() -> Iterator[None]:
    """Within this block (on this thread), a lost or refused connection is not retried here:
    the caller's own loop reconnects, with its outage's backoff and one log line. Six quick
    tries would cost six connection timeouts on a stalled link, and a deadline cannot cut
    a connection attempt. Other transient failures (a deadlock, a lock wait) are retried as
    before."""
    before = getattr(_local, "to_caller", False)
    _local.to_caller = True
    try:
        yield
    finally:
        _local.to_caller = before


def retry_transient[T](
    alias: str,
    operation: Callable[[], T],
    *,
    what: str,
    attempts: int = 6,
    first_delay: float = 0.02,
    max_delay: float = 2.0,
    conflicts: bool = False,
    lock_waits: bool = True,
) -> T:
    """Run ``operation`` (one whole transaction of ours), retrying transient failures.

    Never retries inside a transaction the caller owns: the error would have poisoned it.
    With ``conflicts``, a unique-index conflict is retried too: the statements that move a job
    back to waiting drop its unique key when they see a twin, which a racing twin defeats
    only until the next try. Without ``lock_waits``, a lock waited on past ``lock_timeout``
    is not retried: the caller has a better use for the time than waiting again.
    """
    connection = connections[alias]
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return operation()
        except (DatabaseError, InterfaceError) as error:
            retryable = (
                (is_transient(error) or (conflicts and is_unique_conflict(error)))
                and (lock_waits or not is_lock_wait(error))
                and not (getattr(_local, "to_caller", False) and is_connection_lost(error))
            )
            if connection.in_atomic_block or not retryable or attempt == attempts:
                raise
            events.emit(
                "database_retry",
                what=what,
                attempt=attempt,
                error=f"{type(error).__name__}: {error}",
            )
            reset_if_broken(alias)
            time.sleep(delay * random.uniform(0.5, 1.5))  # noqa: S311 - jitter, not secrecy
            delay = min(delay * 2, max_delay)
    raise AssertionError("unreachable")  # pragma: no cover


def reset_if_broken(alias: str) -> None:
    """Close this thread's connection if it can no longer be used; the next use reconnects."""
    connection = connections[alias]
    if connection.connection is None or connection.in_atomic_block:
        return
    try:
        usable = connection.is_usable()
    except Exception:  # noqa: BLE001 - any failure to answer means unusable
        usable = False
    if not usable:
        try:
            connection.close()
        except DatabaseError:
            connection.connection = None  # already gone; forget it so the next use reconnects
