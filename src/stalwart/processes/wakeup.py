"""A self-pipe that wakes a role's main loop: from signal handlers, threads, or notifications.

Writing a byte to a pipe is safe from a signal handler and from any thread, unlike setting a
``threading.Event`` whose lock the interrupted main thread may hold.
"""

import contextlib
import os
import select


class Waker:
    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)

    def wake(self) -> None:
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

    def close(self) -> None:
        for fd in (self._read, self._write):
            with contextlib.suppress(OSError):
                os.close(fd)
