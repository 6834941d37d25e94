"""A fixed pool of job threads. The worker's main thread hands it jobs and collects outcomes."""

import threading
from collections import deque
from collections.abc import Callable

from django.db import connections

from stalwart import events
from stalwart.db import ClaimedJob
from stalwart.processes import job_connections
from stalwart.processes.job_connections import Suspicion
from stalwart.processes.runner import Finished


class JobPool:
    """``size`` daemon threads, each running one job at a time.

    ``idle`` is how many more jobs it can take now; finished attempts wait in ``take_finished``
    for the main thread to write them. ``on_finished`` is called from the job thread. A job
    handed over but not yet started can be taken back (``withdraw_unstarted``): once a thread
    has it, it is running, and only the end of the process stops it.
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
        self._lock = threading.Condition()
        self._busy = 0  # handed over and not finished: queued in the inbox, or running
        self._inbox: deque[ClaimedJob | None] = deque()
        self._finished: deque[Finished] = deque()
        self._threads: list[threading.Thread] = []
        # Set off when the database failed: each thread checks its connections before its
        # next job (see ``job_connections``).
        self.suspicion = Suspicion()

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
        self.submit_all([job])

    def submit_all(self, jobs: list[ClaimedJob]) -> None:
        """Hand over jobs claimed together: one lock, one notify for them all."""
        with self._lock:
            if self._busy + len(jobs) > self.size:
                raise RuntimeError("JobPool.submit_all() called with too few idle threads")
            self._busy += len(jobs)
            self._inbox.extend(jobs)
            self._lock.notify(len(jobs))

    def withdraw_unstarted(self) -> list[ClaimedJob]:
        """Take back the jobs no thread has started: they will not run here."""
        with self._lock:
            unstarted = [job for job in self._inbox if job is not None]
            self._inbox = deque(job for job in self._inbox if job is None)
            self._busy -= len(unstarted)
            return unstarted

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
        with self._lock:
            self._inbox.extend([None] * len(self._threads))
            self._lock.notify_all()
        if wait:
            for thread in self._threads:
                thread.join()

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._inbox:
                    self._lock.wait()
                job = self._inbox.popleft()
            if job is None:
                connections.close_all()  # this thread's connections, not anyone else's
                return
            try:
                job_connections.before_job(check=self.suspicion.check_now())
                finished = self._run(job)
                if finished.interruption is not None:
                    self.suspicion.suspect()  # its connection died: others' may have too
                self._finished.append(finished)
            except BaseException as error:  # noqa: BLE001 - the thread must survive to count down
                events.emit("job_runner_crashed", job=job.id, error=repr(error))
                if self._crashed is not None:
                    # Still an outcome: the job must not stay held for ever.
                    self._finished.append(self._crashed(job, error))
            with self._lock:
                self._busy -= 1
            self._on_finished()
