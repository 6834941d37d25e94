"""The verbs the roles use on the job table: insert, claim, finish, release, promote.

Roles (backend, worker, supervisor, dispatcher) never hold SQL; they call these. Each verb is
one transaction of ours, retried on transient errors, except ``insert``, which joins the
caller's transaction so that a rolled-back enqueue never existed.
"""

import time
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import DatabaseError, DataError, IntegrityError, connections, transaction
from django.db import Error as DatabaseFailure

from stalwart import events
from stalwart.db import ClaimedJob, Death, Interruption, NewJob, Outcome, Released, statements_for
from stalwart.db.errors import is_lock_wait, is_unique_conflict
from stalwart.db.retry import retry_transient
from stalwart.queues import QueuePattern, QueueSelector

# The dispatcher's look at pending jobs reads the jobs finished since its last look, and
# this much before (a finish committed late, the clocks of the hosts that write finish
# times); a sweep through every pending job starts every SWEEP_INTERVAL seconds, a page of
# it per look.
RECENT_MARGIN = timedelta(seconds=5)
SWEEP_INTERVAL = 60.0
RESOLVE_CHUNK = 500
RECENT_PAGES = 20  # pages of recent dependants per look (each of the look's limit)


class JobStore:
    """Job-table operations on one database alias, for the calling thread's connection."""

    def __init__(self, database: str, *, notify: bool = True) -> None:
        self.database = database
        self.notify = notify
        # The dispatcher's looks at pending jobs (resolve_dependencies): when the last one
        # was (database clock), and where the sweep through every pending job stands.
        self._resolved_until: Any = None
        self._sweep_after: Any = None
        self._next_sweep = 0.0
        # Batches whose callbacks this process could not enqueue (and said so, once).
        self._unfinishable: set[Any] = set()

    @property
    def connection(self) -> Any:
        return connections[self.database]

    @property
    def statements(self) -> Any:
        return statements_for(self.connection)

    @property
    def vendor(self) -> str:
        return self.connection.vendor

    def insert(self, jobs: Sequence[NewJob]) -> None:
        """Insert jobs in the caller's transaction (if any); several chunks go all or none."""
        statements = self.statements
        if len(jobs) <= statements.insert_chunk:
            with self.connection.cursor() as cursor:
                statements.insert(cursor, jobs, self.notify)
            return
        with (
            transaction.atomic(using=self.database, savepoint=False),
            self.connection.cursor() as cursor,
        ):
            statements.insert(cursor, jobs, self.notify)

    def insert_guarded(self, jobs: Sequence[NewJob]) -> list[NewJob | uuid.UUID]:
        """Insert jobs one at a time, waiting for concurrency slots, honouring unique keys.

        Runs in the caller's transaction if there is one (else in its own), and takes no lock
        there: a job that needs a concurrency slot is inserted ``blocked``, and the slots are
        handed out after commit (``unblock``). Per job, returns the job as inserted, or the id
        of the waiting twin that made it a duplicate. Contention is never an exception: a
        unique conflict is an ``ON CONFLICT DO NOTHING`` and a row count.
        """
        outcome: list[NewJob | uuid.UUID] = []
        with (
            transaction.atomic(using=self.database, savepoint=False),
            self.connection.cursor() as cursor,
        ):
            for job in jobs:
                if job.concurrency_key is not None and job.status == "ready":
                    job = replace(job, status="blocked")  # noqa: PLW2901 - the job as stored
                if job.unique_key is None:
                    self.statements.insert(cursor, [job], self.notify)
                    outcome.append(job)
                    continue
                outcome.append(self._insert_unique(cursor, job))
        return outcome

    def _insert_unique(self, cursor: Any, job: NewJob) -> NewJob | uuid.UUID:
        from stalwart.models import Job
        from stalwart.models.job import UNIQUE_STATES

        for _ in range(5):
            if self.statements.insert_unique(cursor, job, self.notify):
                return job
            twin = (
                Job.objects.using(self.database)
                .filter(UNIQUE_STATES, unique_key=job.unique_key)
                .values_list("id", flat=True)
                .first()
            )
            if twin is not None:
                return twin
            # The twin moved on between our insert and our look: try again.
        raise RuntimeError(f"unique key {job.unique_key} kept changing hands")  # pragma: no cover

    def claim(
        self,
        *,
        owner: int,
        worker_name: str,
        selector: QueueSelector,
        limit: int,
        paused: Sequence[str] = (),
        isolated_first: bool = False,
    ) -> list[ClaimedJob]:
        """Claim up to ``limit`` ready jobs, queue pattern by queue pattern, in order.

        Isolated jobs (see ``Job.isolated``) are left alone, unless ``isolated_first``: the
        claimant runs nothing else, and takes the first isolated job of its queues, if there
        is one, and only it.
        """
        excluded = list(selector.excluded) + [QueuePattern(name) for name in paused]
        if isolated_first:
            for pattern in selector.patterns:
                one = self._claim_pattern(
                    owner, worker_name, pattern, excluded, limit=1, isolated=True
                )
                if one:
                    return one
        claimed: list[ClaimedJob] = []
        for pattern in selector.patterns:
            wanted = limit - len(claimed)
            if wanted <= 0:
                break
            try:
                claimed += self._claim_pattern(
                    owner, worker_name, pattern, excluded, limit=wanted, isolated=False
                )
            except DatabaseError:
                if not claimed:
                    raise
                # What the earlier patterns claimed is committed and ours: keep it.
                events.emit("claim_failed", pattern=str(pattern), kept=len(claimed))
                break
        return claimed

    def _claim_pattern(
        self,
        owner: int,
        worker_name: str,
        pattern: QueuePattern,
        excluded: list[QueuePattern],
        *,
        limit: int,
        isolated: bool,
    ) -> list[ClaimedJob]:
        def claim() -> list[ClaimedJob]:
            with self.connection.cursor() as cursor:
                return self.statements.claim(
                    cursor,
                    owner=owner,
                    worker_name=worker_name,
                    pattern=pattern,
                    excluded=excluded,
                    limit=limit,
                    isolated=isolated,
                )

        return retry_transient(self.database, claim, what="claim")

    def isolated_waiting(self, *, selector: QueueSelector, paused: Sequence[str] = ()) -> bool:
        """Whether an isolated job is ready in any of these queues."""
        excluded = list(selector.excluded) + [QueuePattern(name) for name in paused]

        def look() -> bool:
            with self.connection.cursor() as cursor:
                return any(
                    self.statements.isolated_waiting(cursor, pattern=pattern, excluded=excluded)
                    for pattern in selector.patterns
                )

        return retry_transient(self.database, look, what="isolated jobs")

    def _in_transaction(
        self,
        what: str,
        work: Any,
        *,
        atomic: bool = False,
        conflicts: bool = True,
        lock_waits: bool = True,
    ) -> Any:
        """Run ``work(cursor)`` as one transaction (a single statement needs no BEGIN)."""

        def run() -> Any:
            if self.statements.writes_are_single_statements and not atomic:
                with self.connection.cursor() as cursor:
                    return work(cursor)
            with transaction.atomic(using=self.database), self.connection.cursor() as cursor:
                return work(cursor)

        return retry_transient(
            self.database, run, what=what, conflicts=conflicts, lock_waits=lock_waits
        )

    def finish(
        self, *, owner: int, outcomes: Sequence[Outcome], free_keys: Sequence[str] = ()
    ) -> dict:
        """Write the outcomes we still own; return ``{id: finished_at}`` for those written.

        ``free_keys``: concurrency keys of these jobs; their freed slots are handed on in the
        same transaction, so a slot is never lost between the two.
        """
        if not outcomes:
            return {}

        def work(cursor: Any) -> dict:
            written = self.statements.finish(cursor, owner=owner, outcomes=outcomes)
            for key in sorted(set(free_keys)):
                self.statements.unblock(cursor, key=key, notify=self.notify)
            return written

        # A lock waited on too long is not waited on again: the worker writes the others.
        return self._in_transaction("finish", work, atomic=bool(free_keys), lock_waits=False)

    def settled(self, *, owner: int, outcomes: Sequence[Outcome]) -> dict:
        """Of outcomes a write matched nothing for, those written after all (by an earlier
        try whose answer was lost): ``{id: finished_at}``."""

        def read() -> dict:
            with self.connection.cursor() as cursor:
                return self.statements.settled(cursor, owner=owner, outcomes=outcomes)

        return retry_transient(self.database, read, what="re-read outcomes")

    def finish_unless_waiting(self, *, owner: int, outcome: Outcome) -> dict | None:
        """Write one outcome that may have to wait on another transaction (a unique job
        going back to waiting, whose twin an application is enqueueing and has not yet
        committed): ``{id: finished_at}`` if written (or ``{}`` if no longer ours), None
        if it would have to wait; then try again later. Never waits more than a moment, so
        an application's transaction never holds up the rest of the queue, nor deadlocks
        with it."""

        def work() -> dict:
            with transaction.atomic(using=self.database), self.connection.cursor() as cursor:
                self.statements.wait_briefly_for_locks(cursor)
                return self.statements.finish(cursor, owner=owner, outcomes=[outcome])

        try:
            return work()
        except DatabaseError as error:
            if is_lock_wait(error) or is_unique_conflict(error):
                return None
            raise

    def can_finish_and_claim(self, selector: QueueSelector) -> bool:
        """Whether outcomes and the next claim can share one statement here."""
        return self.statements.can_finish_and_claim and len(selector.patterns) == 1

    def finish_and_claim(
        self,
        *,
        owner: int,
        outcomes: Sequence[Outcome],
        worker_name: str,
        selector: QueueSelector,
        limit: int,
        paused: Sequence[str] = (),
    ) -> tuple[dict, list[ClaimedJob]]:
        """Write outcomes (none with a concurrency key) and claim jobs that are not isolated,
        in one statement."""
        excluded = list(selector.excluded) + [QueuePattern(name) for name in paused]

        def run() -> tuple[dict, list[ClaimedJob]]:
            with self.connection.cursor() as cursor:
                return self.statements.finish_and_claim(
                    cursor,
                    owner=owner,
                    outcomes=outcomes,
                    worker_name=worker_name,
                    pattern=selector.patterns[0],
                    excluded=excluded,
                    limit=limit,
                )

        # A lost answer may hide a claim: the worker's reconciliation gives such jobs back.
        return retry_transient(
            self.database, run, what="finish and claim", conflicts=True, lock_waits=False
        )

    def release(
        self,
        *,
        owner: int,
        jobs: Sequence[Interruption | tuple[Any, int]],
        cause: str = "given back by its process",
        process: str = "",
    ) -> list:
        """Give back jobs we hold, interrupted (a stop, a claim's lost answer, a lost
        connection); return the ids released. ``jobs``: interruptions, or (id, attempt) pairs
        interrupted for ``cause``. ``process``: our name, recorded with each interruption."""
        if not jobs:
            return []
        given = [
            job if isinstance(job, Interruption) else Interruption(job[0], job[1], cause)
            for job in jobs
        ]

        def work(cursor: Any) -> list:
            released = self.statements.release(
                cursor, owner=owner, jobs=given, notify=self.notify, process=process
            )
            return [job.id for job in released]

        return self._in_transaction("release", work, atomic=True)

    def release_owner(
        self,
        *,
        owner: int,
        error_class: str,
        error_text: str,
        death: Death = Death.CRASH,
        suspects: Sequence[uuid.UUID] | None = None,
        process: str = "",
    ) -> list[Released]:
        """Take back all jobs of a process that is gone (see ``Statements.release_owner``)."""

        return self._in_transaction(
            "release_owner",
            lambda cursor: self.statements.release_owner(
                cursor,
                owner=owner,
                error_class=error_class,
                error_text=error_text,
                notify=self.notify,
                death=death,
                suspects=suspects,
                process=process,
            ),
            atomic=True,
        )

    def ping(self) -> None:
        """Ask the database for nothing: raises if this thread's connection is down."""
        with self.connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    def owned_running(self, *, owner: int) -> list[tuple[uuid.UUID, int, bool]]:
        """(id, attempt, whether a cancel was requested) of the running jobs that ``owner``
        holds, as the database sees it."""

        def run() -> list:
            with self.connection.cursor() as cursor:
                return self.statements.owned_running(cursor, owner=owner)

        return retry_transient(self.database, run, what="owned jobs")

    def wake(self, queue_names: Sequence[str]) -> None:
        """Tell idle workers of these queues to look now (PostgreSQL; a no-op elsewhere)."""
        if self.notify and queue_names:
            with self.connection.cursor() as cursor:
                self.statements.notify(cursor, queue_names)

    def resolve_dependencies(self, *, limit: int = 1000) -> tuple[int, int]:
        """The dispatcher's look at pending jobs (``stalwart.db.dependencies``): those that
        run after a job finished since the last look (page after page, up to
        ``RECENT_PAGES``), and a page of the sweep through every pending job when one is
        due. Returns (released, cancelled)."""
        from stalwart.db import dependencies
        from stalwart.ticks import database_now

        def pending() -> bool:
            return dependencies.any_pending(self.database)

        if not retry_transient(self.database, pending, what="pending jobs"):
            self._sweep_after = None
            return 0, 0
        now = retry_transient(self.database, partial(database_now, self.database), what="now")
        since, self._resolved_until = self._resolved_until, now
        released = cancelled = 0
        if since is not None:
            for _ in range(RECENT_PAGES):
                children = retry_transient(
                    self.database,
                    partial(
                        dependencies.recent_children,
                        self.database,
                        since=since - RECENT_MARGIN,
                        limit=limit,
                    ),
                    what="pending dependants",
                )
                more, fewer = self._resolve_all(children)
                released, cancelled = released + more, cancelled + fewer
                if len(children) < limit:
                    break
                # Those resolved are no longer pending: the next page reads on past them.
            else:
                self._resolved_until = since  # more may wait: the next look reads them
        if since is None or self._sweep_after is not None or time.monotonic() >= self._next_sweep:
            page = retry_transient(
                self.database,
                partial(
                    dependencies.pending_page, self.database, after=self._sweep_after, limit=limit
                ),
                what="pending jobs",
            )
            # The next look goes on from here; a short page ends the sweep.
            self._sweep_after = page[-1] if len(page) == limit else None
            if self._sweep_after is None:
                self._next_sweep = time.monotonic() + SWEEP_INTERVAL
            more, fewer = self._resolve_all(page)
            released, cancelled = released + more, cancelled + fewer
        return released, cancelled

    def release_dependants_of(self, parents: Sequence[Any]) -> tuple[int, int]:
        """Resolve the pending dependants of ``parents`` alone (jobs whose outcomes were
        just written); return (released, cancelled). One indexed look when none waits."""
        from stalwart.db import dependencies

        children = retry_transient(
            self.database,
            lambda: dependencies.pending_children(self.database, parents),
            what="pending dependants",
        )
        return self._resolve_all(children)

    def _resolve_all(self, children: Sequence[Any]) -> tuple[int, int]:
        """Resolve ``children`` (pending jobs), a chunk per transaction; wake the workers of
        the queues that got ready jobs. Returns (released, cancelled)."""
        from stalwart.db import dependencies
        from stalwart.ticks import database_now

        released = cancelled = 0
        for start in range(0, len(children), RESOLVE_CHUNK):
            chunk = children[start : start + RESOLVE_CHUNK]

            def run(chunk: Sequence[Any] = chunk) -> tuple[int, int, list[str]]:
                return dependencies.resolve(self.database, chunk, now=database_now(self.database))

            more, fewer, queues = retry_transient(self.database, run, what="resolve")
            released += more
            cancelled += fewer
            if queues and self.notify:
                with self.connection.cursor() as cursor:
                    self.statements.notify(cursor, queues)
        if released:
            events.emit("dependants_released", count=released)
        if cancelled:
            events.emit("dependants_cancelled", count=cancelled)
        return released, cancelled

    def finish_batches(self, *, limit: int = 100) -> int:
        """Enqueue the callbacks of closed batches whose members have all finished, each
        batch once (``stalwart.db.batches``); return how many batches finished."""
        from stalwart.db import batches

        finished = 0
        for row in retry_transient(
            self.database,
            lambda: batches.waiting(self.database, limit=limit),
            what="finished batches",
        ):
            try:
                done = retry_transient(
                    self.database, partial(self._finish_batch, row), what="finish batch"
                )
            except (DataError, IntegrityError) as error:
                self._batch_unfinishable(row, error)  # its data, not the database
                continue
            except DatabaseFailure:
                raise  # an outage: every look would fail alike
            except Exception as error:  # noqa: BLE001 - one batch's callback, not the look
                self._batch_unfinishable(row, error)
                continue
            if done:
                finished += 1
                self._unfinishable.discard(row.id)
        return finished

    def _batch_unfinishable(self, row: Any, error: BaseException) -> None:
        """A batch whose callback cannot be enqueued here (its task gone from this release,
        its arguments no longer fitting it): it waits, said once per process, and every
        other batch, and the promotion, go on."""
        if row.id in self._unfinishable:
            return
        self._unfinishable.add(row.id)
        events.emit(
            "batch_callback_failed", batch=str(row.id), error=f"{type(error).__name__}: {error}"
        )

    def _finish_batch(self, row: Any) -> bool:
        """Mark one batch finished and enqueue its callbacks, in one transaction."""
        from django.tasks import task_backends

        from stalwart.db import batches
        from stalwart.resolution import resolve_task
        from stalwart.ticks import database_now

        with transaction.atomic(using=self.database):
            if not batches.mark_finished(self.database, row.id, database_now(self.database)):
                return False  # another dispatcher did
            if batches.has_unfinished_members(self.database, row.id):
                transaction.set_rollback(True, using=self.database)  # one was just added
                return False
            counts = batches.member_counts(self.database, row.id, row.total)
            failed = counts.get("failed", 0) + counts.get("cancelled", 0)
            roles = ["on_failure" if failed else "on_success", "on_finish"]
            backend = task_backends[row.backend]
            enqueued = []
            for role in roles:
                spec = row.callbacks.get(role)
                if spec is None:
                    continue
                task = resolve_task(spec["task_path"]).using(
                    queue_name=spec["queue_name"], priority=spec["priority"], backend=row.backend
                )
                result: Any = backend.enqueue(task, spec["args"], spec["kwargs"])
                batches.link_callback(self.database, row.id, uuid.UUID(result.id), role)
                enqueued.append(role)
            # Everything written, nothing committed yet: a death here undoes all of it.
            events.emit("batch_finishing", batch=str(row.id))
        events.emit(
            "batch_finished",
            batch=str(row.id),
            total=row.total,
            failed=failed,
            callbacks=",".join(enqueued) or "none",
        )
        return True

    def any_pending(self) -> bool:
        """Whether some job waits for the jobs it runs after, or some closed batch for its
        members to finish: then the dispatcher looks every polling_interval."""
        from stalwart.db import dependencies
        from stalwart.models import Batch

        def look() -> bool:
            return (
                dependencies.any_pending(self.database)
                or Batch.objects.using(self.database)
                .filter(closed_at__isnull=False, finished_at__isnull=True)
                .exists()
            )

        return retry_transient(self.database, look, what="any_pending")

    def promote_due(self, *, limit: int = 1000) -> int:
        """Release pending jobs whose parents are done, then move due scheduled jobs on
        (one batch) and hand out slots, then enqueue the callbacks of finished batches;
        return how many were promoted."""
        self.resolve_dependencies(limit=limit)

        def run() -> tuple[int, list]:
            with self.connection.cursor() as cursor:
                return self.statements.promote_due(cursor, limit=limit, notify=self.notify)

        promoted, keys = retry_transient(self.database, run, what="promote_due")
        self.unblock(keys)
        self.finish_batches()
        return promoted

    def next_due(self) -> tuple[float, float | None]:
        """The database clock now, and when the earliest scheduled job is due (None: none),
        in seconds since the epoch (PostgreSQL)."""

        def run() -> tuple[float, float | None]:
            with self.connection.cursor() as cursor:
                return self.statements.next_due(cursor)

        return retry_transient(self.database, run, what="next_due")

    def notify_scheduled(self, *, due_in: float) -> None:
        """Tell dispatchers a job is due ``due_in`` seconds from now (a retry written)."""
        if not self.notify or self.vendor != "postgresql":
            return

        def run() -> None:
            with self.connection.cursor() as cursor:
                self.statements.notify_scheduled(cursor, due_in=due_in)

        retry_transient(self.database, run, what="notify")

    def unblock(self, keys: Sequence[str], *, limit: int | None = None) -> int:
        """Hand out the free slots of these concurrency keys.

        ``limit``: the task's current limit, recorded for the keys (else the one stored),
        one transaction per key. Without it, up to 1,000 keys per transaction, a few
        statements each (the keys of the jobs a promotion made blocked)."""
        keys = sorted(set(keys))
        if limit is None:
            handed_out = 0
            for start in range(0, len(keys), 1000):
                chunk = keys[start : start + 1000]
                handed_out += self._in_transaction(
                    "unblock",
                    lambda cursor, chunk=chunk: self.statements.unblock_keys(
                        cursor, keys=chunk, notify=self.notify
                    ),
                    atomic=True,
                )
            return handed_out
        handed_out = 0
        for key in keys:
            handed_out += self._in_transaction(
                "unblock",
                lambda cursor, key=key: self.statements.unblock(
                    cursor, key=key, notify=self.notify, limit=limit
                ),
                atomic=True,
            )
        return handed_out

    def unblock_all(self, *, batch: int = 1000) -> int:
        """Hand out every free slot (a sweep: safe to run anywhere, any time); return how
        many jobs were made ready. See ``unblock_batch``: 100,000 keys cost a hundred
        transactions, not 100,000."""
        handed_out, after = 0, None
        while True:
            made_ready, after = self.unblock_batch(after=after, batch=batch)
            handed_out += made_ready
            if after is None:
                return handed_out

    def unblock_batch(self, *, after: str | None, batch: int = 1000) -> tuple[int, str | None]:
        """One bounded step of the slot sweep, one transaction: up to ``batch`` keys with
        blocked jobs, after ``after`` in key order, their free slots handed out in a few
        statements. Returns how many jobs were made ready and the key to go on after (None:
        the sweep is done)."""
        return self._in_transaction(
            "unblock",
            lambda cursor: self.statements.unblock_sweep(
                cursor, after=after, limit=batch, notify=self.notify
            ),
            atomic=True,
        )

    def waiting_queues(self) -> list[str]:
        """The queues with a job ready, blocked, scheduled or pending (waiting for the jobs
        it runs after), or a batch callback to come, for ``--stop-when-empty``."""
        from stalwart.models import Batch, Job

        def look() -> list[str]:
            # Pending jobs first: one released between the two reads is then ready (or
            # scheduled) by the second, never missed by both.
            pending = Job.objects.using(self.database).filter(status="pending")
            found = set(pending.values_list("queue_name", flat=True).distinct())
            with self.connection.cursor() as cursor:
                found.update(self.statements.waiting_queues(cursor))
            # A closed batch's callbacks are jobs to come, in their queues.
            for callbacks in (
                Batch.objects.using(self.database)
                .filter(closed_at__isnull=False, finished_at__isnull=True)
                .values_list("callbacks", flat=True)
            ):
                found.update(spec["queue_name"] for spec in callbacks.values())
            return sorted(found)

        return retry_transient(self.database, look, what="waiting queues")
