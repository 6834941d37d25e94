"""Wake-ups: telling idle workers that a queue has a ready job, and dispatchers that a
scheduled job is due, the moment it happens (where the database can: PostgreSQL's
LISTEN/NOTIFY; elsewhere, workers and dispatchers poll).

A notification is transactional: it is delivered when the transaction that sent it commits,
not before. Its payload is a queue name or a time, never a job's arguments (8,000 bytes at
most). The claim protocol's own statements on PostgreSQL send theirs in the statement that
makes the job ready (``claims/postgresql.py``); the methods here serve the rest.
"""

from collections.abc import Sequence
from typing import Any

from stalwart.db.dialect import Dialect

CHANNEL = "stalwart"  # payload: a queue that has a new ready job, or was resumed (below)
# A resume's payload: this prefix, then the queue. A queue name has no ':', so no queue's
# payload looks like it. A worker reads its pauses again for a resume, and need not wake at
# all for a new job in a queue it knows is paused.
RESUMED = "resumed:"


def read_payload(payload: str) -> tuple[str, bool]:
    """A notification's queue, and whether it was resumed (rather than given a job)."""
    if payload.startswith(RESUMED):
        return payload[len(RESUMED) :], True
    return payload, False


# Payload: when a new scheduled job is due, in seconds since the epoch on the database's
# clock. Dispatchers sleep until their next due job, and wake for one due sooner.
SCHEDULED_CHANNEL = "stalwart_scheduled"


class Wakeups(Dialect):
    """Nothing to send where nobody listens; only PostgreSQL's dispatchers ask ``next_due``."""

    def notify(self, cursor: Any, queue_names: Sequence[str]) -> None:
        """Wake idle workers serving these queues (where the database can)."""

    def notify_scheduled(
        self, cursor: Any, *, due_in: float | None = None, due_at: Any = None
    ) -> None:
        """Tell dispatchers a scheduled job is due (only where they listen: PostgreSQL)."""

    def next_due(self, cursor: Any) -> tuple[float, float | None]:
        """The database clock now and the earliest scheduled job's due time, in epoch
        seconds (only where dispatchers listen: PostgreSQL)."""
        raise NotImplementedError


class PostgreSQLWakeups(Wakeups):
    """``pg_notify`` on the two channels: queue names, and due times in epoch seconds."""

    def notify(self, cursor: Any, queue_names: Sequence[str]) -> None:
        if queue_names:
            cursor.execute(
                f"SELECT count(pg_notify('{CHANNEL}', q)) FROM unnest(%s::text[]) AS q",
                [sorted(set(queue_names))],
            )

    def notify_scheduled(
        self, cursor: Any, *, due_in: float | None = None, due_at: Any = None
    ) -> None:
        """Tell dispatchers that a job is due ``due_in`` seconds from now, or at ``due_at``."""
        if due_at is None:
            due = "now() + make_interval(secs => %s)"
            params = [due_in]
        else:
            due = "GREATEST(%s::timestamptz, now())"
            params = [due_at]
        cursor.execute(
            f"SELECT pg_notify('{SCHEDULED_CHANNEL}', extract(epoch FROM {due})::text)", params
        )

    def next_due(self, cursor: Any) -> tuple[float, float | None]:
        """The database clock now, and when the earliest scheduled job is due (None: no
        scheduled job), in seconds since the epoch."""
        cursor.execute(
            "SELECT extract(epoch FROM now())::float8, (SELECT extract(epoch FROM available_at)"
            "::float8 FROM stalwart_job WHERE status = 'scheduled' ORDER BY available_at LIMIT 1)"
        )
        return cursor.fetchone()
