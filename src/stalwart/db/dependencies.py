"""Dependencies between jobs: the statements that write them and resolve them.

A job enqueued to run after others is inserted ``pending``, with one ``stalwart_dependency``
row per parent, in the enqueue's transaction. Nothing is written when a parent finishes;
whoever resolves reads the parents' states:

- a pending job with a ``cancel`` dependency whose parent failed for good, was cancelled,
  or is gone is cancelled, the reason in its errors; its own dependants follow;
- a pending job whose every dependency holds (the parent succeeded; or, for a ``run``
  dependency, the parent finished whatever its outcome, or is gone) becomes ``ready``, or
  ``scheduled`` if it waits for its ``run_after`` or has a concurrency key (the promotion
  hands out the slots), and the workers of its queue are woken.

Who resolves, and which jobs (``resolve``, each call one transaction):

- a worker, right after it wrote outcomes: the pending dependants of those jobs
  (``pending_children``), so that a chain's next link starts at once;
- the dispatcher's look (and a standalone worker's): the pending dependants of the jobs
  that finished since its last look (``recent_children``, read through the finished jobs'
  index), which covers parents that a worker did not finish (cancelled, failed by a death)
  and a worker that died between its outcomes and this step;
- now and then, a sweep of every pending job (``stuck_children``), for what neither saw.

A decision is taken with the parents that could still change locked: a ``failed`` parent
can be retried by hand (``queue retry``), which would make a decision on its failure wrong;
``successful`` and ``cancelled`` are final. Every write is guarded by ``status =
'pending'``, so resolvers running at once release or cancel each job once. Retention keeps
a finished job while a pending job runs after it (``db.control.kept_for_dependants``). A
parent retried by hand brings back the dependants its failure had cancelled (``revive``),
unless a twin holds the unique key of one (a pending job holds its key, as any waiting job):
that one stays cancelled. The SQL is the same on the three databases, except ``revive``'s
twin check, written for each as the bulk requeue's is (``db.uniqueness``).
"""

import uuid
from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import Case, F, Value, When

from stalwart.db.errors import is_unique_conflict
from stalwart.db.uniqueness import MYSQL_NO_TWIN_HOLDS_KEY, NO_TWIN_HOLDS_KEY
from stalwart.models import Dependency, Job

PARENT_FAILED = "stalwart.exceptions.ParentFailed"

# The parent's state, or 'gone' for a parent no longer in the table.
_PARENT_STATE = "COALESCE(parent.status, 'gone')"

# Of the given pending jobs, the dependencies that can no longer hold.
_BROKEN = f"""
SELECT child.id, dependency.parent, {_PARENT_STATE}
FROM stalwart_job child
JOIN stalwart_dependency dependency ON dependency.child = child.id
LEFT JOIN stalwart_job parent ON parent.id = dependency.parent
WHERE child.id IN ({{among}}) AND child.status = 'pending'
  AND dependency.on_failure = 'cancel'
  AND {_PARENT_STATE} IN ('failed', 'cancelled', 'gone')
"""

# Of the given pending jobs, those none of whose dependencies is still open. The NOT
# EXISTS is looked up for each job, by the edge index and the parents' ids, stopping at
# the first open dependency: ``LIMIT 1 OFFSET 0`` keeps PostgreSQL from turning it into an
# anti-join, which, when its statistics count many dependencies, hashed the whole
# dependency table (and every job it names) for each chunk of 500.
_RELEASABLE = f"""
SELECT child.id
FROM stalwart_job child
WHERE child.id IN ({{among}}) AND child.status = 'pending' AND NOT EXISTS (
    SELECT 1
    FROM stalwart_dependency dependency
    LEFT JOIN stalwart_job parent ON parent.id = dependency.parent
    WHERE dependency.child = child.id AND NOT (
        {_PARENT_STATE} = 'successful'
        OR (dependency.on_failure = 'run'
            AND {_PARENT_STATE} IN ('failed', 'cancelled', 'gone'))
    )
    LIMIT 1 OFFSET 0
)
"""

