"""The process table: registering, heartbeating (database clock), deregistering."""

import os
import secrets
import socket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import Error as DatabaseFailure
from django.db import connections, transaction
from django.db.models.functions import Now

from stalwart import events
from stalwart.db import Death, Released
from stalwart.db.errors import is_lock_wait
from stalwart.db.retry import retry_transient
from stalwart.jobs import JobStore
from stalwart.models import Process
from stalwart.processes import verdicts
from stalwart.processes.verdicts import Verdict

if TYPE_CHECKING:
    from django.db.models import QuerySet

    from stalwart.conf import Options
    from stalwart.processes.outage import Outage

# The error recorded on a job whose process died while running it.
PROCESS_DIED = "stalwart.exceptions.ProcessDied"
# Set in a process row's metadata by a process that ends with jobs still running in its
# threads (a shutdown timeout, an immediate stop): they are given back uncharged.
LEAVING = "leaving"


def process_name(kind: str) -> str:
    """A name unique across hosts and restarts, e.g. ``worker-web1-4242-9f3a``."""
    host = socket.gethostname().split(".")[0][:40]
    return f"{kind}-{host}-{os.getpid()}-{secrets.token_hex(2)}"


class Registration:
    """One process's row. ``heartbeat`` returns False once the row is gone (we were pruned)."""

    def __init__(self, database: str, *, kind: str, name: str, supervisor: int | None) -> None:
        self.database = database
        self.kind = kind
        self.name = name
        self.supervisor = supervisor
        self.id: int | None = None

    def register(self, metadata: dict[str, Any]) -> int:
        def create() -> int:
            row = Process.objects.using(self.database).create(
                kind=self.kind,
                name=self.name,
                pid=os.getpid(),
                hostname=socket.gethostname(),
                supervisor=self.supervisor,
                created_at=Now(),
                last_heartbeat_at=Now(),
                metadata=metadata,
            )
            return row.id

        self.id = retry_transient(self.database, create, what="register")
        return self.id

    @property
    def registered_id(self) -> int:
        """Our row's id, once registered (the steps that need it run only after that)."""
        if self.id is None:
            raise RuntimeError(f"this {self.kind} has not registered in the process table")
        return self.id

    def _own_row(self) -> "QuerySet[Process]":
        """Our row, or nothing before we registered."""
        if self.id is None:
            return Process.objects.using(self.database).none()
        return Process.objects.using(self.database).filter(id=self.id)

    def heartbeat(self, metadata: dict[str, Any]) -> bool:
        """Stamp our row (database clock); False if it is gone, or marked leaving (a beat
        late for the stop must not undo that mark)."""
        updated = (
            self._own_row()
            .exclude(metadata__has_key=LEAVING)
            .update(last_heartbeat_at=Now(), metadata=metadata)
        )
        return updated == 1

    def update_metadata(self, metadata: dict[str, Any]) -> None:
        """Write our row's metadata (a verdict, say) without stamping a heartbeat: a loop that
        does not progress is not vouched for, but may still say why."""
        self._own_row().exclude(metadata__has_key=LEAVING).update(metadata=metadata)

    def mark_leaving(self, metadata: dict[str, Any]) -> None:
        """Say that this process is ending with jobs still running in it: whoever removes
        the row once the process is surely gone gives them back without charging them."""
        self._own_row().update(metadata={**metadata, LEAVING: True})

    def reregister(self, metadata: dict[str, Any]) -> int:
        """Our row was pruned while we lived (a long outage): take a new one, and move the
        children recorded under the old one to it."""
        old = self.id
        new = self.register(metadata)
        if old is not None and self.kind == "supervisor":
            Process.objects.using(self.database).filter(supervisor=old).update(supervisor=new)
        return new

    def deregister(self) -> None:
        if self.id is None:
            return
        retry_transient(
            self.database,
            lambda: self._own_row().delete(),
            what="deregister",
        )


