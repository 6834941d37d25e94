"""Dependencies between jobs: the statements that write them and resolve them.

A job enqueued to run after others is inserted ``pending``, with one ``stalwart_dependency``
row per parent, in the enqueue's transaction. Nothing is written when a parent finishes:
the dispatcher (or a standalone worker, where it promotes due jobs) looks at pending jobs
and reads their parents' states, so a crash between a parent's end and its dependant's
release leaves nothing to repair. Each look, set-based:

- a pending job with a ``cancel`` dependency whose parent failed for good, was cancelled, or
  is gone (deleted by retention) is cancelled, the reason in its errors; its own dependants
  follow in the same look (a few rounds) or the next;
- a pending job whose every dependency holds (the parent succeeded; or, for a ``run``
  dependency, the parent finished whatever its outcome, or is gone) becomes ``scheduled``,
  due at once or at its ``run_after``: the promotion that follows makes it ready (or
  blocked on its concurrency key), as any due job.

Every write is guarded by ``status = 'pending'``, so two dispatchers resolving at once
release or cancel each job once; a parent's success is final, so a release decided on it
cannot be wrong by the time it is written. The SQL is the same on the three databases.
"""

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import connections, transaction
from django.db.models import Case, F, Value, When

from stalwart.models import Dependency, Job

# Rounds of cancellation per look: a cancelled job's dependants are cancelled in the next
# round, so a chain of this many links fails through in one look (longer ones in the next).
CANCEL_ROUNDS = 8

# The parent's state, or 'gone' for a parent no longer in the table.
_PARENT_STATE = "COALESCE(parent.status, 'gone')"

# Dependencies that can no longer hold: the child is cancelled.
_BROKEN = f"""
SELECT child.id, dependency.parent, {_PARENT_STATE}
FROM stalwart_job child
JOIN stalwart_dependency dependency ON dependency.child = child.id
LEFT JOIN stalwart_job parent ON parent.id = dependency.parent
WHERE child.status = 'pending' AND dependency.on_failure = 'cancel'
  AND {_PARENT_STATE} IN ('failed', 'cancelled', 'gone')
ORDER BY child.id
LIMIT %s
"""

# Pending jobs none of whose dependencies is still open.
_RELEASABLE = f"""
SELECT child.id
FROM stalwart_job child
WHERE child.status = 'pending' AND NOT EXISTS (
    SELECT 1
    FROM stalwart_dependency dependency
    LEFT JOIN stalwart_job parent ON parent.id = dependency.parent
    WHERE dependency.child = child.id AND NOT (
        {_PARENT_STATE} = 'successful'
        OR (dependency.on_failure = 'run'
            AND {_PARENT_STATE} IN ('failed', 'cancelled', 'gone'))
    )
)
ORDER BY child.id
LIMIT %s
"""

_GONE_WORDS = {
    "failed": "failed for good",
    "cancelled": "was cancelled",
    "gone": "no longer exists (deleted by retention?)",
}


def insert_dependencies(database: str, edges: Sequence[Dependency]) -> None:
    """Write the edges of new jobs, in the caller's transaction (the enqueue's)."""
    Dependency.objects.using(database).bulk_create(edges)


def _job_id(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def cancel_broken(database: str, *, now: datetime, limit: int) -> int:
    """Cancel pending jobs that a parent's end has doomed; return how many."""
    cancelled = 0
    for _ in range(CANCEL_ROUNDS):
        with transaction.atomic(using=database), connections[database].cursor() as cursor:
            cursor.execute(_BROKEN, [limit])
            doomed: dict[uuid.UUID, tuple[uuid.UUID, str]] = {}
            for child, parent, state in cursor.fetchall():
                doomed.setdefault(_job_id(child), (_job_id(parent), state))
            for child, (parent, state) in doomed.items():
                error = {
                    "exception_class_path": "stalwart.exceptions.ParentFailed",
                    "traceback": (
                        f"Job {child} runs after job {parent}, which {_GONE_WORDS[state]}; "
                        "it was cancelled before it ran (that dependency's on_failure is "
                        "'cancel')."
                    ),
                    "at": now.isoformat(),
                    "attempt": 0,
                    "process": "",
                }
                cancelled += (
                    Job.objects.using(database)
                    .filter(pk=child, status="pending")
                    .update(status="cancelled", finished_at=now, errors=[error])
                )
        if not doomed:
            break
    return cancelled


def release_ready(database: str, *, now: datetime, limit: int) -> int:
    """Make pending jobs whose parents are done scheduled (due now, or at their
    ``run_after``); return how many."""
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        cursor.execute(_RELEASABLE, [limit])
        ids = [_job_id(row[0]) for row in cursor.fetchall()]
        if not ids:
            return 0
        return (
            Job.objects.using(database)
            .filter(pk__in=ids, status="pending")
            .update(
                status="scheduled",
                available_at=Case(When(run_after__gt=now, then=F("run_after")), default=Value(now)),
            )
        )


def any_pending(database: str) -> bool:
    """Whether some job waits for its parents (the dispatcher then keeps looking)."""
    return Job.objects.using(database).filter(status="pending").exists()


def parents_of(database: str, child: uuid.UUID) -> list[uuid.UUID]:
    """The jobs ``child`` runs after, in the order they were given."""
    return list(
        Dependency.objects.using(database)
        .filter(child=child)
        .order_by("position")
        .values_list("parent", flat=True)
    )


def children_of(database: str, parent: uuid.UUID) -> list[uuid.UUID]:
    """The jobs that run after ``parent``."""
    return list(
        Dependency.objects.using(database)
        .filter(parent=parent)
        .order_by("child")
        .values_list("child", flat=True)
    )