# The pending dependants of given parents (a worker's step after it wrote their outcomes).
_PENDING_CHILDREN = """
SELECT DISTINCT dependency.child
FROM stalwart_dependency dependency
JOIN stalwart_job child ON child.id = dependency.child
WHERE dependency.parent IN ({parents}) AND child.status = 'pending'
"""

# The pending dependants of the jobs that finished since a time: read from the index of
# jobs that others run after (has_dependants, by finished_at), then each one's dependants
# (the parent index). The jobs without dependants that finished meanwhile, thousands a
# second on a busy queue, are not read. ``{true}`` is written as each database's partial
# index condition has it (SQLite matches a partial index by the condition's very terms), and
# on SQLite ``{status}`` is ``+parent.status``: its planner cannot tell how few rows the
# partial index holds, and would read the finished jobs' index on (status, finished_at);
# on MySQL, ``{order}`` (STRAIGHT_JOIN) keeps the tables in the order written, which its
# optimizer, pricing a small dependency table, would start from and read whole.
_RECENT_CHILDREN = """
SELECT {order} DISTINCT dependency.child
FROM stalwart_job parent
JOIN stalwart_dependency dependency ON dependency.parent = parent.id
JOIN stalwart_job child ON child.id = dependency.child
WHERE parent.has_dependants = {true} AND parent.finished_at >= %s
  AND {status} IN ('successful', 'failed', 'cancelled')
  AND child.status = 'pending'
LIMIT %s
"""

# Pending jobs from an id on (the sweep goes through all of them, a page per look).
_PENDING_PAGE = """
SELECT id FROM stalwart_job WHERE status = 'pending' AND id > %s ORDER BY id LIMIT %s
"""

# Dependants cancelled by a parent's failure, with a parent retried since (whether that
# parent is the one that cancelled it, its errors say), and whose unique key, if any, no
# twin holds (``{no_twin}``: the database's twin check, see ``revive``).
_REVIVABLE = """
SELECT candidate.id, candidate.errors, parent.id, candidate.unique_key
FROM stalwart_job candidate
JOIN stalwart_dependency dependency ON dependency.child = candidate.id
JOIN stalwart_job parent ON parent.id = dependency.parent
WHERE candidate.status = 'cancelled' AND candidate.attempt = 0
  AND dependency.on_failure = 'cancel'
  AND parent.status IN ('pending', 'scheduled', 'blocked', 'ready', 'running')
  {no_twin}
LIMIT %s
"""

# Make pending again the given cancelled dependants with a unique key (one per key), each
# only if no twin holds its key, checked in the write: PostgreSQL and SQLite in one
# statement, as the bulk requeue moves failed jobs.
_REVIVE_KEYED = f"""
WITH chosen AS MATERIALIZED (
    SELECT id FROM stalwart_job AS candidate
    WHERE id IN ({{among}}) AND status = 'cancelled' AND attempt = 0 {NO_TWIN_HOLDS_KEY}
)
UPDATE stalwart_job SET status = 'pending', finished_at = NULL, errors = '[]'
WHERE status = 'cancelled' AND attempt = 0 AND id IN (SELECT id FROM chosen)
RETURNING id
"""
# MySQL cannot read the table it updates in the update's own subquery: the rows that pass
# the check are locked by a locking read, then written by id (as its bulk requeue does).
_MYSQL_CHOOSE_KEYED = f"""
SELECT id FROM stalwart_job AS candidate
WHERE id IN ({{among}}) AND status = 'cancelled' AND attempt = 0 {MYSQL_NO_TWIN_HOLDS_KEY}
ORDER BY id
FOR UPDATE
"""
_MYSQL_REVIVE_CHOSEN = """
UPDATE stalwart_job SET status = 'pending', finished_at = NULL, errors = '[]'
WHERE id IN ({among}) AND status = 'cancelled' AND attempt = 0
"""

_GONE_WORDS = {
    "failed": "failed for good",
    "cancelled": "was cancelled",
    "gone": "no longer exists (deleted)",
}


def insert_dependencies(database: str, edges: Sequence[Dependency]) -> None:
    """Write the edges of new jobs, in the caller's transaction (the enqueue's)."""
    Dependency.objects.using(database).bulk_create(edges)