@dataclass(frozen=True, slots=True)
class GoneProcess:
    """A process taken off the table, and the jobs it held."""

    id: int
    kind: str
    name: str
    pid: int
    hostname: str
    released: list[Released]


def prune_dead_processes(
    database: str, *, threshold: float, exclude: int | None, candidates: list | None = None
) -> list[GoneProcess]:
    """Delete every process silent for longer than ``threshold`` s; release its jobs.

    Each deletion re-checks the silence in its WHERE clause, in the same transaction as the
    release: a process that beats in the meantime is left alone, and two pruners never both
    act on one process. ``exclude`` (the caller itself) is never pruned. ``candidates``:
    the silent processes, as ``Statements.dead_processes`` returns them, if already found.
    """
    statements = JobStore(database).statements

    def find() -> list:
        with connections[database].cursor() as cursor:
            return statements.dead_processes(cursor, threshold=threshold, exclude=exclude)

    if candidates is None:
        candidates = retry_transient(database, find, what="find dead processes")
    # Supervisors that still beat: a child of one that went silent alone is a lone death.
    silent = {candidate[0] for candidate in candidates}
    supervised = {candidate[5] for candidate in candidates if candidate[5] is not None}
    living = set(
        Process.objects.using(database)
        .filter(id__in=supervised - silent)
        .values_list("id", flat=True)
    )
    pruned = []
    for process_id, kind, name, pid, hostname, supervisor in candidates:
        # Its whole tree fell silent (its supervisor too, or its supervisor is gone): its
        # host was lost or cut off, which is none of its jobs' doing.
        tree_silent = supervisor is not None and supervisor not in living

        def prune_one(
            process_id: int = process_id,
            name: str = name,
            pid: int = pid,
            hostname: str = hostname,
            tree_silent: bool = tree_silent,
        ) -> list[Released] | None:
            with transaction.atomic(using=database), connections[database].cursor() as cursor:
                metadata = statements.delete_process_if_dead(
                    cursor, process_id=process_id, threshold=threshold
                )
                if metadata is None:
                    return None
                verdict = judged(metadata, tree_silent=tree_silent)
                return statements.release_owner(
                    cursor,
                    owner=process_id,
                    error_class=PROCESS_DIED,
                    error_text=(
                        f"Process {name} (pid {pid} on {hostname}) sent no heartbeat for over "
                        f"{threshold:g} s and was declared dead{_because(verdict)}."
                    ),
                    notify=True,
                    death=verdict.death,
                    suspects=_suspects(verdict),
                    process=name,
                )

        try:
            released = retry_transient(
                database, prune_one, what="prune a dead process", conflicts=True, lock_waits=False
            )
        except DatabaseFailure as error:
            if not is_lock_wait(error):
                raise
            # An application's transaction holds one of its jobs: the others go on; this
            # one is pruned at a later turn.
            events.emit("prune_deferred", process=name, error=str(error).strip())
            continue
        if released is not None:
            pruned.append(GoneProcess(process_id, kind, name, pid, hostname, released))
    return pruned


def remove_reaped_child(
    database: str,
    *,
    supervisors: Sequence[int],
    pid: int,
    cause: str,
    told: Verdict | None = None,
    ended: bool = False,
) -> list[GoneProcess]:
    """Remove the row(s) of a child the supervisor reaped, releasing what it held.

    ``supervisors``: the rows the supervisor has had (a long outage may have made it take a
    new one). The child is dead (``waitpid`` said so), so releasing its jobs cannot make
    them run twice at once. Who pays is decided by cause (see ``judged``): ``told``, the
    child's newest verdict on its status pipe; ``ended``, whether its role returned (it
    gave up what it still ran on purpose). ``cause``: how it ended, in words.
    """
    statements = JobStore(database).statements

    def remove() -> list[GoneProcess]:
        gone = []
        with transaction.atomic(using=database), connections[database].cursor() as cursor:
            # Delete first: the delete waits for any claim of the child's still committing
            # (claims share-lock their process row), so the release below sees its jobs.
            rows = statements.delete_child_processes(cursor, supervisors=supervisors, pid=pid)
            for process_id, kind, name, child_pid, hostname, metadata in rows:
                verdict = judged(metadata, told=told, ended=ended)
                released = statements.release_owner(
                    cursor,
                    owner=process_id,
                    error_class=PROCESS_DIED,
                    error_text=(
                        f"Process {name} (pid {child_pid} on {hostname}) {cause}"
                        f"{_because(verdict)}."
                    ),
                    notify=True,
                    death=verdict.death,
                    suspects=_suspects(verdict),
                    process=name,
                )
                gone.append(GoneProcess(process_id, kind, name, child_pid, hostname, released))
        return gone

    return retry_transient(database, remove, what="remove a reaped child", conflicts=True)


