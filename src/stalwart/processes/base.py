"""What every role shares: its process row and heartbeat, its signals, its title, its wake-ups.

Signals: ``TERM`` and ``INT`` ask for a graceful stop (a repeat changes nothing); ``QUIT`` asks
for an immediate one. Handlers only set flags and wake the main loop.
"""

import os
import signal
import threading
from typing import Any, ClassVar

import psutil
import setproctitle
from django.db import DatabaseError, connections

from stalwart import events
from stalwart.conf import Options
from stalwart.processes.heartbeat import Heartbeat
from stalwart.processes.registry import Registration, process_name
from stalwart.processes.wakeup import Waker

# Exit statuses a supervisor tells apart.
EXIT_OK = 0
EXIT_FENCED = 3  # our row was pruned, or heartbeats failed too long: we stopped on our own
EXIT_RECYCLE = 4  # memory or job-count limit reached: replace me


class Role:
    """A long-running process role. Subclasses implement ``main()``."""

    kind: ClassVar[str]

    def __init__(self, *, config: Options, name: str | None = None, supervisor: int | None = None):
        self.config = config
        self.database = config.database
        self.name = name or process_name(self.kind)
        self.registration = Registration(
            self.database, kind=self.kind, name=self.name, supervisor=supervisor
        )
        self.waker = Waker()
        self.stop_requested = False
        self.immediate = False
        self.fenced_reason: str | None = None
        self.exit_status = EXIT_OK
        self._title = ""
        self._heartbeat: Heartbeat | None = None
        self._psutil = psutil.Process()

    # -- control -----------------------------------------------------------------------------

    def request_stop(self, *, immediate: bool = False) -> None:
        """Ask the main loop to stop; safe from signal handlers and other threads."""
        self.stop_requested = True
        if immediate:
            self.immediate = True
        self.waker.wake()

    def fence(self, reason: str) -> None:
        """We may have been declared dead: stop at once, write nothing more of ours."""
        self.fenced_reason = reason
        self.exit_status = EXIT_FENCED
        events.emit("process_fenced", process=self.name, reason=reason)
        self.request_stop(immediate=True)

    def install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        signal.signal(signal.SIGTERM, self._on_graceful_signal)
        signal.signal(signal.SIGINT, self._on_graceful_signal)
        signal.signal(signal.SIGQUIT, self._on_immediate_signal)

    def _on_graceful_signal(self, signum: int, frame: Any) -> None:
        self.request_stop()

    def _on_immediate_signal(self, signum: int, frame: Any) -> None:
        self.request_stop(immediate=True)

    # -- reporting ---------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        """What the process table shows about us (refreshed at every heartbeat)."""
        try:
            rss = self._psutil.memory_info().rss
        except psutil.Error:
            rss = None
        return {"rss_bytes": rss}

    def set_title(self, state: str) -> None:
        title = f"stalwart {self.kind} {state}".rstrip()
        if title != self._title:
            self._title = title
            setproctitle.setproctitle(title)

    # -- life --------------------------------------------------------------------------------

    def run(self) -> int:
        """Register, run ``main()`` until stopped, deregister. Returns the exit status."""
        self.install_signal_handlers()
        self.set_title("starting")
        self.registration.register(self.metadata())
        events.emit(
            "process_started",
            kind=self.kind,
            process=self.name,
            id=self.registration.id,
            pid=os.getpid(),
        )
        self._heartbeat = Heartbeat(
            self.registration,
            interval=self.config.heartbeat_interval,
            threshold=self.config.process_alive_threshold,
            metadata=self.metadata,
            on_fenced=self.fence,
            after_beat=self.after_heartbeat,
        )
        self._heartbeat.start()
        try:
            self.main()
        finally:
            # Stop beating before the row goes, or a last beat would find it gone and fence us.
            self._heartbeat.stop()
            self._heartbeat.join(self.config.heartbeat_interval + 30)
            if self.fenced_reason is None:
                try:
                    self.registration.deregister()
                except DatabaseError as error:
                    # Left behind, the row is pruned once its heartbeat is old enough.
                    events.emit("deregister_failed", process=self.name, error=str(error))
            connections.close_all()  # this thread's; forked children must not keep them either
            events.emit(
                "process_stopped",
                kind=self.kind,
                process=self.name,
                status=self.exit_status,
                reason=self.fenced_reason,
            )
        return self.exit_status

    def main(self) -> None:
        raise NotImplementedError

    def after_heartbeat(self) -> None:
        """Called in the heartbeat thread after each successful beat."""