def _job_id(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


def _id_params(database: str, ids: Sequence[uuid.UUID]) -> list:
    field: Any = Job._meta.pk
    connection = connections[database]
    return [field.get_db_prep_value(job_id, connection) for job_id in ids]


def _marks(ids: Sequence[Any]) -> str:
    return ", ".join(["%s"] * len(ids))


def _ids(cursor: Any) -> list[uuid.UUID]:
    return [_job_id(row[0]) for row in cursor.fetchall()]


def resolve(
    database: str, among: Sequence[uuid.UUID], *, now: datetime
) -> tuple[int, int, list[str]]:
    """Release or cancel the pending jobs ``among``, as their parents' states say, in one
    transaction; return (released, cancelled, the queues of the jobs made ready)."""
    if not among:
        return 0, 0, []
    params = _id_params(database, among)
    with transaction.atomic(using=database), connections[database].cursor() as cursor:
        # The failed parents, locked until the end (a retry by hand waits): the decisions
        # below stand when written. In id order, as every lock of job rows is taken.
        cursor.execute(
            f"SELECT DISTINCT parent FROM stalwart_dependency WHERE child IN ({_marks(params)})",
            params,
        )
        parents = _ids(cursor)
        list(
            Job.objects.using(database)
            .select_for_update()
            .filter(pk__in=parents, status="failed")
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        cursor.execute(_BROKEN.format(among=_marks(params)), params)
        doomed: dict[tuple[uuid.UUID, str], list[uuid.UUID]] = defaultdict(list)
        seen: set[uuid.UUID] = set()
        for child, parent, state in cursor.fetchall():
            child_id = _job_id(child)
            if child_id not in seen:
                seen.add(child_id)
                doomed[(_job_id(parent), state)].append(child_id)
        cancelled = 0
        for (parent, state), children in doomed.items():
            error = {
                "exception_class_path": PARENT_FAILED,
                "traceback": (
                    f"This job runs after job {parent}, which {_GONE_WORDS[state]}; it was "
                    "cancelled before it ran (that dependency's on_failure is 'cancel')."
                ),
                "at": now.isoformat(),
                "attempt": 0,
                "process": "",
                "parent": str(parent),
            }
            cancelled += (
                Job.objects.using(database)
                .filter(pk__in=children, status="pending")
                .update(status="cancelled", finished_at=now, errors=[error])
            )
        cursor.execute(_RELEASABLE.format(among=_marks(params)), params)
        ids = _ids(cursor)
        if not ids:
            return 0, cancelled, []
        jobs = Job.objects.using(database)
        released = jobs.filter(pk__in=ids, status="pending").update(
            status=Case(
                When(run_after__gt=now, then=Value("scheduled")),
                When(concurrency_key__isnull=False, then=Value("scheduled")),
                default=Value("ready"),
            ),
            available_at=Case(When(run_after__gt=now, then=F("run_after")), default=Value(now)),
        )
        ready = jobs.filter(pk__in=ids, status="ready").values_list("queue_name", flat=True)
        return released, cancelled, sorted(set(ready))


def pending_children(database: str, parents: Sequence[uuid.UUID]) -> list[uuid.UUID]:
    """The pending jobs that run after any of ``parents``."""
    if not parents:
        return []
    params = _id_params(database, parents)
    with connections[database].cursor() as cursor:
        cursor.execute(_PENDING_CHILDREN.format(parents=_marks(params)), params)
        return _ids(cursor)


def recent_children(database: str, *, since: datetime, limit: int) -> list[uuid.UUID]:
    """The pending jobs that run after a job finished at ``since`` or later."""
    with connections[database].cursor() as cursor:
        vendor = connections[database].vendor
        sql = _RECENT_CHILDREN.format(
            order="STRAIGHT_JOIN" if vendor == "mysql" else "",
            true="1" if vendor == "sqlite" else "TRUE",
            status="+parent.status" if vendor == "sqlite" else "parent.status",
        )
        cursor.execute(sql, [_datetime_param(database, since), limit])
        return _ids(cursor)


def _datetime_param(database: str, moment: datetime) -> Any:
    connection = connections[database]
    return connection.ops.adapt_datetimefield_value(moment)


def pending_page(database: str, *, after: uuid.UUID | None, limit: int) -> list[uuid.UUID]:
    """Up to ``limit`` pending jobs with an id past ``after``, in id order (the sweep)."""
    start = after or uuid.UUID(int=0)
    with connections[database].cursor() as cursor:
        cursor.execute(_PENDING_PAGE, [*_id_params(database, [start]), limit])
        return _ids(cursor)


def revive(database: str, *, limit: int = 1000) -> int:
    """Make pending again the dependants that a parent's failure cancelled, where that
    parent has been retried by hand since (and, round by round, their own dependants);
    return how many.

    A pending job holds its unique key: a dependant with a key that a twin holds now
    (enqueued since it was cancelled) stays cancelled, as a failed job with such a twin
    stays failed at a retry; of twins revivable together, the first (smallest id) comes
    back, and the others stay cancelled, since it then holds the key."""
    mysql = connections[database].vendor == "mysql"
    revivable = _REVIVABLE.format(no_twin=MYSQL_NO_TWIN_HOLDS_KEY if mysql else NO_TWIN_HOLDS_KEY)
    revived = 0
    for _ in range(100):  # a chain of a hundred links comes back in one call
        with transaction.atomic(using=database), connections[database].cursor() as cursor:
            cursor.execute(revivable, [limit])
            chosen: dict[uuid.UUID, str | None] = {}
            for child, errors, parent, key in cursor.fetchall():
                if _cancelled_by(errors) == _job_id(parent):
                    chosen[_job_id(child)] = key
            if not chosen:
                break
            keyless = [job_id for job_id, key in chosen.items() if key is None]
            first_of_key: dict[str, uuid.UUID] = {}
            for job_id in sorted(chosen):
                key = chosen[job_id]
                if key is not None:
                    first_of_key.setdefault(key, job_id)
            if keyless:
                revived += (
                    Job.objects.using(database)
                    .filter(pk__in=keyless, status="cancelled", attempt=0)
                    .update(status="pending", finished_at=None, errors=[])
                )
            if first_of_key:
                revived += _revive_keyed(database, cursor, sorted(first_of_key.values()))
    return revived


def _revive_keyed(database: str, cursor: Any, ids: Sequence[uuid.UUID]) -> int:
    """Make pending again these cancelled dependants (with unique keys, one per key) whose
    key no twin holds; return how many.

    A twin enqueued meanwhile and not yet committed is invisible to the check; the write
    then waits for it, and meets the unique index if it commits: that is an answer (the
    twin holds the key), not an error. The write is undone to a savepoint, nothing of these
    is revived this round, and the next round's look sees the twin and leaves its job
    cancelled."""
    params = _id_params(database, ids)
    try:
        with transaction.atomic(using=database):
            if connections[database].vendor != "mysql":
                cursor.execute(_REVIVE_KEYED.format(among=_marks(params)), params)
                return len(cursor.fetchall())  # (SQLite reports no row count after a WITH)
            cursor.execute(_MYSQL_CHOOSE_KEYED.format(among=_marks(params)), params)
            chosen = [row[0] for row in cursor.fetchall()]
            if not chosen:
                return 0
            cursor.execute(_MYSQL_REVIVE_CHOSEN.format(among=_marks(chosen)), chosen)
            return cursor.rowcount
    except IntegrityError as error:
        if is_unique_conflict(error):
            return 0
        raise


def _cancelled_by(errors: Any) -> uuid.UUID | None:
    """The parent whose end cancelled a job, as its errors record it (None: not so)."""
    import json

    entries = json.loads(errors) if isinstance(errors, str) else errors
    if not entries or entries[-1].get("exception_class_path") != PARENT_FAILED:
        return None
    parent = entries[-1].get("parent")
    return _job_id(parent) if parent else None


def any_pending(database: str) -> bool:
    """Whether some job waits for its parents (the dispatcher then keeps looking). The
    first pending job in id order: the order only the pending jobs' index gives, so the
    planner reads it, not the table (``exists()`` would drop the order, and a table last
    analyzed before jobs became pending is then scanned from its start)."""
    first = Job.objects.using(database).filter(status="pending").order_by("id")
    return bool(first.values_list("id", flat=True)[:1])


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
