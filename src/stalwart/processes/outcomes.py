"""Writing a worker's outcomes: together where possible, never lost, never reported twice.

The attempts a worker has run wait here until they are written, then each is reported (its
events, Django's ``task_finished``) or, if the job was taken from us, discarded. In order:

- One attempt, one outcome: should an attempt that timed out also finish for real before
  either is written, the real outcome is kept.
- The outcomes go in one statement, with the next claim where the database allows; the
  claimed jobs are handed to the worker the moment the statement returns.
- An outcome that may have to wait on an application's transaction (a unique job going back
  to waiting, beside a twin the application has inserted and not yet committed; or a row an
  application has locked) is written on its own, giving up after a moment; it waits here and
  is tried again at the next flush. So no application transaction holds up the queue, or
  deadlocks with it.
- If the database refuses the batch for what it carries (a value it cannot store), each
  outcome is written alone, and one it refuses becomes a failure that says why.
- If the database is unavailable, everything waits here for the next flush. A write whose
  answer was lost may have been committed: an outcome that matches nothing is checked
  against the rows before it is called discarded.
"""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished

from stalwart import events, signals
from stalwart.db import ClaimedJob
from stalwart.db.errors import is_lock_wait, refuses_the_data
from stalwart.exceptions import OutcomeNotStored
from stalwart.jobs import JobStore
from stalwart.models import JobStatus
from stalwart.processes.outage import DatabaseFailure
from stalwart.processes.runner import Finished, crashed_attempt
from stalwart.queues import QueueSelector

_WAITING = (JobStatus.SCHEDULED, JobStatus.BLOCKED, JobStatus.READY)


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """Claim up to ``limit`` jobs with the write, for a worker with these queues."""

    limit: int
    worker_name: str
    selector: QueueSelector
    paused: Sequence[str]
    # Nothing runs in the worker and an isolated job waits: take it first, and it alone.
    isolated_first: bool = False


def _may_wait_on_a_twin(item: Finished) -> bool:
    """Whether writing this outcome may wait on another transaction's unique key."""
    return item.job.unique_key is not None and item.outcome.status in _WAITING


def _one_per_job(items: list[Finished]) -> list[Finished]:
    kept: dict[Any, Finished] = {}
    for item in items:
        other = kept.get(item.job.id)
        if other is None or (other.timed_out and not item.timed_out):
            kept[item.job.id] = item
    return list(kept.values())


