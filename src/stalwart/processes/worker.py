"""The worker: claims jobs for its idle threads, runs them, writes their outcomes in batches.

The main thread alone talks to the job table (claim, finish, release) on its own connection;
job threads only run tasks. So a task that breaks its own connection cannot break the
bookkeeping, and outcomes that finish together are written in one statement.
"""

import contextlib
import time
from typing import Any

from django.db import DatabaseError, connections
from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished

from stalwart import events
from stalwart.conf import Options, WorkerOptions
from stalwart.control import paused_queues
from stalwart.db import ClaimedJob
from stalwart.db.errors import is_transient
from stalwart.exceptions import JobTimedOut, OutcomeNotStored
from stalwart.jobs import JobStore
from stalwart.models import JobStatus
from stalwart.processes.base import EXIT_CRASHED, EXIT_RECYCLE, Role
from stalwart.processes.chores import Chores
from stalwart.processes.listener import Listener
from stalwart.processes.pool import JobPool
from stalwart.processes.runner import (
    Finished,
    crashed_attempt,
    error_for,
    failure_outcome,
    run_job,
)
from stalwart.resolution import resolve_task

PROMOTE_INTERVAL = 1.0  # seconds between due-job promotions when the worker does them itself
MEMORY_CHECK_INTERVAL = 1.0  # seconds between looks at the resident memory
# After a job finishes, how long the main loop waits for the jobs still running to finish
# too, so that their outcomes share one write and their threads one claim.
GATHER_WINDOW = 0.002


def task_timeout(task_path: str) -> float | None:
    """The timeout of the task at ``task_path`` (None: none, or not a task we can resolve)."""
    try:
        return getattr(resolve_task(task_path), "timeout", None)
    except Exception:  # noqa: BLE001 - the runner reports unresolvable tasks
        return None


