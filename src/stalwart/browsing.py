"""Reading jobs for people: lists by state with filters and keyset pages, capped counts,
one job in full, and batches (the newest, and one with its callbacks and a page of its
members). The dashboard and the ``queue jobs`` / ``queue show`` / ``queue batches``
commands show the same data because they read it here.

Fast on a table of millions: every list walks an index in its own order (the claim's for
ready jobs, the finished index for finished ones) and stops after a page; the next page
starts after the last row seen (keyset pagination: no OFFSET, which would read every row it
skips); counts stop at a cap, and above it PostgreSQL's planner gives an estimate.
"""

import base64
import binascii
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import connections, models
from django.db.models import Exists, OuterRef, Q, QuerySet

from stalwart.batches import BatchProgress
from stalwart.db.batches import member_counts
from stalwart.models import Batch, BatchJob, BatchRole, ConcurrencyKey, Job, JobStatus, Process
from stalwart.models.job import CANCELLABLE_STATES

# The states, in the order the dashboard's tabs and the command's help list them.
STATES = (
    "ready",
    "scheduled",
    "running",
    "blocked",
    "pending",
    "failed",
    "successful",
    "cancelled",
)
FINISHED = ("failed", "successful", "cancelled")
PAGE_SIZE = 50
MAX_PAGE_SIZE = 1000
COUNT_CAP = 10_000

# Each state's order: (field, descending), ending with the id so that it is total. Each
# matches a partial index, so a page reads a page's worth of index entries.
ORDERS: dict[str | None, tuple[tuple[str, bool], ...]] = {
    "ready": (("priority", True), ("available_at", False), ("id", False)),
    "scheduled": (("available_at", False), ("id", False)),
    "blocked": (
        ("concurrency_key", False),
        ("priority", True),
        ("available_at", False),
        ("id", False),
    ),
    "running": (("last_attempted_at", True), ("id", True)),
    "pending": (("id", False),),
    "failed": (("finished_at", True), ("id", True)),
    "successful": (("finished_at", True), ("id", True)),
    "cancelled": (("finished_at", True), ("id", True)),
    # Every state: newest first (ids are UUIDv7, ordered by creation time).
    None: (("id", True),),
}
# The time a state's time-range filter applies to: the one its order starts with.
TIME_FIELDS = {
    "ready": "available_at",
    "scheduled": "available_at",
    "blocked": "available_at",
    "running": "last_attempted_at",
    "pending": "enqueued_at",
    "failed": "finished_at",
    "successful": "finished_at",
    "cancelled": "finished_at",
    None: "enqueued_at",
}
# What a list reads: never the arguments (they may hold personal data), nor the result
# (the dashboard reads a page's results apart, for its list of successful jobs).
LIST_FIELDS = (
    "id",
    "task_path",
    "queue_name",
    "priority",
    "status",
    "enqueued_at",
    "available_at",
    "run_after",
    "started_at",
    "last_attempted_at",
    "finished_at",
    "attempt",
    "max_attempts",
    "owner",
    "concurrency_key",
    "unique_key",
    "isolated",
    "cancel_requested_at",
)


class InvalidCursor(ValueError):
    """A page cursor that this module did not make (or that was changed on the way)."""


@dataclass(frozen=True, slots=True)
class JobFilter:
    """Which jobs a list shows. Every field narrows it; None means "any"."""

    state: str | None = None
    task: str | None = None
    queue: str | None = None
    priority: int | None = None
    since: datetime | None = None
    until: datetime | None = None

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in STATES:
            raise ValueError(f"{self.state!r} is not a job state (one of {', '.join(STATES)}).")

    @property
    def time_field(self) -> str:
        return TIME_FIELDS[self.state]

    def queryset(self, database: str) -> QuerySet:
        jobs = Job.objects.using(database)
        if self.state is not None:
            jobs = jobs.filter(status=self.state)
        if self.task:
            jobs = jobs.filter(task_path=self.task)
        if self.queue:
            jobs = jobs.filter(queue_name=self.queue)
        if self.priority is not None:
            jobs = jobs.filter(priority=self.priority)
        if self.since is not None:
            jobs = jobs.filter(**{f"{self.time_field}__gte": self.since})
        if self.until is not None:
            jobs = jobs.filter(**{f"{self.time_field}__lt": self.until})
        return jobs