class OutcomeWriter:
    def __init__(
        self,
        store: JobStore,
        *,
        process: str,
        sender: type,
        deliver: Callable[[str, Callable[[], None]], None] | None = None,
        outage_seen: Callable[[Finished], bool] = lambda item: False,
    ) -> None:
        self.store = store
        self.process = process
        self.sender = sender
        # Where Django's task_finished is sent from (the worker's reporter thread: receivers
        # are the application's code); by default, here and now.
        self.deliver = deliver or (lambda what, send: send())
        # Whether our own bookkeeping saw the database fail since the attempt began.
        self.outage_seen = outage_seen
        self.unwritten: list[Finished] = []
        self._deferred_reported: set[Any] = set()
        # Task paths this worker did not find, and said so (once each).
        self._deferred_paths: set[str] = set()

    def flush(
        self,
        owner: int,
        finished: list[Finished],
        *,
        claim: ClaimRequest | None = None,
        hold: Callable[[list[ClaimedJob]], None] = lambda jobs: None,
    ) -> list[Finished]:
        """Write ``finished`` and whatever still waits here; with ``claim``, claim too, and
        call ``hold`` with the claimed jobs at once. Returns the attempts settled now
        (written and reported, given back, or discarded); the rest waits for the next flush.
        A job given back here may be claimed again by this very flush: its new attempt is
        not among those settled, though it has the same id."""
        pending = _one_per_job(self.unwritten + finished)
        self.unwritten = pending  # kept until written, should a write fail
        self._judge_lost_connections(pending)
        given_back = self._give_back(owner, [item for item in pending if item.interruption])
        if given_back:
            pending = [item for item in pending if item.interruption is None]
            self.unwritten = pending
        if not pending:
            if claim is not None:
                hold(self._claim(owner, claim))
            return given_back
        combined = claim is not None and self._can_combine(pending, claim)
        try:
            written, deferred = self._write_pending(
                owner, pending, claim if combined else None, hold
            )
        except DatabaseFailure as error:
            if is_lock_wait(error):
                # A row or key the batch needs is locked by a transaction that is not ours:
                # write what can be written, and let the rest wait.
                written, deferred = self._write_each(owner, pending, briefly=True)
            elif refuses_the_data(error):
                written, deferred = self._write_each(owner, pending)
            else:
                raise  # all of them wait here for the next flush
            combined = False
        settled = [item for item in pending if item not in deferred]
        missing = [item.outcome for item in settled if item.job.id not in written]
        if missing:
            # Matched nothing: taken from us, or written by an earlier try whose answer was
            # lost (the link broke after COMMIT). The rows tell which.
            written |= self.store.settled(owner=owner, outcomes=missing)
        self.unwritten = deferred
        self._report_deferred(deferred)
        self._report(settled, written)
        self._announce_retries(settled, written)
        if claim is not None and not combined:
            hold(self._claim(owner, claim))  # after the report: written outcomes are settled
        return given_back + settled

    def _judge_lost_connections(self, pending: list[Finished]) -> None:
        """An attempt whose body lost its connection was interrupted by the database (a
        restart, a failover) only if our own link went down too: then it runs again, free.
        If ours still answers, the job lost its connection by its own doing (it ended its
        session, say): a failure like any other. A look that fails is an outage: the
        outcomes wait, and are interruptions."""
        unsure = [
            item for item in pending if item.interruption is not None and not self.outage_seen(item)
        ]
        if not unsure:
            return
        self.store.ping()
        for item in unsure:
            if not self.outage_seen(item):
                item.interruption = None

    def _give_back(self, owner: int, items: list[Finished]) -> list[Finished]:
        """Give back the jobs whose attempts were interrupted (their connection was lost):
        they run again, free up to their ``max_interruptions``. Returns them, settled."""
        if not items:
            return []
        interruptions = [item.interruption for item in items if item.interruption is not None]
        released = set(self.store.release(owner=owner, jobs=interruptions, process=self.process))
        for item, interruption in zip(items, interruptions, strict=True):
            if item.job.id in released:
                events.emit(
                    "job_interrupted",
                    job=item.job.id,
                    task=item.job.task_path,
                    attempt=item.job.attempt,
                    cause=interruption.cause,
                )
            else:
                events.emit(
                    "job_result_discarded",
                    job=item.job.id,
                    task=item.job.task_path,
                    attempt=item.job.attempt,
                    reason="the job is no longer ours (released or taken over)",
                )
        return items

    def _can_combine(self, pending: list[Finished], claim: ClaimRequest) -> bool:
        """Whether the outcomes that need not wait can go in one statement with the claim."""
        plain = [item for item in pending if not self._may_wait(item)]
        return (
            bool(plain)
            and not claim.isolated_first
            and self.store.can_finish_and_claim(claim.selector)
            and not any(item.job.concurrency_key for item in plain)
        )

    def _may_wait(self, item: Finished) -> bool:
        """Whether writing this outcome may wait on another transaction: on a unique twin,
        or on a lock that held it up at an earlier flush (and may still). Such an outcome
        is written on its own, briefly, never in the batch: the others, and the claim, do
        not wait with it (on MySQL a lock wait lasts a whole second at the least)."""
        return _may_wait_on_a_twin(item) or item.job.id in self._deferred_reported

    def _write_pending(
        self,
        owner: int,
        pending: list[Finished],
        claim: ClaimRequest | None,
        hold: Callable[[list[ClaimedJob]], None],
    ) -> tuple[dict, list[Finished]]:
        """The outcomes that need not wait in one statement (with ``claim``, if given), then
        each of the others, giving up on those that would wait. Returns what was written,
        and what must wait."""
        plain = [item for item in pending if not self._may_wait(item)]
        written: dict = {}
        if claim is not None:
            written, claimed = self.store.finish_and_claim(
                owner=owner,
                outcomes=[item.outcome for item in plain],
                worker_name=claim.worker_name,
                selector=claim.selector,
                limit=claim.limit,
                paused=claim.paused,
            )
            hold(claimed)
        elif plain:
            written = self._write(owner, plain)
        more, deferred = self._write_each(
            owner, [item for item in pending if self._may_wait(item)], briefly=True
        )
        return written | more, deferred

    def _write_each(
        self, owner: int, items: list[Finished], *, briefly: bool = False
    ) -> tuple[dict, list[Finished]]:
        """Write each outcome alone. ``briefly``: one that would wait on a lock held by
        another transaction waits here instead. Otherwise (the batch was refused for what it
        carries) one the database will not take becomes a failure that says why. So one bad
        or blocked outcome never holds up the others. Returns what was written, and what
        must wait."""
        written: dict = {}
        deferred: list[Finished] = []
        for index, item in enumerate(items):
            if briefly:
                result = self.store.finish_unless_waiting(owner=owner, outcome=item.outcome)
                if result is None:
                    deferred.append(item)
                else:
                    written |= result
                continue
            try:
                written |= self._write(owner, [item])
            except DatabaseFailure as error:
                if not refuses_the_data(error):
                    raise
                events.emit(
                    "outcome_not_stored",
                    job=item.job.id,
                    task=item.job.task_path,
                    error=f"{type(error).__name__}: {error}",
                )
                replacement = crashed_attempt(item.job, OutcomeNotStored(str(error)))
                replacement.result = item.result  # reported as failed, with that error
                items[index] = replacement
                written |= self._write(owner, [replacement])
        return written, deferred

    def _write(self, owner: int, items: list[Finished]) -> dict:
        return self.store.finish(
            owner=owner,
            outcomes=[item.outcome for item in items],
            free_keys=[
                item.job.concurrency_key for item in items if item.job.concurrency_key is not None
            ],
        )

    def _claim(self, owner: int, claim: ClaimRequest) -> list[ClaimedJob]:
        return self.store.claim(
            owner=owner,
            worker_name=claim.worker_name,
            selector=claim.selector,
            limit=claim.limit,
            paused=claim.paused,
            isolated_first=claim.isolated_first,
        )

    def _announce_retries(self, settled: list[Finished], written: dict) -> None:
        """Wake the dispatchers for the earliest retry just written: one that sleeps until
        its next due job would otherwise find this one late. Best effort: a dispatcher that
        misses it finds the retry at its next look."""
        delays = [
            item.retry_in
            for item in settled
            if item.job.id in written
            and item.outcome.status == JobStatus.SCHEDULED
            and item.retry_in is not None
        ]
        if not delays:
            return
        try:
            self.store.notify_scheduled(due_in=min(delays))
        except Exception as error:  # noqa: BLE001 - the outcomes are written: nothing to undo
            events.emit("notify_failed", process=self.process, error=str(error))

    def _report_deferred(self, deferred: list[Finished]) -> None:
        for item in deferred:
            if item.job.id not in self._deferred_reported:
                self._deferred_reported.add(item.job.id)
                events.emit(
                    "outcome_deferred",
                    job=item.job.id,
                    task=item.job.task_path,
                    reason="it waits on another transaction (a lock, or a unique twin "
                    "not yet committed); it is tried again",
                )

    def _report(self, settled: list[Finished], written: dict) -> None:
        for item in settled:
            self._deferred_reported.discard(item.job.id)
            if item.job.id in written:
                self._report_written(item, written[item.job.id])
            else:
                events.emit(
                    "job_result_discarded",
                    job=item.job.id,
                    task=item.job.task_path,
                    attempt=item.job.attempt,
                    reason="the job is no longer ours (released or taken over)",
                )

    def _report_written(self, item: Finished, finished_at: Any) -> None:
        outcome, result = item.outcome, item.result
        fields = {
            "job": item.job.id,
            "task": item.job.task_path,
            "queue": item.job.queue_name,
            "attempt": item.job.attempt,
            "duration": item.duration,
        }
        if item.deferred is not None:
            if item.job.task_path not in self._deferred_paths:  # said once per task
                self._deferred_paths.add(item.job.task_path)
                events.emit(
                    "task_not_found_deferred",
                    **fields,
                    retry_in=item.retry_in,
                    reason=item.deferred,
                )
            return
        if outcome.status == JobStatus.SUCCESSFUL:
            events.emit("job_succeeded", **fields)
        elif outcome.status == JobStatus.CANCELLED:
            events.emit(
                "job_cancelled",
                **fields,
                ran=item.result is not None,
                error=item.error.exception_class_path if item.error else None,
            )
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
        exception, item.exception = item.exception, None  # its frames go with this report
        sender = self.sender

        def send() -> None:
            if outcome.status != JobStatus.FAILED or exception is None:  # (not a cancelled job)
                signals.send(task_finished, "task_finished", sender=sender, task_result=result)
                return
            # As Django's own backends do, and its log receiver expects: the signal goes out
            # while the task's exception is being handled, so the log line has its traceback.
            try:
                raise exception
            except BaseException:  # noqa: BLE001 - raised just above, to be handled here
                signals.send(task_finished, "task_finished", sender=sender, task_result=result)

        self.deliver("task_finished", send)