def judged(
    metadata: dict[str, Any],
    *,
    told: Verdict | None = None,
    ended: bool = False,
    tree_silent: bool = False,
) -> Verdict:
    """Who pays for the end of a process whose jobs are taken back, by cause: its own newest
    verdict (``told`` on its supervisor's pipe, else in its row); else, if it gave its jobs
    up on purpose (it ended with jobs still running, ``LEAVING``; or its role returned), an
    interruption; else, if its whole tree fell silent with it (``tree_silent``: a host lost
    or cut off), an interruption; else it died of something its jobs may have done: a crash,
    every job it held a suspect (a lone process gone silent: ``queue work``, say)."""
    verdict = told or verdicts.from_metadata(metadata)
    if verdict is not None:
        return verdict
    if metadata.get(LEAVING) or ended:
        return Verdict(Death.INTERRUPTED, "")
    if tree_silent:
        return Verdict(Death.INTERRUPTED, "its whole process tree fell silent with it")
    return Verdict(Death.CRASH, "")


def _because(verdict: Verdict) -> str:
    return f": {verdict.cause}" if verdict.cause else ""


def _suspects(verdict: Verdict) -> list[uuid.UUID] | None:
    if verdict.suspects is None:
        return None
    return [uuid.UUID(job) for job in verdict.suspects]


def report_given_back(released: Sequence[Released], *, process: str) -> None:
    """One event per job a dead process's end gave back: what became of it (the metrics
    count these as failed, retried or interrupted)."""
    for job in released:
        events.emit(
            "job_given_back",
            job=job.id,
            task=job.task_path,
            queue=job.queue_name,
            status=job.status,
            charged=job.charged,
            process=process,
        )


def report_pruned(gone: GoneProcess) -> None:
    report_given_back(gone.released, process=gone.name)
    events.emit(
        "process_pruned",
        process=gone.name,
        kind=gone.kind,
        pid=gone.pid,
        host=gone.hostname,
        released=sum(1 for job in gone.released if not job.failed),
        failed=sum(1 for job in gone.released if job.failed),
    )


PRUNE_LEASE = "stalwart.prune"


def may_prune(outage: "Outage", config: "Options", holder: str) -> bool:
    """Whether a pruner may judge others' silence now: only once the database has answered
    it for a whole threshold on end. Right after an outage of its own, every row looks
    silent (nobody could beat), and what it cannot tell apart is an outage that ended
    for all from deaths; the processes that lived through it get a threshold to beat
    again first. A process that is really dead is pruned that much later.

    The wait is bounded: a link reset more often than once a threshold (a flapping
    failover) would restart it for ever, and a dead process's jobs would stay running all
    along. Once the pruner has waited ``MAX_WAITS`` thresholds since the first of a run of
    outages ended, it judges anyway: the processes that lived through them have had that
    long to beat between the outages."""
    threshold = config.process_alive_threshold
    if outage.up_for(threshold):
        outage.waiting_since = None
        return True
    if outage.since is not None:
        return False  # out of reach now: nothing to judge with
    if outage.waiting_since is None:
        outage.waiting_since = outage.recovered_at
    if (
        outage.waiting_since is not None
        and time.monotonic() - outage.waiting_since >= MAX_WAITS * threshold
    ):
        return True
    if outage.wait_said_after != outage.recovered_at:
        outage.wait_said_after = outage.recovered_at
        events.emit(
            "pruning_waits",
            process=holder,
            for_seconds=threshold,
            reason="the database was out of reach here too: the processes that lived through "
            "the outage get a threshold to beat before any is judged dead",
        )
    return False


