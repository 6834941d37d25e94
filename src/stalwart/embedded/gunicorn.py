"""Gunicorn server hooks that run Stalwart's supervisor as a child of Gunicorn's master.

In ``gunicorn.conf.py``::

    from stalwart.embedded.gunicorn import *  # noqa: F403 - when_ready, on_reload, on_exit

The supervisor starts once Gunicorn listens (``when_ready``), from the master, never from a
web worker: one supervisor per Gunicorn, however many workers it runs. ``on_exit`` stops it
when the master stops (after the web workers): ``TERM``, then a wait for its drain.
``on_reload`` (``HUP``) starts a supervisor with the new code and lets the old one drain, as
Gunicorn does with its workers. ``hooks(backend=...)`` makes the three hooks for another
backend than ``default``.
"""

from collections.abc import Callable
from typing import Any

from stalwart.embedded.launcher import EmbeddedError, EmbeddedSupervisor

__all__ = ["on_exit", "on_reload", "when_ready"]


class GunicornHooks:
    """The supervisor of one Gunicorn master, and those still draining after a reload."""

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.current: EmbeddedSupervisor | None = None
        self.retiring: list[EmbeddedSupervisor] = []

    def when_ready(self, server: Any) -> None:
        # Raises EmbeddedError, a RuntimeError: Gunicorn prints it and exits, serving nothing.
        self.current = EmbeddedSupervisor(self.backend).start()
        server.log.info(
            "Stalwart: supervisor of TASKS[%r] started (pid %s)", self.backend, self.current.pid
        )

    def on_reload(self, server: Any) -> None:
        try:
            fresh = EmbeddedSupervisor(self.backend).start()
        except EmbeddedError as error:
            # The new code cannot run a supervisor: the old one keeps running.
            server.log.error("Stalwart: the supervisor was not restarted: %s", error)
            return
        if self.current is not None:
            self.current.request_stop()
            self.retiring.append(self.current)
        self.current = fresh
        server.log.info("Stalwart: supervisor restarted (pid %s)", fresh.pid)

    def on_exit(self, server: Any) -> None:
        supervisors = [s for s in (self.current, *self.retiring) if s is not None]
        for supervisor in supervisors:
            supervisor.request_stop()
        for supervisor in supervisors:
            status = supervisor.wait()
            server.log.info("Stalwart: supervisor (pid %s) ended: %s", supervisor.pid, status)
        self.current = None
        self.retiring = []


def hooks(*, backend: str = "default") -> tuple[Callable[[Any], None], ...]:
    """``when_ready``, ``on_reload`` and ``on_exit`` for the Stalwart backend ``backend``."""
    state = GunicornHooks(backend)
    return state.when_ready, state.on_reload, state.on_exit


when_ready, on_reload, on_exit = hooks()
