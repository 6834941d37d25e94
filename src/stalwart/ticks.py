"""Enqueueing recurring-task ticks exactly once, however many schedulers run.

The tick's record ``(key, run_at)`` and its job are written in one transaction; the record
goes first, with ``ON CONFLICT DO NOTHING``, so a scheduler that loses the race learns it
from a row count and writes nothing.
"""

from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django.db import connections, transaction
from django.tasks import TaskResult, task_backends

from stalwart.binding import bound_task
from stalwart.db import statements_for
from stalwart.db.retry import retry_transient
from stalwart.ids import uuid7
from stalwart.models import RecurringRun
from stalwart.recurring import RecurringTask

if TYPE_CHECKING:
    from stalwart.interface import Backend


def last_runs(database: str) -> dict[str, datetime]:
    """The latest tick enqueued for each recurring key (one index descent per key)."""
    connection = connections[database]
    statements = statements_for(connection)
    with connection.cursor() as cursor:
        rows = statements.last_ticks(cursor)
    convert = RecurringRun._meta.get_field("run_at")
    return {key: _datetime(connection, convert, value) for key, value in rows}


def _datetime(connection: Any, field: Any, value: Any) -> datetime:
    """A raw cursor's timestamp as the ORM would return it."""
    for converter in connection.ops.get_db_converters(field.get_col(RecurringRun._meta.db_table)):
        value = converter(value, field, connection)
    return value


def database_now(database: str) -> datetime:
    connection = connections[database]
    with connection.cursor() as cursor:
        return statements_for(connection).database_now(cursor)


def enqueue_tick(
    entry: RecurringTask, run_at: datetime, *, alias: str, database: str
) -> TaskResult | None:
    """Enqueue ``entry``'s tick at ``run_at`` unless some scheduler already did (None)."""
    # Recurring entries are OPTIONS of a Stalwart backend: alias is one.
    backend = cast("Backend", task_backends[alias])
    task = bound_task(entry, alias)

    def claim_and_enqueue() -> TaskResult | None:
        job_id = uuid7()
        connection = connections[database]
        with transaction.atomic(using=database):
            with connection.cursor() as cursor:
                if not statements_for(connection).claim_tick(
                    cursor, key=entry.key, run_at=run_at, job_id=job_id
                ):
                    return None
            result: TaskResult = backend.enqueue_with_id(task, entry.args, entry.kwargs, job_id)
            if result.id != str(job_id):
                # A unique task whose twin was still waiting: the tick points at the twin.
                RecurringRun.objects.using(database).filter(key=entry.key, run_at=run_at).update(
                    job_id=result.id
                )
            return result

    return retry_transient(database, claim_and_enqueue, what="enqueue a recurring tick")
