"""Batches: the statements that add members, read progress, and finish a batch once.

A batch's callbacks are enqueued by the dispatcher's look (``JobStore.finish_batches``), in
one transaction with the write that marks the batch finished, so they are enqueued once,
or, if that transaction fails or its process dies, not at all and again at the next look:

1. a closed, unfinished batch with no unfinished member is a candidate (a read);
2. its row is marked finished, ``WHERE finished_at IS NULL`` (the row lock: of two
   dispatchers, one marks it, the other finds it marked and does nothing);
3. its members are read again, after that lock: a member added meanwhile (adding takes the
   same row lock, and refuses a finished batch) is seen, and the transaction rolls back;
4. the callbacks its outcome calls for are enqueued, in the same transaction.

The SQL is the same on the three databases (the ORM's), but the membership rows' insert,
which PostgreSQL takes as one array.
"""

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connections
from django.db.models import Count, Exists, F, OuterRef, Subquery

from stalwart.models import Batch, BatchJob, BatchRole, Job


def add_members(database: str, batch_id: uuid.UUID, job_ids: Sequence[uuid.UUID]) -> bool:
    """Count ``job_ids`` into the batch and link them, in the caller's transaction (the
    enqueue's). False, and nothing written, if the batch is finished (or gone)."""
    grown = (
        Batch.objects.using(database)
        .filter(pk=batch_id, finished_at__isnull=True)
        .update(total=_plus(len(job_ids)))
    )
    if not grown:
        return False
    _link_members(database, batch_id, job_ids)
    return True


# Members linked per statement elsewhere than on PostgreSQL: two parameters a row, well
# under SQLite's 32,766 and MySQL's packet size.
_MEMBERS_PER_INSERT = 5000


def _link_members(database: str, batch_id: uuid.UUID, job_ids: Sequence[uuid.UUID]) -> None:
    """Write the membership rows: on PostgreSQL, one statement from an array of ids (the
    server parses one text parameter); elsewhere, multi-row inserts. Not the ORM's
    bulk_create, which built a model instance and a parameter list per row: as long as
    inserting the jobs themselves."""
    if not job_ids:
        return
    connection = connections[database]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "INSERT INTO stalwart_batch_job (batch, job, role) "
                "SELECT %s, unnest(%s::uuid[]), %s",
                [batch_id, "{" + ",".join(str(job_id) for job_id in job_ids) + "}", "member"],
            )
            return
        field: Any = BatchJob._meta.get_field("job")
        batch = field.get_db_prep_value(batch_id, connection)
        for start in range(0, len(job_ids), _MEMBERS_PER_INSERT):
            chunk = job_ids[start : start + _MEMBERS_PER_INSERT]
            params: list[Any] = []
            for job_id in chunk:
                params += [batch, field.get_db_prep_value(job_id, connection)]
            rows = ", ".join([f"(%s, %s, '{BatchRole.MEMBER}')"] * len(chunk))
            cursor.execute(
                f"INSERT INTO stalwart_batch_job (batch, job, role) VALUES {rows}", params
            )


def _plus(count: int) -> Any:
    return F("total") + count


def _members(database: str, batch_id: uuid.UUID) -> Any:
    return BatchJob.objects.using(database).filter(batch=batch_id, role=BatchRole.MEMBER)


def has_unfinished_members(database: str, batch_id: uuid.UUID) -> bool:
    """Whether a member of the batch is still to finish (a deleted member has finished)."""
    batch = Batch.objects.using(database).filter(pk=batch_id)
    return batch.alias(running=_running_member()).filter(running__isnull=False).exists()


def _running_member() -> Any:
    """A member of the batch (the outer row) still to finish, or NULL. Its members are read
    newest first, where one still to finish is found at once (a batch's jobs run roughly in
    the order they were added, so the newest finish last), not after every member that has
    finished, which a look near the end of a big batch would read each time. A subquery
    with ORDER BY and LIMIT keeps that order (the index on batch, role, id, read
    backwards); an EXISTS would drop it."""
    unfinished = Job.objects.filter(pk=OuterRef("job"), status__in=_UNFINISHED_STATES)
    return Subquery(
        BatchJob.objects.filter(batch=OuterRef("pk"), role=BatchRole.MEMBER)
        .filter(Exists(unfinished))
        .order_by("-id")
        .values("id")[:1]
    )


_UNFINISHED_STATES = ("pending", "scheduled", "blocked", "ready", "running")


def member_counts(database: str, batch_id: uuid.UUID, total: int) -> dict[str, int]:
    """The batch's members by state (``deleted``: gone from the job table)."""
    member_ids = _members(database, batch_id).values("job")
    rows = (
        Job.objects.using(database)
        .filter(pk__in=member_ids)
        .values("status")
        .annotate(count=Count("pk"))
        .order_by()
    )
    counts = {row["status"]: row["count"] for row in rows}
    counts["deleted"] = max(total - sum(counts.values()), 0)
    return counts


def member_ids(database: str, batch_id: uuid.UUID) -> list[uuid.UUID]:
    """The batch's members, in the order they were added."""
    return list(_members(database, batch_id).order_by("id").values_list("job", flat=True))


def waiting(database: str, *, limit: int) -> list[Batch]:
    """Closed batches whose callbacks are due (every member has finished), oldest first:
    batches still running, however many, never hold up one that is done."""
    return list(
        Batch.objects.using(database)
        .filter(closed_at__isnull=False, finished_at__isnull=True)
        .alias(running=_running_member())
        .filter(running__isnull=True)
        .order_by("closed_at", "id")[:limit]
    )


def close(database: str, batch_id: uuid.UUID, now: datetime) -> bool:
    """Close the batch; False if it was already closed (or is gone)."""
    return bool(
        Batch.objects.using(database)
        .filter(pk=batch_id, closed_at__isnull=True)
        .update(closed_at=now)
    )


def mark_finished(database: str, batch_id: uuid.UUID, now: datetime) -> bool:
    """Step 2: take the batch's row lock and mark it finished; False if another did."""
    return bool(
        Batch.objects.using(database)
        .filter(pk=batch_id, finished_at__isnull=True, closed_at__isnull=False)
        .update(finished_at=now)
    )


def link_callback(database: str, batch_id: uuid.UUID, job_id: uuid.UUID, role: str) -> None:
    BatchJob.objects.using(database).create(batch=batch_id, job=job_id, role=role)


def batch_of(database: str, job_id: uuid.UUID) -> uuid.UUID | None:
    """The batch a job belongs to (as a member or a callback), if any."""
    return (
        BatchJob.objects.using(database).filter(job=job_id).values_list("batch", flat=True).first()
    )