def stall_limit(config: "Options") -> float:
    """How long a call to the database may take before it counts, for a pruner, as an
    outage of its own (``Outage.stalled``): past a heartbeat interval and a quarter of the
    alive threshold, the beats of others were held up alike."""
    return max(config.heartbeat_interval, config.process_alive_threshold / 4)


# How many thresholds a pruner waits at most after a run of outages of its own.
MAX_WAITS = 2
ORPHAN_OWNERS_PER_TRANSACTION = 50


def prune_under_lease(
    database: str, *, holder: str, threshold: float, interval: float, exclude: int | None
) -> list[GoneProcess]:
    """Prune dead processes if we hold the cluster's pruning lease (taken or renewed here).

    Then running jobs whose owner has no row at all are taken back (``release_orphans``).
    Both are safe to run anywhere at once (each deletion is a compare-and-set); the lease
    only saves the cluster from doing them on every host every interval. Every supervisor,
    dispatcher and standalone worker calls this, so a job never stays running for want of
    a dispatcher.

    The lease and the look for work share one statement where the database allows
    (PostgreSQL): in an idle cluster, that statement is all its pruner sends each interval.
    """
    statements = JobStore(database).statements

    def survey() -> tuple[list, bool] | None:
        with connections[database].cursor() as cursor:
            return statements.survey_for_prune(
                cursor,
                lease=PRUNE_LEASE,
                holder=holder,
                ttl=2 * interval,
                threshold=threshold,
                exclude=exclude,
            )

    found = retry_transient(database, survey, what="look for dead processes")
    if found is None:
        return []  # the lease is another process's
    candidates, orphans = found
    pruned = prune_dead_processes(
        database, threshold=threshold, exclude=exclude, candidates=candidates
    )
    for gone in pruned:
        report_pruned(gone)
    if orphans:
        release_orphans(database)
    return pruned


def release_orphans(database: str) -> list[Released]:
    """Take back running jobs whose owner has no process row any more.

    Nothing should leave such jobs (a process deregisters only once it holds nothing), but if
    something does, this sweep is the guarantee that no job stays running for ever. An owner
    id never comes back (process ids are never reused), so the sweep cannot race a claim.
    """
    statements = JobStore(database).statements
    owners_done = [0]

    def sweep() -> list[Released]:
        with transaction.atomic(using=database), connections[database].cursor() as cursor:
            statements.take_write_lock(cursor)
            released: list[Released] = []
            owners = statements.orphan_owners(cursor, limit=ORPHAN_OWNERS_PER_TRANSACTION)
            owners_done[0] = len(owners)
            for owner in owners:
                released += statements.release_owner_rows(
                    cursor,
                    owner=owner,
                    error_class=PROCESS_DIED,
                    error_text=f"The process (row {owner}) that held this job is gone.",
                    death=Death.CRASH,
                )
            # All owners' keys at once, in one sorted pass: locks taken in one order.
            statements.hand_on_slots(cursor, released, notify=True)
            return released

    # Bounded transactions: up to ORPHAN_OWNERS_PER_TRANSACTION owners' jobs each.
    released: list[Released] = []
    while True:
        batch = retry_transient(database, sweep, what="release orphaned jobs", conflicts=True)
        released += batch
        if owners_done[0] < ORPHAN_OWNERS_PER_TRANSACTION or not batch:
            break
    if released:
        report_given_back(released, process="")
        events.emit("orphans_released", count=len(released))
    return released