@dataclass(slots=True)
class Page[Row]:
    """One page of a list, and the cursors of its neighbours (None: there is none)."""

    rows: list[Row]
    next: str | None = None
    previous: str | None = None


@dataclass(frozen=True, slots=True)
class Count:
    """How many jobs match, up to ``COUNT_CAP``; above it, ``estimate`` if one was made."""

    value: int
    capped: bool = False
    estimate: int | None = None

    def __str__(self) -> str:
        if not self.capped:
            return f"{self.value:,}"
        if self.estimate is not None and self.estimate > self.value:
            return f"≈ {self.estimate:,}"
        return f"{self.value:,}+"


# -- cursors ---------------------------------------------------------------------------------


def _encode(values: list[Any]) -> str:
    tagged: list[list[Any]] = []
    for value in values:
        if isinstance(value, datetime):
            tagged.append(["d", value.isoformat()])
        elif isinstance(value, uuid.UUID):
            tagged.append(["u", str(value)])
        elif isinstance(value, int):
            tagged.append(["i", value])
        else:
            tagged.append(["s", str(value)])
    return base64.urlsafe_b64encode(json.dumps(tagged).encode()).decode().rstrip("=")


def _decode(cursor: str, length: int) -> list[Any]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        tagged = json.loads(raw)
        readers: dict[str, Callable[[Any], Any]] = {
            "d": datetime.fromisoformat,
            "u": uuid.UUID,
            "i": int,
            "s": str,
        }
        values = [readers[tag](value) for tag, value in tagged]
    except (ValueError, TypeError, KeyError, binascii.Error, json.JSONDecodeError):
        raise InvalidCursor(f"{cursor!r} is not a page cursor.") from None
    if len(values) != length:
        raise InvalidCursor(f"{cursor!r} is not a page cursor for this list.")
    return values


def _beyond(order: tuple[tuple[str, bool], ...], values: list[Any]) -> Q:
    """Rows strictly after ``values`` in ``order``: (a, b) after (x, y) is a > x, or a = x
    and b > y, each "greater" in its column's direction. The first column's bound comes
    first, so the database reads the index from there."""
    first, descending = order[0]
    bound = Q(**{f"{first}__{'lte' if descending else 'gte'}": values[0]})
    after = Q(pk__in=[])
    for index, (name, desc) in enumerate(order):
        equal = {column: value for (column, _), value in zip(order[:index], values, strict=False)}
        after |= Q(**equal) & Q(**{f"{name}__{'lt' if desc else 'gt'}": values[index]})
    return bound & after


def _order_by(order: tuple[tuple[str, bool], ...], *, reverse: bool = False) -> list[str]:
    return [f"{'-' if desc != reverse else ''}{name}" for name, desc in order]


def _position(row: Any, order: tuple[tuple[str, bool], ...]) -> str:
    return _encode([getattr(row, name) for name, _ in order])


def _page(
    rows: QuerySet,
    order: tuple[tuple[str, bool], ...],
    *,
    limit: int,
    after: str | None,
    before: str | None,
) -> Page:
    """A page of ``rows`` in ``order``: the first, or the one after (before) a cursor."""
    limit = max(1, min(limit, MAX_PAGE_SIZE))
    backwards = before is not None
    narrowed = rows
    if after is not None:
        narrowed = rows.filter(_beyond(order, _decode(after, len(order))))
    elif before is not None:
        reversed_order = tuple((name, not desc) for name, desc in order)
        narrowed = rows.filter(_beyond(reversed_order, _decode(before, len(order))))
    found = list(narrowed.order_by(*_order_by(order, reverse=backwards))[: limit + 1])
    more = len(found) > limit
    if backwards and not more:
        # Back at the start: the first page, full, with no "previous".
        return _page(rows, order, limit=limit, after=None, before=None)
    found = found[:limit]
    if backwards:
        found.reverse()
    page = Page(rows=found)
    if found:
        if more or backwards:
            page.next = _position(found[-1], order)
        if (more and backwards) or after is not None:
            page.previous = _position(found[0], order)
    return page


# -- lists and counts ------------------------------------------------------------------------


