"""Forking a child process that never returns into its parent's code.

Before the fork the parent closes its database connections and Django's connection pools
(a connection must never be shared across a fork; each process builds its own pool). In
the child, signal handlers are reset, the parent's death is wired to a TERM
(``PR_SET_PDEATHSIG`` on Linux), the role runs, and the child ends with ``os._exit``:
whatever happens, it never runs the parent's shutdown code.

Each child leads its own process group, so that whatever its jobs start (and leave behind)
can be ended with it (``end_group``). And each child tells its parent, through a pipe, what
it knows of its own end (``tell_parent``, ``report``): that its role returned (it gave up the
jobs it still ran on purpose), and its verdict on a death that may come (see
``stalwart.processes.verdicts``). A child killed before it could say anything (a signal, a
task's ``os._exit``, its heartbeat's deadline while a task held the GIL) died of something
its jobs may have done: a crash, charged as ``stalwart.db.Death.CRASH`` says.

The child gets no copy of the parent's other threads. Libraries that run threads from
import time must start them again in the child (``os.register_at_fork``) or lazily.
"""

import contextlib
import ctypes
import ctypes.util
import json
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import psutil
from django.db import connections

from stalwart import events, log

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


# Set while fork_child() forks: a child sees it set, and knows it is ours.
_forking = {"now": False}


def _forget_inherited_pools() -> None:
    """In a child of ``fork_child()``, at once: put aside the Django connection pools
    (``OPTIONS["pool"]``, PostgreSQL) it inherited, so it builds its own on first use.

    The parent closed its pools before forking, but another of its threads may have opened
    one again since: its connections may be the parent's, so it is never closed here, only
    kept referenced (never finalised). This runs as an at-fork hook, registered when
    Stalwart's app is ready, so before the hooks of most libraries that start their threads
    again in the child: none of those threads can take a connection from the parent's pool.
    """
    if not _forking["now"]:
        return
    for connection in connections.all():
        pools = getattr(type(connection), "_connection_pools", None)
        if pools:
            _inherited.extend(pools.values())
            pools.clear()


os.register_at_fork(after_in_child=_forget_inherited_pools)


def _fork() -> int:
    """``os.fork()``, telling the child's at-fork hooks that the fork is ours."""
    _forking["now"] = True
    try:
        return os.fork()
    finally:
        _forking["now"] = False  # in the child too, once its at-fork hooks have run


def _close_connections() -> None:
    """Before a fork: no connection, no pool (nor its threads) for the child to share."""
    connections.close_all()
    close_pools()


def close_pools() -> None:
    """Close this process's Django connection pools (their connections and their threads);
    each is built again on next use. Call only with every connection given back."""
    for connection in connections.all():
        pools = getattr(connection, "_connection_pools", None)
        if pools and connection.alias in pools:
            connection.close_pool()  # type: ignore[attr-defined]  # PostgreSQL's only


# Read ends of the status pipes of our living children (closed in each new child).
_status_pipes: set[int] = set()
# In a child: the write end of its own status pipe.
_to_parent: int | None = None


def tell_parent(message: dict) -> None:
    """In a forked child: tell the supervisor ``message`` (one JSON line: ``{"ended":
    true}`` when the role returned, ``{"verdict": ...}`` when the child's own word on a death
    changes; see ``stalwart.processes.verdicts``); elsewhere nothing. Never blocks: the
    pipe holds far more than a child says."""
    if _to_parent is not None:
        with contextlib.suppress(OSError):
            os.write(_to_parent, (json.dumps(message) + "\n").encode())


@dataclass(frozen=True, slots=True)
class Forked:
    pid: int
    status_pipe: int  # read end: ``report`` once the child has exited


@dataclass(frozen=True, slots=True)
class Report:
    """What a child said before it exited: whether its role returned (it gave up what it
    still ran on purpose), and its newest verdict (None: none, or withdrawn)."""

    ended: bool = False
    verdict: dict | None = None


# What living children said so far on their status pipes (read end -> bytes), read by
# ``listen`` while they run; ``report`` reads the rest once they have exited.
_heard: dict[int, bytes] = {}


