"""The worker: claims jobs for its idle threads, runs them, writes their outcomes in batches.

The main thread alone talks to the job table (claim, finish, release) on its own connection;
job threads only run tasks. So a task that breaks its own connection cannot break the
bookkeeping, and outcomes that finish together are written in one statement
(``stalwart.processes.outcomes``).

A job the database marks ``isolated`` (it was running when a process died) runs alone: it is
claimed only when nothing else runs here, and nothing else is claimed while it runs. A
worker that knows one is waiting stops claiming others until it runs nothing, then takes
it first; so isolated jobs never starve, and never block a queue either.

A job whose body may still be running is never given back by this process: at a stop, only
jobs no thread runs are released; the others stay ours until the process has ended, when
the supervisor that reaps it (or a prune) gives them back.
"""

import contextlib
import threading
import time
from dataclasses import replace
from typing import Any

from django.db import connections

from stalwart import catalog, events
from stalwart.conf import Options, WorkerOptions
from stalwart.control import paused_queues
from stalwart.db import ClaimedJob
from stalwart.db.wakeups import read_payload
from stalwart.exceptions import JobTimedOut
from stalwart.jobs import JobStore
from stalwart.models import JobStatus
from stalwart.processes.base import EXIT_CRASHED, EXIT_RECYCLE, FAILED, Role
from stalwart.processes.chores import Chores
from stalwart.processes.listener import Listener
from stalwart.processes.outcomes import ClaimRequest, OutcomeWriter
from stalwart.processes.pool import JobPool
from stalwart.processes.reporter import Reporter
from stalwart.processes.runner import (
    Finished,
    crashed_attempt,
    error_for,
    failure_outcome,
    not_run,
    run_job,
)
from stalwart.processes.verdicts import suspected
from stalwart.resolution import resolve_task

