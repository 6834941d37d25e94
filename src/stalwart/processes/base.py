"""What every role shares: its process row and heartbeat, its signals, its title, its wake-ups.

Signals: ``TERM`` and ``INT`` ask for a graceful stop (a repeat changes nothing); ``QUIT`` asks
for an immediate one. Handlers only set flags and wake the main loop.
"""

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any, ClassVar

import psutil
import setproctitle
from django.db import DatabaseError, connections

from stalwart import events
from stalwart.conf import Options
from stalwart.processes.exits import EXIT_CRASHED, EXIT_FENCED, EXIT_OK, EXIT_RECYCLE  # noqa: F401
from stalwart.processes.heartbeat import Heartbeat
from stalwart.processes.registry import Registration, process_name
from stalwart.processes.wakeup import Waker


class Role:
    """A long-running process role. Subclasses implement ``main()``."""

    kind: ClassVar[str]
    # The supervisor beats from its own loop: it forks, and must hold no connection in
    # another thread when it does.
    heartbeat_in_thread: ClassVar[bool] = True

    def __init__(
        self,
        *,
        config: Options,
        name: str | None = None,
        supervisor: int | None = None,
        parent_pid: int | None = None,
    ):
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
        self.parent_pid = parent_pid

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
        from stalwart.processes.forking import signals_before_start

        for signum in signals_before_start():
            self.request_stop(immediate=signum == signal.SIGQUIT)

    def _on_graceful_signal(self, signum: int, frame: Any) -> None:
        self.request_stop()

    def _on_immediate_signal(self, signum: int, frame: Any) -> None:
        self.request_stop(immediate=True)

    # -- reporting ---------------------------------------------------------------------------

    def resident_memory(self) -> int:
        """Bytes of memory this process holds (RSS), 0 if it cannot be read."""
        try:
            return self._psutil.memory_info().rss
        except psutil.Error:
            return 0

    def metadata(self) -> dict[str, Any]:
        """What the process table shows about us (refreshed at every heartbeat)."""
        return {"rss_bytes": self.resident_memory() or None}

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
        if self.heartbeat_in_thread:
            self._heartbeat = Heartbeat(
                self.registration,
                interval=self.config.heartbeat_interval,
                threshold=self.config.process_alive_threshold,
                metadata=self.metadata,
                on_fenced=self.fence,
                after_beat=self.after_heartbeat,
            )
            self._heartbeat.start()
        if self.parent_pid is not None:
            ParentWatch(self.parent_pid, self.on_parent_gone).start()
        try:
            self.main()
        except BaseException:
            if self.exit_status == EXIT_OK:
                self.exit_status = EXIT_CRASHED
            raise
        finally:
            # Stop beating before the row goes, or a last beat would find it gone and fence us.
            # (Briefly: a beat stuck on a dead connection must not hold the exit up.)
            if self._heartbeat is not None:
                self._heartbeat.stop()
                self._heartbeat.join(min(self.config.heartbeat_interval, 2.0))
            # Give back what is still held while the row still says whose it is (so no orphan
            # sweep takes it first), then the row: the last writes before the process ends.
            self.final_release()
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

    def final_release(self) -> None:
        """Give back anything still held, just before deregistering and ending."""

    def on_parent_gone(self) -> None:
        """Our supervisor died: stop gracefully, as if it had sent TERM."""
        events.emit("parent_gone", process=self.name, parent=self.parent_pid)
        self.request_stop()


class ParentWatch(threading.Thread):
    """Notices when the supervisor that forked us is gone (we were re-parented)."""

    def __init__(self, parent_pid: int, on_gone: Callable[[], None], interval: float = 0.5):
        super().__init__(name="stalwart-parent-watch", daemon=True)
        self.parent_pid = parent_pid
        self.on_gone = on_gone
        self.interval = interval

    def run(self) -> None:
        while os.getppid() == self.parent_pid:
            time.sleep(self.interval)  # a poll of the parent pid, not a synchronisation
        self.on_gone()
