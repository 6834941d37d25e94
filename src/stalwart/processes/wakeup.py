"""A self-pipe that wakes a role's main loop: from signal handlers, threads, or notifications.

Writing a byte to a pipe is safe from a signal handler and from any thread, unlike setting a
``threading.Event`` whose lock the interrupted main thread may hold.

One byte is enough to wake the loop: while one waits unread, further wakes write nothing
(each job that finishes in a busy worker would otherwise cost a system call, and a round of
the GIL between its thread and the main loop).
"""

import contextlib
import os
import select


class Waker:
    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        # A byte was written and not yet read. Set before the write, cleared after the
        # read: a wake that finds it set while the byte is being read is not lost, since
        # whoever woke changed its state first, and the woken loop looks at it next.
        self._pending = False

    def wake(self) -> None:
        if self._pending:
            return
        self._pending = True
        # A full pipe already means "wake up"; a closed one means we are gone.
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._write, b"\0")

    def wait(self, timeout: float) -> bool:
        """Sleep until woken or ``timeout`` seconds pass; return whether woken."""
        try:
            readable, _, _ = select.select([self._read], [], [], max(timeout, 0))
        except InterruptedError:
            return True
        if readable:
            self.drain()
            return True
        return False

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._read, 4096):
                pass
        self._pending = False

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)