def list_jobs(
    database: str,
    where: JobFilter,
    *,
    limit: int = PAGE_SIZE,
    after: str | None = None,
    before: str | None = None,
    fields: tuple[str, ...] = LIST_FIELDS,
) -> Page[Job]:
    """A page of jobs in the state's order: the first, or the one after (before) a cursor."""
    jobs = where.queryset(database).only(*fields)
    return _page(jobs, ORDERS[where.state], limit=limit, after=after, before=before)


def count_jobs(database: str, where: JobFilter, *, cap: int = COUNT_CAP) -> Count:
    """How many jobs match: exact up to ``cap``; above it, an estimate where one is cheap."""
    jobs = where.queryset(database)
    value = jobs.values("pk")[: cap + 1].count()
    if value <= cap:
        return Count(value)
    return Count(cap, capped=True, estimate=_estimate(jobs))


def _estimate(jobs: QuerySet) -> int | None:
    """The planner's row estimate for a query (PostgreSQL; None elsewhere)."""
    if connections[jobs.db].vendor != "postgresql":
        return None
    plan = json.loads(jobs.values("pk").explain(format="json"))
    return int(plan[0]["Plan"]["Plan Rows"])


def state_counts(database: str, where: JobFilter, *, cap: int = COUNT_CAP) -> dict[str, Count]:
    """Each state's count under the other filters (the dashboard's tabs)."""
    counts = {}
    for state in STATES:
        narrowed = JobFilter(
            state=state,
            task=where.task,
            queue=where.queue,
            priority=where.priority,
            since=where.since,
            until=where.until,
        )
        counts[state] = count_jobs(database, narrowed, cap=cap)
    return counts


# -- what a page of jobs needs besides the rows ----------------------------------------------


@dataclass(frozen=True, slots=True)
class Owner:
    """The process a running job belongs to, as far as its row tells."""

    id: int
    name: str | None
    hostname: str | None
    pid: int | None
    heartbeat_age: float | None
    alive: bool


def owners(database: str, jobs: list[Job], *, now: datetime, threshold: float) -> dict:
    """``{process id: Owner}`` for the owners of these jobs. A process with no row, or with
    a heartbeat older than ``threshold`` seconds, is dead."""
    ids = sorted({job.owner for job in jobs if job.owner is not None})
    found = {
        row.id: Owner(
            id=row.id,
            name=row.name,
            hostname=row.hostname,
            pid=row.pid,
            heartbeat_age=(now - row.last_heartbeat_at).total_seconds(),
            alive=(now - row.last_heartbeat_at).total_seconds() <= threshold,
        )
        for row in Process.objects.using(database).filter(id__in=ids)
    }
    for missing in set(ids) - set(found):
        found[missing] = Owner(missing, None, None, None, None, alive=False)
    return found


@dataclass(slots=True)
class KeyHolders:
    """A concurrency key's limit and the jobs holding its slots (ready or running)."""

    key: str
    limit: int | None
    holders: list[Job] = field(default_factory=list)


def slot_holders(database: str, jobs: list[Job], *, per_key: int = 10) -> dict[str, KeyHolders]:
    """For the concurrency keys of these jobs: who holds their slots."""
    keys = sorted({job.concurrency_key for job in jobs if job.concurrency_key})
    limits = dict(
        ConcurrencyKey.objects.using(database).filter(key__in=keys).values_list("key", "slot_limit")
    )
    result = {key: KeyHolders(key=key, limit=limits.get(key)) for key in keys}
    for key in keys:
        result[key].holders = list(
            Job.objects.using(database)
            .filter(concurrency_key=key, status__in=["ready", "running"])
            .only("id", "status", "owner", "task_path", "concurrency_key")
            .order_by("id")[:per_key]
        )
    return result


# -- one job ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Attempt:
    """How one attempt ended, as the job records it: ``ended`` is ``failed`` (charged: an
    error, deaths included), ``interrupted`` (not charged: ``cause`` says why), or the job's
    final state for its last attempt (``successful``, ``cancelled``, ``running``)."""

    number: int
    exception_class_path: str = ""
    traceback: str = ""
    ended: str = "failed"
    cause: str = ""
    at: str = ""
    process: str = ""

    @property
    def message(self) -> str:
        """The traceback's last line: the exception and its message (or the cause)."""
        if self.ended != "failed":
            return self.cause
        lines = [line for line in self.traceback.strip().splitlines() if line.strip()]
        return lines[-1] if lines else self.exception_class_path


