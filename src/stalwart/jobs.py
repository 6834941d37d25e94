"""The verbs the roles use on the job table: insert, claim, finish, release, promote.

Roles (backend, worker, supervisor, dispatcher) never hold SQL; they call these. Each verb is
one transaction of ours, retried on transient errors, except ``insert``, which joins the
caller's transaction so that a rolled-back enqueue never existed.
"""

from collections.abc import Sequence
from typing import Any

from django.db import connections, transaction

from stalwart.db import ClaimedJob, NewJob, Outcome, Released, statements_for
from stalwart.db.retry import retry_transient
from stalwart.queues import QueuePattern, QueueSelector


class JobStore:
    """Job-table operations on one database alias, for the calling thread's connection."""

    def __init__(self, database: str, *, notify: bool = True) -> None:
        self.database = database
        self.notify = notify

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

    def claim(
        self,
        *,
        owner: int,
        worker_name: str,
        selector: QueueSelector,
        limit: int,
        paused: Sequence[str] = (),
    ) -> list[ClaimedJob]:
        """Claim up to ``limit`` ready jobs, queue pattern by queue pattern, in order."""
        excluded = list(selector.excluded) + [QueuePattern(name) for name in paused]
        claimed: list[ClaimedJob] = []
        for pattern in selector.patterns:
            wanted = limit - len(claimed)
            if wanted <= 0:
                break

            def claim_pattern(pattern: QueuePattern = pattern, wanted: int = wanted) -> list:
                with self.connection.cursor() as cursor:
                    return self.statements.claim(
                        cursor,
                        owner=owner,
                        worker_name=worker_name,
                        pattern=pattern,
                        excluded=excluded,
                        limit=wanted,
                    )

            claimed.extend(retry_transient(self.database, claim_pattern, what="claim"))
        return claimed

    def _in_transaction(self, what: str, work: Any) -> Any:
        """Run ``work(cursor)`` as one transaction (a single statement needs no BEGIN)."""

        def run() -> Any:
            if self.statements.writes_are_single_statements:
                with self.connection.cursor() as cursor:
                    return work(cursor)
            with transaction.atomic(using=self.database), self.connection.cursor() as cursor:
                return work(cursor)

        return retry_transient(self.database, run, what=what)

    def finish(self, *, owner: int, outcomes: Sequence[Outcome]) -> dict:
        """Write the outcomes we still own; return ``{id: finished_at}`` for those written."""
        if not outcomes:
            return {}
        return self._in_transaction(
            "finish",
            lambda cursor: self.statements.finish(cursor, owner=owner, outcomes=outcomes),
        )

    def release(self, *, owner: int, jobs: Sequence[tuple[Any, int]]) -> list:
        """Give back jobs we hold (graceful stop); return the ids released."""
        if not jobs:
            return []
        return self._in_transaction(
            "release", lambda cursor: self.statements.release(cursor, owner=owner, jobs=jobs)
        )

    def release_owner(self, *, owner: int, error_class: str, error_text: str) -> list[Released]:
        """Take back all jobs of a dead process, failing those at their last attempt."""
        return self._in_transaction(
            "release_owner",
            lambda cursor: self.statements.release_owner(
                cursor, owner=owner, error_class=error_class, error_text=error_text
            ),
        )

    def promote_due(self, *, limit: int = 1000) -> int:
        """Make due scheduled jobs ready (one batch); return how many."""

        def run() -> int:
            with self.connection.cursor() as cursor:
                return self.statements.promote_due(cursor, limit=limit, notify=self.notify)

        return retry_transient(self.database, run, what="promote_due")