PROMOTE_INTERVAL = 1.0  # seconds between due-job promotions when the worker does them itself
MEMORY_CHECK_INTERVAL = 1.0  # seconds between looks at the resident memory
# Seconds between reads of the paused queues (and of isolated jobs waiting), while claiming.
PAUSE_CHECK_INTERVAL = 1.0
# Idle, with LISTEN/NOTIFY heard: a notification wakes the worker (a resume notifies too,
# and one for a queue it thinks paused has it read its pauses again at once), and it looks
# anyway this often (default poll_interval). Without it: SHORT_POLL (or LISTENER_DOWN_POLL
# while the listener reconnects).
NOTIFIED_POLL = 30.0
LISTENER_DOWN_POLL = 1.0
LISTEN_WARM_UP = 10.0  # seconds of LISTENER_DOWN_POLL after the listener starts listening
SHORT_POLL = 0.2
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
        # Per held job: set when someone asks it to stop (read by the task's context). Made
        # only when needed: by the ask, or by the job's thread for a task that takes context.
        self.cancellations: dict[Any, threading.Event] = {}
        # Claimed jobs someone had asked to cancel before: written, never run.
        self._not_run: list[Finished] = []
        self.jobs_done = 0
        self._claiming = False  # a claim under way (see holds_running_work)
        self._listener: Listener | None = None
        self._next_promotion = 0.0
        self._paused: list[str] = []
        self._isolated_waiting = False
        self._next_reconcile = 0.0
        self._next_memory_check = 0.0
        self._next_pause_check = 0.0
        # Set by the listener's thread when it hears a resume of a queue we serve: the
        # next round reads the pauses again (what we read, or are reading, may be older).
        self._pauses_stale = False
        # Whether the next round claims: woken (a notification, a job finished, a signal),
        # or the poll is due. A round that only keeps time (reconcile, timeouts, memory,
        # chores) asks the database nothing else.
        self._look = True
        self._next_poll = 0.0
        # Some dependants were released by the last flush: the next round claims at once.
        self._released_dependants = False
        # Why memory made us recycle, and the jobs that ran then (see _recycle_due).
        self._memory_suspects: tuple[str, list[Any]] | None = None
        self.deadlines: dict[Any, tuple[float, float]] = {}  # job id -> (deadline, timeout)
        self.timed_out: dict[Any, float] = {}  # job id -> its timeout
        from stalwart.backend import StalwartBackend

        self._sender = StalwartBackend
        # Django's task_finished receivers run there, never on the loop that proves us alive.
        self.reporter = Reporter(process=self.name)
        # How often our loop found the database failing, and that count when each job we
        # hold was claimed: a job that lost its connection meanwhile was interrupted by it.
        self._outages = 0
        self._outages_at_claim: dict[Any, int] = {}
        self.outcomes = OutcomeWriter(
            self.store,
            process=self.name,
            sender=StalwartBackend,
            deliver=self.reporter.submit,
            outage_seen=lambda item: self._outages > self._outages_at_claim.get(item.job.id, 0),
        )

    def prepare(self) -> None:
        # The project's task modules, imported before the process registers: an import that
        # takes long (or hangs) holds up the start, never a heartbeat.
        catalog.load()

    @property
    def abandoned_threads(self) -> bool:
        """Job threads are still running: the process must end at once (``os._exit``), so
        that they never run here and elsewhere at once, nor write anything more."""
        return self.pool.busy > 0

    def holds_running_work(self) -> bool:
        # Bodies running or handed to a thread, or a claim under way (see base.py).
        return self._claiming or self.pool.busy > 0

    def abandons_jobs(self) -> bool:
        # Threads still running, or jobs it could not give back: either way its row stays
        # (marked leaving), so that they go back uncharged once it is surely gone.
        return self.abandoned_threads or bool(self.held)

    # -- reporting ---------------------------------------------------------------------------

    def running_tasks(self) -> list[str]:
        return [job.task_path for job in list(self.held.values())]

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
        if self._listener is None:
            return SHORT_POLL
        if (
            not self._listener.listening
            # Just (re)started listening: a wake-up can still go missing around the start
            # (seen once in several runs, cause not found), so poll often for a while.
            or time.monotonic() - self._listener.listening_since < LISTEN_WARM_UP
            or self.outcomes.unwritten  # waiting on another transaction: tried again soon
        ):
            return LISTENER_DOWN_POLL
        return NOTIFIED_POLL

    def _heard(self, payload: str) -> bool:
        """Whether a notification should wake us (the listener's thread asks). A resume of
        a queue we serve makes us read the pauses again before we claim (we may have read
        them, or be reading them, from before it); a new job in a queue we know is paused
        is none of ours until its resume."""
        queue_name, resumed = read_payload(payload)
        if not self.selector.serves(queue_name):
            return False
        if resumed:
            self._pauses_stale = True
            return True
        return queue_name not in self._paused

    def _read_pauses(self) -> None:
        """Read the paused queues (those a resume heard from now on is read again)."""
        self._pauses_stale = False  # before the read: a resume heard during it counts
        self._paused = paused_queues(database=self.database)

    def _wait_time(self) -> float:
        """Seconds until the loop has something to do unasked: poll, reconcile, promote,
        a job's timeout, a look at the memory."""
        now = time.monotonic()
        moments = [self._next_poll, self._next_reconcile]
        if self.promote_scheduled:
            moments.append(self._next_promotion)
        if self.worker.max_memory_mb is not None:
            moments.append(self._next_memory_check)
        moments.extend(
            deadline
            for job_id, (deadline, _) in self.deadlines.items()
            if job_id not in self.timed_out
        )
        # A hair past a deadline, so that the round that follows finds it passed.
        return max(min(moments) - now + 0.001, 0.0)

    def main(self) -> None:
        if self.config.listen_notify and connections[self.database].vendor == "postgresql":
            listen_on = self.config.listen_database  # a direct connection, past a pooler
            self._listener = Listener(
                listen_on or self.database,
                self._heard,
                self.waker.wake,
                session=lambda: self.open_session("listener", database=listen_on),
                process=self.name,
            )
            self._listener.start()
        self.pool.start()
        self.reporter.start()
        try:
            while not self.stop_requested:
                # The database away: outcomes wait, the loop backs off and carries on.
                more = self.step(self._tick)
                if more is None:
                    break
                if more is FAILED:
                    # The backoff may have swallowed a wake-up (a notification, a finished
                    # job): the next round looks, whatever failed in this one.
                    self._look = True
                    # And the job threads' connections may have died with ours.
                    self._outages += 1
                    self.pool.suspicion.suspect()
                elif not more:
                    woken = self.pause(self._wait_time())
                    self._gather()
                    self._look = woken or time.monotonic() >= self._next_poll
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
            # Idle, it claims nothing, but says in its heartbeat which pauses it honours.
            self._read_pauses()
        if self.chores is not None:
            self.chores.run_due(exclude=self.registration.id, outage=self.outage)
        self.reporter.check()
        if self._recycle_due() or self._check_timeouts():
            self.flush()
            self.exit_status = EXIT_RECYCLE
            self.request_stop()
            return None
        if not (self._look or self.pool.finished or self._not_run or self.outcomes.unwritten):
            return False  # a round that keeps time: nothing to claim for, nothing to write
        self._look = True  # until this round has claimed: a failed one looks again
        if now >= self._next_pause_check or self._pauses_stale:
            self._read_pauses()
            self._isolated_waiting = self.store.isolated_waiting(
                selector=self.selector, paused=self._paused
            )
            self._next_pause_check = now + PAUSE_CHECK_INTERVAL
        with self.claim_gate:
            idle = 0 if self.suspended else self.pool.idle  # overdue heartbeats: claim nothing
            self._claiming = idle > 0
        alone = self.pool.busy == 0
        if not alone and (self._isolated_waiting or self._running_isolated()):
            idle = 0  # an isolated job runs alone: none beside it, and none beside one waiting
        if self.worker.max_jobs is not None:
            # Jobs run, and jobs held (running, or finished and about to be written), count
            # against max_jobs: a worker never claims past it, whatever its threads.
            idle = max(0, min(idle, self.worker.max_jobs - self.jobs_done - len(self.held)))
        try:
            claimed = self.flush(claim=idle, isolated_first=alone and self._isolated_waiting)
        finally:
            self._claiming = False  # what it claimed now counts in the pool
        if alone and self._isolated_waiting and not any(job.isolated for job in claimed):
            self._isolated_waiting = False  # none was left for us: back to ordinary claims
        self._next_poll = now + self.poll_interval()
        self._show_state()
        if self.stop_when_empty and not claimed and not self.held and self._drained():
            return None
        # A full claim means the pool is busy: the next wake-up is a job finishing.
        released, self._released_dependants = self._released_dependants, False
        return released or (bool(claimed) and len(claimed) == idle and self.pool.idle > 0)

    def _running_isolated(self) -> bool:
        return any(job.isolated for job in self.held.values())

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
            self.pause(remaining)

    def _drained(self) -> bool:
        # One index descent per queue with waiting jobs, not a scan of the waiting jobs.
        return not any(
            self.selector.serves(name) and name not in self._paused
            for name in self.store.waiting_queues()
        )

    def _reconcile(self) -> None:
        """Give back running jobs the database says are ours but we do not hold, and tell
        the tasks of those someone asked to cancel.

        A claim can commit while its answer is lost (a dropped connection, a retry after a
        timeout); without this such jobs would stay running for as long as we live. The same
        statement, once a heartbeat interval, carries the cancel requests: no query per job.
        """
        owned = self.store.owned_running(owner=self.registration.registered_id)
        unknown = [(job_id, attempt) for job_id, attempt, _ in owned if job_id not in self.held]
        for job_id, _, requested in owned:
            job = self.held.get(job_id)
            if not requested or job is None or job.cancel_requested_at is not None:
                continue  # not asked, not ours, or never run (asked before it was claimed)
            # setdefault: the job's thread may be making the flag for its task's context.
            cancellation = self.cancellations.setdefault(job_id, threading.Event())
            if not cancellation.is_set():
                # The same look tells the running task that someone wants it to stop.
                cancellation.set()
                events.emit(
                    "job_cancel_requested",
                    job=job_id,
                    task=job.task_path,
                    process=self.name,
                )
        if unknown:
            released = self.store.release(
                owner=self.registration.registered_id,
                jobs=unknown,
                cause="its claim committed but the answer was lost; given back unstarted",
                process=self.name,
            )
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
            # Should the process end with some of these still running, they are the
            # suspects: the memory may be theirs.
            self._memory_suspects = (
                f"its memory ({round(rss_mb)} MB) went over max_memory_mb ({limit})",
                [job.id for job in self.held.values()],
            )
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
        return run_job(
            job,
            self._sender,
            self.cancellations,
            task_not_found_grace=self.config.task_not_found_grace,
        )

    # -- outcomes ----------------------------------------------------------------------------

    def flush(
        self,
        *,
        claim: int = 0,
        isolated_first: bool = False,
        extra: list[Finished] | None = None,
    ) -> list[ClaimedJob]:
        """Write every finished attempt we still own, then report them; with ``claim``, also
        claim up to that many jobs (together, where the database can), and start them;
        with ``isolated_first``, an isolated job first, if there is one, and it alone."""
        request = None
        if claim:
            request = ClaimRequest(
                limit=claim,
                worker_name=self.name,
                selector=self.selector,
                paused=self._paused,
                isolated_first=isolated_first,
            )
        claimed: list[ClaimedJob] = []

        def hold(jobs: list[ClaimedJob]) -> None:
            claimed.extend(jobs)
            self._hold(jobs)

        finished = self.pool.take_finished() + self._not_run
        self._not_run = []
        for item in finished:
            # Ended: however long its outcome waits to be written, it is not timing out.
            self.deadlines.pop(item.job.id, None)
        settled = self.outcomes.flush(
            self.registration.registered_id, (extra or []) + finished, claim=request, hold=hold
        )
        for item in settled:
            if self.held.get(item.job.id) is not item.job:
                # Given back, and claimed again by this same flush: the id is now a new
                # attempt's, which runs.
                continue
            self.held.pop(item.job.id, None)
            self._outages_at_claim.pop(item.job.id, None)
            self.cancellations.pop(item.job.id, None)
            self.deadlines.pop(item.job.id, None)
            self.timed_out.pop(item.job.id, None)  # it finished after all: that result stands
            self.jobs_done += 1
        self._release_dependants(settled)
        return claimed

    def _release_dependants(self, settled: list[Finished]) -> None:
        """Release (or cancel) the pending dependants of the jobs just finished that had
        some when claimed, so that a chain's next link is claimed at once (the dispatcher's
        look would take up to its polling_interval). A failure here is left to the
        dispatcher, which resolves what no worker did."""
        from django.db import DatabaseError

        from stalwart.models.job import FINISHED_STATES

        parents = [
            item.job.id
            for item in settled
            if item.job.has_dependants
            and item.interruption is None
            and item.deferred is None
            and item.outcome.status in FINISHED_STATES
        ]
        if not parents:
            return
        try:
            released, _ = self.store.release_dependants_of(parents)
        except DatabaseError as error:
            events.emit(
                "dependants_not_released",
                process=self.name,
                error=f"{type(error).__name__}: {error}",
            )
            return
        if released:
            self._released_dependants = True  # some may be ours to claim: look at once

    def _hold(self, jobs: list[ClaimedJob]) -> None:
        """Jobs a claim just gave us: ours from this moment, and started at once."""
        if not jobs:
            return
        events.emit("jobs_claimed", process=self.name, count=len(jobs))
        started = time.monotonic()
        runnable = []
        for job in jobs:
            self.held[job.id] = job
            self._outages_at_claim[job.id] = self._outages
            if job.cancel_requested_at is not None:
                # Asked to stop during an earlier attempt: it never starts another.
                self._not_run.append(not_run(job))
                continue
            runnable.append(job)
            timeout = task_timeout(job.task_path)
            if timeout is not None:
                self.deadlines[job.id] = (started + timeout, timeout)
        self.pool.submit_all(runnable)

    def _write_timeouts(self) -> None:
        """Fail (or retry) the attempts that ran past their timeout: last, just before exit.

        Their threads still run, so a retry keeps us as its owner: it is not made ready
        until our row is gone, which is after this process has ended."""
        stuck = [self.held[job_id] for job_id in self.timed_out if job_id in self.held]
        if not stuck:
            return
        finished = []
        for job in stuck:
            exception = JobTimedOut(self.timed_out[job.id], self.name)
            error = error_for(exception)
            task = None
            with contextlib.suppress(Exception):
                task = resolve_task(job.task_path)
            outcome, retry_in = failure_outcome(job, task, exception, error)
            if outcome.status != JobStatus.FAILED:
                outcome = replace(outcome, keep_owner=True)
            finished.append(
                Finished(
                    job=job,
                    outcome=outcome,
                    result=None,
                    duration=0.0,
                    error=error,
                    retry_in=retry_in,
                    timed_out=True,
                )
            )
        self.flush(extra=finished)

    # -- stopping ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Let running jobs finish within the shutdown timeout (jobs past their own timeout
        will not: their threads are stuck). What is held and not running is given back by
        ``final_release``; what still runs then is given back once the process has ended."""
        events.emit(
            "process_stopping", process=self.name, running=self.pool.busy, immediate=self.immediate
        )
        if self.pool.busy:
            jobs = "job" if self.pool.busy == 1 else "jobs"
            self.announce_stop(
                f"waiting up to {self.config.shutdown_timeout:g} s for {self.pool.busy} "
                f"running {jobs} to finish"
            )
        deadline = time.monotonic() + self.config.shutdown_timeout
        while not self.immediate:
            self._flush_at_stop()
            # Held, and not past its timeout: queued or running in a thread, or finished
            # with its outcome still to be written (waiting on an application's lock, or
            # on the database): within the timeout, it is written, never run again.
            waiting = set(self.held) - set(self.timed_out)
            remaining = deadline - time.monotonic()
            if not waiting or remaining <= 0:
                break
            self._show_state()
            # A finished body's outcome is tried again every half second; otherwise the
            # loop wakes when a job finishes.
            self.pause(min(remaining, 0.5 if self.outcomes.unwritten else 1.0))
        # Fenced or not, what finished is written: a write is fenced on owner and attempt,
        # so it goes through exactly when nobody has taken the job (never run again for
        # bookkeeping's sake).
        self._flush_at_stop()
        self._name_suspects()
        # The reports of what was written, within what is left of the shutdown timeout.
        self.reporter.drain(max(deadline - time.monotonic(), 0.0 if self.immediate else 1.0))
        if self._listener is not None:
            self._listener.stop()
            self._listener.join(2.0)
        self.pool.stop(wait=False)

    def _name_suspects(self) -> None:
        """Ending with jobs still running after the memory went over its limit: those that
        ran then are the suspects of this end (the others are interrupted)."""
        if self._memory_suspects is None or not self.pool.busy:
            return
        cause, jobs = self._memory_suspects
        running = [job for job in jobs if job in self.held]
        if running:
            self.give_verdict(suspected(cause, running))

    def _flush_at_stop(self) -> None:
        try:
            self.flush()
        except Exception as error:  # noqa: BLE001 - kept unwritten; what runs is not released
            events.emit(
                "finish_failed", process=self.name, error=f"{type(error).__name__}: {error}"
            )

    def final_release(self) -> None:
        """Write the timed-out attempts, and give back the jobs held that no thread runs:
        among the very last writes before the process ends (only its row's follows).

        Jobs whose threads still run are not given back here: whoever is sure this process
        has ended does that (its supervisor once it reaps it, or a prune), uncharged."""
        if not self.held:
            return
        try:
            self._write_timeouts()
        except Exception as error:  # noqa: BLE001 - what is not written is released below
            events.emit(
                "finish_failed", process=self.name, error=f"{type(error).__name__}: {error}"
            )
        unstarted = {job.id for job in self.pool.withdraw_unstarted()}
        # Jobs whose outcome could not be written: no thread runs them any more; except
        # attempts past their timeout, whose threads still do.
        unwritten = {
            item.job.id for item in self.outcomes.unwritten if item.job.id not in self.timed_out
        }
        idle = [
            (job.id, job.attempt)
            for job in self.held.values()
            if job.id in unstarted or job.id in unwritten
        ]
        if not idle:
            return
        try:
            released = self.store.release(
                owner=self.registration.registered_id,
                jobs=idle,
                cause="its worker stopped "
                + ("at once" if self.immediate else "before the job could run or be written"),
                process=self.name,
            )
        except Exception as error:  # noqa: BLE001 - given back once this process is gone
            events.emit(
                "release_failed",
                process=self.name,
                count=len(idle),
                error=f"{type(error).__name__}: {error}",
            )
            return
        for job_id, _ in idle:
            self.held.pop(job_id, None)
        self.outcomes.unwritten = [
            item for item in self.outcomes.unwritten if item.job.id in self.held
        ]
        if released:
            events.emit(
                "jobs_released",
                process=self.name,
                count=len(released),
                reason="immediate stop" if self.immediate else "shutdown timeout",
            )
