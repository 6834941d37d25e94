"""Forking a child process that never returns into its parent's code.

Before the fork the parent closes its database connections (a connection must never be
shared across a fork). In the child, signal handlers are reset, the parent's death is
wired to a TERM (``PR_SET_PDEATHSIG`` on Linux), the role runs, and the child ends with
``os._exit``: whatever happens, it never runs the parent's shutdown code.
"""

import ctypes
import ctypes.util
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable

from django.db import connections

from stalwart import events

EXIT_CRASHED = 70  # EX_SOFTWARE: the role raised instead of returning a status
_PR_SET_PDEATHSIG = 1

# Connections inherited from the parent, kept referenced so they are never finalised in the
# child: finalising would tell the server to end a session the parent still uses.
_inherited: list[object] = []
_STOP_SIGNALS = {signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGCHLD}
# Stop signals that arrived after the fork but before the role installed its handlers.
_early_signals: list[int] = []


def _remember_signal(signum: int, frame: object) -> None:
    _early_signals.append(signum)


def signals_before_start() -> list[int]:
    """Stop signals received between the fork and the role's own handlers (then forgotten)."""
    received = list(_early_signals)
    _early_signals.clear()
    return received


def set_parent_death_signal(signum: int) -> bool:
    """Ask Linux to send ``signum`` when our parent dies; False where unsupported."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _forget_inherited_connections() -> None:
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None:
            _inherited.append(connection.connection)
            connection.connection = None


def fork_child(run: Callable[[], int]) -> int:
    """Fork; the child runs ``run()`` and exits with its status. Returns the child's pid."""
    connections.close_all()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    parent = os.getpid()
    # Stop signals wait (blocked) across the fork: in the child they must reach the child's
    # own handlers, never the parent's inherited ones.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    pid = os.fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        return pid
    status = EXIT_CRASHED
    try:
        _forget_inherited_connections()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            signal.signal(signum, _remember_signal)  # until the role installs its own
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        set_parent_death_signal(signal.SIGTERM)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(0)
        status = run()
    except BaseException as error:  # noqa: BLE001 - reported, then the child exits regardless
        events.emit(
            "process_crashed",
            pid=os.getpid(),
            error=f"{type(error).__name__}: {error}",
            traceback="".join(traceback.format_exception(error)),
        )
    finally:
        try:
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(status)
    return 0  # pragma: no cover - os._exit never returns
