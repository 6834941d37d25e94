"""A client-side deadline for one call on this thread's connection.

``statement_timeout`` is enforced by the server; when the link itself stalls (a dead router,
a half-open TCP connection) no answer comes at all, and a blocking call would wait for ever.
``deadline(alias, seconds)`` shuts the connection's socket down if the block is still running
after ``seconds``: the blocked call fails at once with a connection error, which the caller
handles like any lost connection.
"""

import contextlib
import os
import socket
import threading
from collections.abc import Iterator

from django.db import connections


def cut(connection: object) -> None:
    """Shut down the socket of ``connection`` (a Django connection wrapper), from any thread:
    a call blocked on it fails at once, as on a lost connection; nothing else is touched."""
    raw = getattr(connection, "connection", None)
    fileno = getattr(raw, "fileno", None)
    if fileno is None:
        return
    with contextlib.suppress(OSError, ValueError, Exception):
        duplicate = os.dup(fileno())
        # A duplicate descriptor of the same socket: shutting it down ends the connection for
        # the blocked reader, without closing a descriptor the driver still owns.
        with socket.socket(fileno=duplicate) as sock:
            sock.shutdown(socket.SHUT_RDWR)


@contextlib.contextmanager
def deadline(alias: str, seconds: float) -> Iterator[None]:
    """Run the block; if it takes longer than ``seconds``, cut this thread's connection."""
    connection = connections[alias]
    if connection.vendor != "postgresql":
        yield  # SQLite is a local file: no link to stall
        return
    timer = threading.Timer(seconds, cut, args=(connection,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        timer.join()  # no thread of ours may outlive the call (the supervisor forks)