class Worker(Role):
    kind = "worker"

    def __init__(
        self,
        *,
        config: Options,
        worker: WorkerOptions,
        promote_scheduled: bool = False,
        do_chores: bool = False,
        stop_when_empty: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(config=config, **kwargs)
        self.worker = worker
        self.selector = worker.queues
        self.store = JobStore(self.database, notify=config.listen_notify)
        # Without a supervisor and dispatcher, a worker does their chores itself.
        self.promote_scheduled = promote_scheduled
        self.chores = Chores(config, holder=self.name) if do_chores else None
        self.stop_when_empty = stop_when_empty
        self.pool = JobPool(worker.threads, self._run_job, self.waker.wake, crashed=crashed_attempt)
        self.held: dict[Any, ClaimedJob] = {}  # claimed by us and not yet written
        self.jobs_done = 0
        self.abandoned_threads = False
        self._listener: Listener | None = None
        self._unwritten: list[Finished] = []
        self._next_promotion = 0.0
        self._paused: list[str] = []
        self._next_reconcile = 0.0
        self._next_memory_check = 0.0
        self._next_pause_check = 0.0
        self.deadlines: dict[Any, tuple[float, float]] = {}  # job id -> (deadline, timeout)
        self.timed_out: dict[Any, float] = {}  # job id -> its timeout
        from stalwart.backend import StalwartBackend

        self._sender = StalwartBackend

    # -- reporting ---------------------------------------------------------------------------

    def metadata(self) -> dict[str, Any]:
        return {
            **super().metadata(),
            "queues": str(self.selector),
            "threads": self.worker.threads,
            "busy": self.pool.busy,
            "jobs_done": self.jobs_done,
            # The paused queues this worker would otherwise claim from.
            "paused": [name for name in self._paused if self.selector.serves(name)],
        }

    def _show_state(self) -> None:
        busy = self.pool.busy
        state = "idle" if not busy else f"{busy} of {self.pool.size} busy"
        if self.stop_requested:
            state = f"stopping, {state}"
        self.set_title(f"[{self.selector}] {state}")

    # -- the loop ----------------------------------------------------------------------------

    def poll_interval(self) -> float:
        if self.worker.poll_interval is not None:
            return self.worker.poll_interval
        return 1.0 if self._listener is not None else 0.2

    def main(self) -> None:
        if self.config.listen_notify and connections[self.database].vendor == "postgresql":
            self._listener = Listener(self.database, self.selector.serves, self.waker.wake)
            self._listener.start()
        self.pool.start()
        poll = self.poll_interval()
        try:
            while not self.stop_requested:
                try:
                    more = self._tick()
                except DatabaseError as error:
                    if not is_transient(error):
                        raise
                    # The database is away: keep the outcomes, keep trying. If it stays away
                    # past the alive threshold, the heartbeat fences this process.
                    events.emit("database_unavailable", process=self.name, error=str(error))
                    more = False
                if more is None:
                    break
                if not more:
                    self.waker.wait(poll)
                    self._gather()
        except BaseException:
            self.exit_status = EXIT_CRASHED
            self.immediate = True  # no drain: give back what we hold and go
            raise
        finally:
            self.shutdown()

    def _tick(self) -> bool | None:
        """One round: chores, then write outcomes and claim (in one statement where the
        database allows). True: go again at once; None: stop."""
        now = time.monotonic()
        if self.promote_scheduled and now >= self._next_promotion:
            self.store.promote_due()
            if self.chores is None:
                self.store.unblock_all()  # no dispatcher sweeps for us
            self._next_promotion = now + PROMOTE_INTERVAL
        if now >= self._next_reconcile:
            self._next_reconcile = now + self.config.heartbeat_interval
            self._reconcile()
        if self.chores is not None:
            self.chores.run_due(exclude=self.registration.id)
        if self._recycle_due() or self._check_timeouts():
            self.flush()
            self.exit_status = EXIT_RECYCLE
            self.request_stop()
            return None
        if now >= self._next_pause_check:
            self._paused = paused_queues(database=self.database)
            self._next_pause_check = now + self.poll_interval()
        idle = self.pool.idle
        claimed = self.flush(claim=idle)
        if idle:
            if claimed:
                events.emit("jobs_claimed", process=self.name, count=len(claimed))
            started = time.monotonic()
            for job in claimed:
                self.held[job.id] = job
                timeout = task_timeout(job.task_path)
                if timeout is not None:
                    self.deadlines[job.id] = (started + timeout, timeout)
                self.pool.submit(job)
        self._show_state()
        if self.stop_when_empty and not claimed and not self.held and self._drained():
            return None
        # A full claim means the pool is busy: the next wake-up is a job finishing.
        return bool(claimed) and len(claimed) == idle and self.pool.idle > 0

    def _gather(self) -> None:
        """Give the jobs still running up to ``GATHER_WINDOW`` to finish after one has.

        Jobs claimed together often finish together; writing each outcome as it comes would
        cost a round trip per outcome, and a claim per freed thread. We wait only with
        outcomes to write and jobs still running, never past the window, and never once a
        stop is requested; so a slow job holds back the outcome of a quick one, and a
        notification the claim it calls for, by 2 ms at most.
        """
        deadline = time.monotonic() + GATHER_WINDOW
        while self.pool.finished and self.pool.busy and not self.stop_requested:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            self.waker.wait(remaining)

    def _drained(self) -> bool:
        from stalwart.models import Job

        pending = Job.objects.using(self.database).filter(
            status__in=[JobStatus.READY, JobStatus.SCHEDULED, JobStatus.BLOCKED]
        )
        return not any(
            self.selector.serves(name) and name not in self._paused
            for name in pending.values_list("queue_name", flat=True).distinct()
        )

    def _reconcile(self) -> None:
        """Give back running jobs the database says are ours but we do not hold.

        A claim can commit while its answer is lost (a dropped connection, a retry after a
        timeout); without this such jobs would stay running for as long as we live.
        """
        unknown = [
            (job_id, attempt)
            for job_id, attempt in self.store.owned_running(owner=self.registration.id)
            if job_id not in self.held
        ]
        if unknown:
            released = self.store.release(owner=self.registration.id, jobs=unknown)
            events.emit("jobs_reconciled", process=self.name, count=len(released))

    def _check_timeouts(self) -> bool:
        """Note attempts past their timeout; True if this process must now be replaced."""
        now = time.monotonic()
        for job_id, (deadline, timeout) in self.deadlines.items():
            if now > deadline and job_id in self.held and job_id not in self.timed_out:
                self.timed_out[job_id] = timeout
                job = self.held[job_id]
                events.emit(
                    "job_timed_out",
                    job=job_id,
                    task=job.task_path,
                    timeout=timeout,
                    process=self.name,
                )
        return bool(self.timed_out)

    def _recycle_due(self) -> bool:
        """Past the job-count or memory limit: finish what runs, then be replaced."""
        if self.worker.max_jobs is not None and self.jobs_done >= self.worker.max_jobs:
            events.emit(
                "worker_recycling", process=self.name, reason="max_jobs", jobs_done=self.jobs_done
            )
            return True
        limit = self.worker.max_memory_mb
        now = time.monotonic()
        if limit is None or now < self._next_memory_check:
            return False
        self._next_memory_check = now + MEMORY_CHECK_INTERVAL
        rss_mb = self.resident_memory() / 1024 / 1024
        if rss_mb > limit:
            events.emit(
                "worker_recycling",
                process=self.name,
                reason="max_memory_mb",
                rss_mb=round(rss_mb),
                limit_mb=limit,
            )
            return True
        return False

    def _run_job(self, job: ClaimedJob) -> Finished:
        events.emit("job_started", job=job.id, task=job.task_path, attempt=job.attempt)
        return run_job(job, self._sender)

    # -- outcomes ----------------------------------------------------------------------------

    def flush(self, *, claim: int = 0) -> list[ClaimedJob]:
        """Write every finished attempt we still own, in one statement, then report them;
        with ``claim``, also claim up to that many jobs (together, where the database can)."""
        finished = self._unwritten + self.pool.take_finished()
        claimed: list[ClaimedJob] = []
        if not finished:
            if claim:
                claimed = self._claim(claim)
            return claimed
        self._unwritten = finished  # kept until written, should the write fail
        combined = (
            claim
            and self.store.can_finish_and_claim(self.selector)
            and not any(item.job.concurrency_key for item in finished)
        )
        try:
            if combined:
                written, claimed = self.store.finish_and_claim(
                    owner=self.registration.id,
                    outcomes=[item.outcome for item in finished],
                    worker_name=self.name,
                    selector=self.selector,
                    limit=claim,
                    paused=self._paused,
                )
            else:
                written = self._write(finished)
        except DatabaseError as error:
            if is_transient(error):
                raise  # kept in _unwritten: the next flush tries again
            written = self._write_one_by_one(finished)
            combined = False
        self._unwritten = []
        for item in finished:
            self.held.pop(item.job.id, None)
            self.deadlines.pop(item.job.id, None)
            self.timed_out.pop(item.job.id, None)  # it finished after all: that result stands
            self.jobs_done += 1
            if item.job.id not in written:
                events.emit(
                    "job_result_discarded",
                    job=item.job.id,
                    task=item.job.task_path,
                    attempt=item.job.attempt,
                    reason="the job is no longer ours (released or taken over)",
                )
                continue
            self._report(item, written[item.job.id])
        if claim and not combined:
            claimed = self._claim(claim)  # after the report: written outcomes are settled
        return claimed

    def _claim(self, limit: int) -> list[ClaimedJob]:
        return self.store.claim(
            owner=self.registration.id,
            worker_name=self.name,
            selector=self.selector,
            limit=limit,
            paused=self._paused,
        )

    def _write(self, finished: list[Finished]) -> dict:
        return self.store.finish(
            owner=self.registration.id,
            outcomes=[item.outcome for item in finished],
            free_keys=[
                item.job.concurrency_key
                for item in finished
                if item.job.concurrency_key is not None
            ],
        )

    def _write_one_by_one(self, finished: list[Finished]) -> dict:
        """The batch was refused: write each outcome alone; one the database will not take
        becomes a failure that says why, so a bad outcome never blocks the others."""
        written: dict = {}
        for index, item in enumerate(finished):
            try:
                written.update(self._write([item]))
            except DatabaseError as error:
                if is_transient(error):
                    raise
                events.emit(
                    "outcome_not_stored",
                    job=item.job.id,
                    task=item.job.task_path,
                    error=f"{type(error).__name__}: {error}",
                )
                replacement = crashed_attempt(item.job, OutcomeNotStored(str(error)))
                finished[index] = replacement
                written.update(self._write([replacement]))
        return written

    def _report(self, item: Finished, finished_at: Any) -> None:
        outcome, result = item.outcome, item.result
        fields = {
            "job": item.job.id,
            "task": item.job.task_path,
            "attempt": item.job.attempt,
            "duration": item.duration,
        }
        if outcome.status == JobStatus.SUCCESSFUL:
            events.emit("job_succeeded", **fields)
        elif outcome.status == JobStatus.SCHEDULED:
            events.emit(
                "job_retry_scheduled",
                **fields,
                error=item.error.exception_class_path if item.error else None,
                retry_in=item.retry_in,
            )
        else:
            events.emit(
                "job_failed",
                **fields,
                error=item.error.exception_class_path if item.error else None,
                traceback=item.error.traceback if item.error else None,
            )
        if result is None:
            return
        status = JobStatus(outcome.status).task_result_status
        object.__setattr__(result, "status", status)
        if item.error is not None:
            result.errors.append(item.error)
        if outcome.status == JobStatus.SCHEDULED:
            return  # not finished: another attempt is coming
        object.__setattr__(result, "finished_at", finished_at)
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", item.return_value)
        task_finished.send(sender=self._sender, task_result=result)

    def _write_timeouts(self) -> None:
        """Fail (or retry) the attempts that ran past their timeout: last, just before exit."""
        stuck = [self.held[job_id] for job_id in self.timed_out if job_id in self.held]
        if not stuck:
            return
        self.abandoned_threads = True  # their threads die with this process, right after this
        finished = []
        for job in stuck:
            exception = JobTimedOut(self.timed_out[job.id], self.name)
            error = error_for(exception)
            task = None
            with contextlib.suppress(Exception):
                task = resolve_task(job.task_path)
            outcome, retry_in = failure_outcome(job, task, exception, error)
            finished.append(
                Finished(
                    job=job,
                    outcome=outcome,
                    result=None,
                    duration=0.0,
                    error=error,
                    retry_in=retry_in,
                )
            )
        self._unwritten.extend(finished)
        self.flush()

    # -- stopping ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Let running jobs finish within the shutdown timeout (jobs past their own timeout
        will not: their threads are stuck). What is still held is given back by
        ``final_release``, the last thing the process does before it ends."""
        events.emit(
            "process_stopping", process=self.name, running=self.pool.busy, immediate=self.immediate
        )
        deadline = time.monotonic() + self.config.shutdown_timeout
        while not self.immediate and self.fenced_reason is None:
            self._flush_at_stop()
            # Held and not yet written (just flushed): queued or running in a thread.
            still_running = set(self.held) - set(self.timed_out)
            remaining = deadline - time.monotonic()
            if not still_running or remaining <= 0:
                break
            self._show_state()
            self.waker.wait(min(remaining, 1.0))
        if self.fenced_reason is None:
            self._flush_at_stop()
        if self._listener is not None:
            self._listener.stop()
            self._listener.join(2.0)
        if self.pool.busy:
            # These threads are still running: the process must end right after it gives
            # their jobs back (os._exit), so they never run here and elsewhere at once.
            self.abandoned_threads = True
        self.pool.stop(wait=False)

    def _flush_at_stop(self) -> None:
        try:
            self.flush()
        except Exception as error:  # noqa: BLE001 - kept in _unwritten; the release follows
            events.emit(
                "finish_failed", process=self.name, error=f"{type(error).__name__}: {error}"
            )

    def final_release(self) -> None:
        """Write the timed-out attempts and give back what is still held: among the very last
        writes before the process ends (only the deregistration follows)."""
        if self.fenced_reason is not None or not self.held:
            return
        try:
            self._write_timeouts()
        except Exception as error:  # noqa: BLE001 - what is not written is released below
            events.emit(
                "finish_failed", process=self.name, error=f"{type(error).__name__}: {error}"
            )
        leftover = [(job.id, job.attempt) for job in self.held.values()]
        if not leftover:
            return
        try:
            released = self.store.release(owner=self.registration.id, jobs=leftover)
        except Exception as error:  # noqa: BLE001 - the orphan sweep takes them back later
            events.emit(
                "release_failed",
                process=self.name,
                count=len(leftover),
                error=f"{type(error).__name__}: {error}",
            )
            return
        if released:
            events.emit(
                "jobs_released",
                process=self.name,
                count=len(released),
                reason="immediate stop" if self.immediate else "shutdown timeout",
            )
        self.held.clear()
