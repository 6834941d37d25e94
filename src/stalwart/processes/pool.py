"""A fixed pool of job threads. The worker's main thread hands it jobs and collects outcomes."""

import threading
from collections import deque
from collections.abc import Callable

from django.db import connections

from stalwart import events
from stalwart.db import ClaimedJob
from stalwart.processes.runner import Finished


class JobPool:
    """``size`` daemon threads, each running one job at a time.

    ``idle`` is how many more jobs it can take now; finished attempts wait in ``take_finished``
    for the main thread to write them. ``on_finished`` is called from the job thread.
    """

    def __init__(
        self,
        size: int,
        run: Callable[[ClaimedJob], Finished],
        on_finished: Callable[[], None],
        name: str = "stalwart-job",
        crashed: Callable[[ClaimedJob, BaseException], Finished] | None = None,
    ) -> None:
        self._crashed = crashed
        self.size = size
        self._run = run
        self._on_finished = on_finished
        self._name = name
        self._lock = threading.Lock()
        self._busy = 0
        self._inbox: deque[ClaimedJob | None] = deque()
        self._ready = threading.Semaphore(0)
        self._finished: deque[Finished] = deque()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for number in range(self.size):
            thread = threading.Thread(
                target=self._serve, name=f"{self._name}-{number}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    @property
    def busy(self) -> int:
        return self._busy

    @property
    def idle(self) -> int:
        return self.size - self._busy

    def submit(self, job: ClaimedJob) -> None:
        with self._lock:
            if self._busy >= self.size:
                raise RuntimeError("JobPool.submit() called with no idle thread")
            self._busy += 1
        self._inbox.append(job)
        self._ready.release()

    @property
    def finished(self) -> int:
        """How many finished attempts wait to be taken."""
        return len(self._finished)

    def take_finished(self) -> list[Finished]:
        taken = []
        while self._finished:
            taken.append(self._finished.popleft())
        return taken

    def stop(self, *, wait: bool) -> None:
        """Tell every thread to exit after its current job; optionally wait for them."""
        for _ in self._threads:
            self._inbox.append(None)
            self._ready.release()
        if wait:
            for thread in self._threads:
                thread.join()

    def _serve(self) -> None:
        while True:
            self._ready.acquire()
            job = self._inbox.popleft()
            if job is None:
                connections.close_all()  # this thread's connections, not anyone else's
                return
            try:
                self._finished.append(self._run(job))
            except BaseException as error:  # noqa: BLE001 - the thread must survive to count down
                events.emit("job_runner_crashed", job=job.id, error=repr(error))
                if self._crashed is not None:
                    # Still an outcome: the job must not stay held for ever.
                    self._finished.append(self._crashed(job, error))
            with self._lock:
                self._busy -= 1
            self._on_finished()