def attempts(job: Job) -> list[Attempt]:
    """The failed attempts (deaths charged included), each with its error."""
    found = []
    for index, error in enumerate(job.errors or [], start=1):
        if not isinstance(error, dict):
            continue
        number = error.get("attempt")
        found.append(
            Attempt(
                # Errors stored before attempts were numbered: their place in the list.
                number=number if isinstance(number, int) else index,
                exception_class_path=str(error.get("exception_class_path", "")),
                traceback=str(error.get("traceback", "")),
                at=str(error.get("at") or ""),
                process=str(error.get("process") or ""),
            )
        )
    return found


# The last attempt's end, for a job in one of these states (it left no error behind).
_FINAL_ENDS = {"successful": "successful", "cancelled": "cancelled", "running": "running"}


def history(job: Job) -> list[Attempt]:
    """Why each attempt of the job ended, in attempt order: its errors, its interruptions,
    and how its last attempt ended (or that it runs). An attempt claimed and then given back
    unstarted for another worker (its task not found here, in a rolling deploy) leaves no
    record."""
    found = attempts(job)
    for entry in job.interruptions or []:
        if isinstance(entry, dict) and isinstance(entry.get("attempt"), int):
            found.append(
                Attempt(
                    number=entry["attempt"],
                    ended="interrupted",
                    cause=str(entry.get("cause") or ""),
                    at=str(entry.get("at") or ""),
                    process=str(entry.get("process") or ""),
                )
            )
    final = _FINAL_ENDS.get(job.status)
    if final is not None and job.attempt and all(a.number != job.attempt for a in found):
        moment = job.finished_at if final != "running" else job.last_attempted_at
        found.append(
            Attempt(
                number=job.attempt,
                ended=final,
                at=moment.isoformat() if moment else "",
                process=str(job.worker_ids[-1]) if job.worker_ids else "",
            )
        )
    return sorted(found, key=lambda attempt: attempt.number)


def find_job(database: str, job_id: Any) -> Job | None:
    """The whole row of one job, or None (also for something that is not a job id)."""
    try:
        key = uuid.UUID(str(job_id))
    except ValueError:
        return None
    return Job.objects.using(database).filter(pk=key).first()


# What a list of jobs shows of each (``queue jobs --json``); one job shows all.
BRIEF_FIELDS = (*LIST_FIELDS, "concurrency_limit", "unique_while_running")


def as_dict(job: Job, *, with_arguments: bool = True, brief: bool = False) -> dict[str, Any]:
    """A job as JSON-ready data: what ``queue show --json`` prints; ``brief``, what a list
    shows of it (``BRIEF_FIELDS``, read by ``list_jobs(fields=BRIEF_FIELDS)``)."""
    data: dict[str, Any] = {}
    for name in BRIEF_FIELDS if brief else (*BRIEF_FIELDS, "worker_ids"):
        value = getattr(job, name)
        if isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, uuid.UUID):
            value = str(value)
        data[name] = value
    data["task_result_status"] = str(JobStatus(job.status).task_result_status)
    if brief:
        return data
    data["errors"] = [
        {
            "attempt": attempt.number,
            "exception_class_path": attempt.exception_class_path,
            "traceback": attempt.traceback,
        }
        for attempt in attempts(job)
    ]
    data["attempts"] = [
        {
            "attempt": attempt.number,
            "ended": attempt.ended,
            "at": attempt.at or None,
            "process": attempt.process or None,
            "cause": attempt.cause or None,
            "error": attempt.exception_class_path or None,
        }
        for attempt in history(job)
    ]
    data["interruptions"] = len(job.interruptions or [])
    data["max_interruptions"] = job.max_interruptions
    data["return_value"] = job.return_value
    if with_arguments:
        data["args"] = job.args
        data["kwargs"] = job.kwargs
    return data