def _read_available(pipe: int) -> bytes:
    chunks = []
    with contextlib.suppress(OSError):  # BlockingIOError: nothing more for now
        while chunk := os.read(pipe, 65536):
            chunks.append(chunk)
    return b"".join(chunks)


def listen(forked: Forked) -> Report:
    """While the child runs: what it has said so far on its status pipe (never blocks; the
    pipe stays open for ``report``)."""
    heard = _heard.get(forked.status_pipe, b"") + _read_available(forked.status_pipe)
    _heard[forked.status_pipe] = heard
    return _parse(heard.rpartition(b"\n")[0])


def report(forked: Forked) -> Report:
    """After the child exited: what it said on its status pipe. Closes the pipe."""
    try:
        said = _heard.pop(forked.status_pipe, b"") + _read_available(forked.status_pipe)
    finally:
        _status_pipes.discard(forked.status_pipe)
        with contextlib.suppress(OSError):
            os.close(forked.status_pipe)
    return _parse(said)


def _parse(said: bytes) -> Report:
    ended, verdict = False, None
    for line in said.decode("utf-8", "replace").splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue  # a line cut short by the child's death
        if not isinstance(message, dict):
            continue
        ended = ended or bool(message.get("ended"))
        if "verdict" in message:
            verdict = message["verdict"]
    return Report(ended=ended, verdict=verdict)


def flush_logs(timeout: float = 2.0) -> None:
    """Flush every log handler, giving up after ``timeout`` seconds: a handler that blocks
    (a full pipe, a dead log server) must not keep a process from ending."""
    log.flush(timeout)
    flusher = threading.Thread(target=logging.shutdown, name="stalwart-log-flush", daemon=True)
    flusher.start()
    flusher.join(timeout)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()


def end_group(pgid: int, signum: int = signal.SIGTERM) -> bool:
    """Signal the process group ``pgid`` (a child's, and whatever its jobs started); False
    if no process is left in it."""
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def end_descendants(grace: float = 2.0) -> None:
    """TERM the processes this one started (its jobs' subprocesses, theirs), then KILL those
    still there after ``grace`` seconds. For a process that does not lead its own group (a
    'queue work' started from a shell); a forked child's group is ended by its supervisor."""
    try:
        descendants = psutil.Process().children(recursive=True)
    except psutil.Error:
        return
    for process in descendants:
        with contextlib.suppress(psutil.Error):
            process.terminate()
    _, alive = psutil.wait_procs(descendants, timeout=grace)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()


def fork_child(run: Callable[[], int]) -> Forked:
    """Fork; the child runs ``run()`` and exits with its status."""
    _close_connections()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    parent = os.getpid()
    read_end, write_end = os.pipe()
    # Stop signals wait (blocked) across the fork: in the child they must reach the child's
    # own handlers, never the parent's inherited ones.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOP_SIGNALS)
    pid = _fork()
    if pid:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        os.close(write_end)
        os.set_blocking(read_end, False)
        _status_pipes.add(read_end)
        with contextlib.suppress(OSError):  # the child does it too; whoever comes first
            os.setpgid(pid, pid)
        return Forked(pid, read_end)
    global _to_parent  # noqa: PLW0603 - this process's own pipe, from here on
    status = EXIT_CRASHED
    ended = False
    _to_parent = write_end
    try:
        os.close(read_end)
        for inherited in _status_pipes:  # our siblings' pipes are not ours to hold
            with contextlib.suppress(OSError):
                os.close(inherited)
        _status_pipes.clear()
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
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
        ended = True
    except BaseException as error:  # noqa: BLE001 - reported, then the child exits regardless
        events.emit(
            "process_crashed",
            pid=os.getpid(),
            error=f"{type(error).__name__}: {error}",
            traceback="".join(traceback.format_exception(error)),
        )
    finally:
        try:
            if ended:
                tell_parent({"ended": True})
            with contextlib.suppress(Exception):  # end our pooled sessions, not drop them
                close_pools()
            flush_logs()
        finally:
            os._exit(status)
    raise AssertionError("unreachable")  # pragma: no cover - os._exit never returns