def graph(database: str, job_id: Any) -> tuple[list[dict], list[dict]]:
    """The jobs ``job_id`` runs after and those that run after it: id, task and state."""
    from stalwart.db.dependencies import children_of, parents_of

    def described(ids: list[Any]) -> list[dict]:
        rows = {
            row["id"]: row
            for row in Job.objects.using(database)
            .filter(pk__in=ids)
            .values("id", "task_path", "status")
        }
        return [
            {
                "id": str(job),
                "task_path": rows[job]["task_path"] if job in rows else None,
                "status": rows[job]["status"] if job in rows else "deleted",
            }
            for job in ids
        ]

    return described(parents_of(database, job_id)), described(children_of(database, job_id))


# -- batches -------------------------------------------------------------------------------

# What a batch's member may be: a job state, or deleted (by retention, once finished). A
# list of members is filtered by job state only: finding the deleted ones would read the job
# table for every member (or the whole table, at the planner's choice), not a page of them.
MEMBER_STATES = (*STATES, "deleted")
# A batch's members in the order they were added: the index on (batch, role, id).
MEMBER_ORDER: tuple[tuple[str, bool], ...] = (("id", False),)
# The callbacks, in the order they are listed (and enqueued).
CALLBACK_ROLES = (BatchRole.ON_SUCCESS, BatchRole.ON_FAILURE, BatchRole.ON_FINISH)


def _batch_state(row: Batch) -> str:
    """open (it takes more jobs), closed (its callbacks wait for its members) or finished
    (its callbacks were enqueued)."""
    if row.finished_at is not None:
        return "finished"
    return "open" if row.closed_at is None else "closed"


def batch_summaries(
    database: str, backend: str, *, limit: int, unfinished: bool = False
) -> list[dict[str, Any]]:
    """The newest batches of ``backend``, each with its state (open, closed, finished) and
    its members by state (one read of its members each): ``queue batches`` and the
    dashboard's list."""
    rows = Batch.objects.using(database).filter(backend=backend)
    if unfinished:
        rows = rows.filter(finished_at__isnull=True)
    found = []
    for row in rows.order_by("-id")[:limit]:
        progress = BatchProgress.from_counts(row.total, member_counts(database, row.id, row.total))
        found.append(
            {
                "id": str(row.id),
                "label": row.label,
                "state": _batch_state(row),
                "created_at": row.created_at,
                "total": progress.total,
                "waiting": progress.waiting,
                "running": progress.running,
                "succeeded": progress.succeeded,
                "failed": progress.failed,
                "cancelled": progress.cancelled,
                "callbacks": sorted(row.callbacks),
            }
        )
    return found


@dataclass(frozen=True, slots=True)
class Callback:
    """One of a batch's callbacks: what it runs, and its job once enqueued (``status`` is
    that job's state, or ``deleted``; both None while it is not enqueued)."""

    role: str
    task_path: str | None
    queue_name: str | None
    priority: int | None
    job_id: uuid.UUID | None = None
    status: str | None = None


@dataclass(frozen=True, slots=True)
class BatchDetail:
    """A batch as its page shows it: its row, its progress, its members by state (a job
    state, or ``deleted``) and its callbacks."""

    id: uuid.UUID
    backend: str
    label: str
    state: str
    created_at: datetime
    closed_at: datetime | None
    finished_at: datetime | None
    progress: BatchProgress
    counts: dict[str, int]
    callbacks: list[Callback]


def find_batch(database: str, backend: str, batch_id: Any) -> BatchDetail | None:
    """One batch of ``backend`` with its progress (one read of its members, grouped by
    state) and its callbacks (their links, and their jobs); None if there is none."""
    try:
        key = uuid.UUID(str(batch_id))
    except ValueError:
        return None
    row = Batch.objects.using(database).filter(pk=key, backend=backend).first()
    if row is None:
        return None
    counts = member_counts(database, row.id, row.total)
    links = dict(
        BatchJob.objects.using(database)
        .filter(batch=row.id, role__in=CALLBACK_ROLES)
        .values_list("role", "job")
    )
    states = dict(
        Job.objects.using(database).filter(pk__in=list(links.values())).values_list("pk", "status")
    )
    callbacks = []
    for role in CALLBACK_ROLES:
        spec = row.callbacks.get(role) if isinstance(row.callbacks, dict) else None
        job_id = links.get(role)
        if not isinstance(spec, dict) and job_id is None:
            continue
        spec = spec if isinstance(spec, dict) else {}
        callbacks.append(
            Callback(
                role=role,
                task_path=spec.get("task_path"),
                queue_name=spec.get("queue_name"),
                priority=spec.get("priority"),
                job_id=job_id,
                status=None if job_id is None else states.get(job_id, "deleted"),
            )
        )
    return BatchDetail(
        id=row.id,
        backend=row.backend,
        label=row.label,
        state=_batch_state(row),
        created_at=row.created_at,
        closed_at=row.closed_at,
        finished_at=row.finished_at,
        progress=BatchProgress.from_counts(row.total, counts),
        counts={state: counts.get(state, 0) for state in MEMBER_STATES},
        callbacks=callbacks,
    )


@dataclass(frozen=True, slots=True)
class Member:
    """A member of a batch as a list shows it: its job (as ``list_jobs`` reads it), or None
    once retention has deleted it. ``id`` is its link's, the order it was added in."""

    id: int
    job_id: uuid.UUID
    job: Job | None

    @property
    def status(self) -> str:
        return "deleted" if self.job is None else self.job.status


def batch_members(
    database: str,
    batch_id: uuid.UUID,
    *,
    state: str | None = None,
    limit: int = PAGE_SIZE,
    after: str | None = None,
    before: str | None = None,
) -> Page[Member]:
    """A page of a batch's members in the order they were added (a deleted one with no
    job), all of them or those in the job state ``state``. The page walks the batch's links
    in the index's order and stops after a page; for a state few members are in, the
    planner may instead read that state's jobs by its index and keep the batch's."""
    if state is not None and state not in STATES:
        raise ValueError(f"{state!r} is not a job state (one of {', '.join(STATES)}).")
    for cursor in (after, before):
        if cursor is not None and not isinstance(_decode(cursor, len(MEMBER_ORDER))[0], int):
            raise InvalidCursor(f"{cursor!r} is not a page cursor for this list.")
    links = BatchJob.objects.using(database).filter(batch=batch_id, role=BatchRole.MEMBER)
    if state is not None:
        links = links.filter(Exists(Job.objects.filter(pk=OuterRef("job"), status=state)))
    page = _page(links.only("id", "job"), MEMBER_ORDER, limit=limit, after=after, before=before)
    jobs = Job.objects.using(database).filter(pk__in=[link.job for link in page.rows])
    found = {job.pk: job for job in jobs.only(*LIST_FIELDS)}
    return Page(
        rows=[Member(id=link.id, job_id=link.job, job=found.get(link.job)) for link in page.rows],
        next=page.next,
        previous=page.previous,
    )


def cancellable_members(database: str, batch_id: uuid.UUID) -> tuple[int, int]:
    """How many of a batch's members ``Batch.cancel`` would cancel (waiting), and how many
    running ones it would ask to stop (those not asked yet): a dry run's figures."""
    members = BatchJob.objects.using(database).filter(batch=batch_id, role=BatchRole.MEMBER)
    counts = (
        Job.objects.using(database)
        .filter(pk__in=members.values("job"))
        .aggregate(
            waiting=models.Count("pk", filter=Q(status__in=CANCELLABLE_STATES)),
            running=models.Count("pk", filter=Q(status="running", cancel_requested_at=None)),
        )
    )
    return counts["waiting"], counts["running"]


@dataclass(frozen=True, slots=True)
class BatchLink:
    """The batch a job belongs to, and its part in it (a member, or a callback)."""

    batch_id: uuid.UUID
    backend: str
    label: str
    role: str


def batch_of_job(database: str, job_id: uuid.UUID) -> BatchLink | None:
    """The batch a job is a member or a callback of, if any (a read of the job's link, by
    its unique index, then of the batch's row)."""
    link = BatchJob.objects.using(database).filter(job=job_id).values_list("batch", "role").first()
    if link is None:
        return None
    batch_id, role = link
    row = Batch.objects.using(database).filter(pk=batch_id).values_list("backend", "label").first()
    if row is None:
        return None
    return BatchLink(batch_id=batch_id, backend=row[0], label=row[1], role=role)
