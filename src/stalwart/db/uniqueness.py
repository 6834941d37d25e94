"""Unique keys: a job enqueued with a key that a waiting job (or a running one, for a job
unique while running) already holds is not enqueued again.

The key is held by a unique index on the job's ``unique_key`` in the states that hold it:
a partial index on PostgreSQL and SQLite (``UNIQUE_STATES``); on MySQL, which has none, a
unique index on the generated column ``unique_holder`` (the key in those states, NULL
otherwise). A job holds its key while it waits (for its parents, its time, a slot or a
worker: pending, scheduled, blocked, ready), and while it runs if it is unique while
running. The insert of a unique job is the claim protocol's (``insert_unique``, in
``claims``); here is what keeps the index true when jobs move: a job that goes back to
waiting beside a twin that holds its key lets the key go, and a bulk requeue (or the
revival of cancelled dependants, ``dependencies.revive``) leaves alone a job whose twin
holds the key.
"""

from typing import Any, ClassVar

from stalwart.db.dialect import Dialect
from stalwart.models import Job
from stalwart.models.job import HOLDING_STATES

# The states in which a job holds its unique key (the partial unique index's predicate,
# ``models.job.UNIQUE_STATES``).
_HOLDS_UNIQUE_KEY = (
    f"({{job}}.status IN ({', '.join(f"'{state}'" for state in HOLDING_STATES)}) "
    "OR ({job}.status = 'running' AND {job}.unique_while_running))"
)
# A job may go back to waiting only if no twin (same unique key) holds the key, and, of
# several twins moved in one batch, only the first (smallest id) goes.
# (A job without a key has no twin: ``NULL = key`` is never true. Written as two plain NOT
# EXISTS, not under an ``OR``, so the planner can make them anti-joins on the unique indexes
# rather than one subplan per candidate.) ``NO_TWIN_HOLDS_KEY`` is its first half alone,
# for a caller that picks one job per key itself (``dependencies.revive``).
NO_TWIN_HOLDS_KEY = f"""
    AND NOT EXISTS (
        SELECT 1 FROM stalwart_job AS twin
        WHERE twin.unique_key = candidate.unique_key AND twin.id <> candidate.id
          AND {_HOLDS_UNIQUE_KEY.format(job="twin")})"""
NO_WAITING_TWIN = f"""{NO_TWIN_HOLDS_KEY}
    AND NOT EXISTS (
        SELECT 1 FROM stalwart_job AS sibling
        WHERE sibling.unique_key = candidate.unique_key AND sibling.id < candidate.id
          AND sibling.status = candidate.status)"""


# The same check, as MySQL runs it fast: a job without a key is let through before any
# subquery (MariaDB otherwise walks every job of the candidate's status for each one: 22 s
# for a batch of 500 among 200,000 jobs, against 10 ms), and the twin that holds the key is
# one look-up of the ``unique_holder`` unique index. ``MYSQL_NO_TWIN_HOLDS_KEY`` is its first
# half alone, as ``NO_TWIN_HOLDS_KEY`` is ``NO_WAITING_TWIN``'s.
_MYSQL_TWIN_HOLDS_KEY = """
        NOT EXISTS (
            SELECT 1 FROM stalwart_job AS twin
            WHERE twin.unique_holder = candidate.unique_key AND twin.id <> candidate.id)"""
MYSQL_NO_TWIN_HOLDS_KEY = f"""
    AND (candidate.unique_key IS NULL OR {_MYSQL_TWIN_HOLDS_KEY})"""
MYSQL_NO_WAITING_TWIN = f"""
    AND (candidate.unique_key IS NULL OR ({_MYSQL_TWIN_HOLDS_KEY}
        AND NOT EXISTS (
            SELECT 1 FROM stalwart_job AS sibling
            WHERE sibling.unique_key = candidate.unique_key AND sibling.id < candidate.id
              AND sibling.status = candidate.status)))"""


class Uniqueness(Dialect):
    """The unique index's predicate, and the key of a job leaving ``running``, as SQL."""

    # The unique index's predicate as rendered for each database alias.
    _unique_predicates: ClassVar[dict[str, str]] = {}

    def unique_predicate(self) -> str:
        """The partial unique index's condition, as Django wrote it for this database.

        ``ON CONFLICT`` must name the index's predicate; rendering it the way the migration
        did keeps the two identical on every database.
        """
        predicate = self._unique_predicates.get(self.connection.alias)
        if predicate is None:
            from django.db.models.sql import Query

            from stalwart.models.job import UNIQUE_STATES

            query = Query(model=Job, alias_cols=False)
            where = query.build_where(UNIQUE_STATES)
            sql, params = where.as_sql(
                query.get_compiler(connection=self.connection), self.connection
            )
            editor = self.connection.SchemaEditorClass(self.connection)
            predicate = sql % tuple(editor.quote_value(p) for p in params)
            self._unique_predicates[self.connection.alias] = predicate
        return predicate

    @staticmethod
    def unique_key_leaving(table: str, new_status: str, sibling: str) -> str:
        """``unique_key = ...`` for a job leaving ``running``.

        A job unique only while waiting may have got a twin while it ran. If it now goes back
        to waiting (a retry, a release) beside a twin that holds the key, it drops its key: the
        twin will do the work, this job keeps its own course. ``sibling`` is SQL for "another
        job leaving in this same statement with the same key and a smaller id": of several
        twins leaving at once, only the first may keep the key. Finished jobs keep theirs.
        """
        return f"""unique_key = CASE
            WHEN {table}.unique_key IS NOT NULL
             AND {new_status} IN ('scheduled', 'blocked', 'ready')
             AND (EXISTS (
                     SELECT 1 FROM stalwart_job AS twin
                     WHERE twin.unique_key = {table}.unique_key AND twin.id <> {table}.id
                       AND {_HOLDS_UNIQUE_KEY.format(job="twin")})
                  OR EXISTS ({sibling}))
            THEN NULL ELSE {table}.unique_key END"""


# The states a job leaving ``running`` may go back to, where it would hold its key again
# (never pending: a job waits for its parents before its first run, not after).
_WAITING = ("scheduled", "blocked", "ready")


class MySQLUniqueness(Uniqueness):
    """The key of a job leaving ``running``, decided job by job with a look at the
    ``unique_holder`` index: MySQL's steps move one row per ``UPDATE``."""

    def _twin_holds(self, cursor: Any, key: str, job_id: Any) -> bool:
        """Whether another job holds ``key`` (the unique index's column answers)."""
        cursor.execute(
            "SELECT 1 FROM stalwart_job WHERE unique_holder = %s AND id <> %s",
            [key, job_id],
        )
        return cursor.fetchone() is not None

    def _key_after(
        self, cursor: Any, job_id: Any, key: str | None, status: str, taken: set[str]
    ) -> str | None:
        """The unique key of a job leaving ``running`` for ``status`` (see
        ``Uniqueness.unique_key_leaving``): dropped if it goes back to waiting while a twin
        holds the key, or an earlier job of this same step took it back. A twin that slips
        in between this look and the write meets the unique index (1062), and the step is
        retried: it then sees the twin."""
        if key is None or status not in _WAITING:
            return key
        if key in taken or self._twin_holds(cursor, key, job_id):
            return None
        taken.add(key)
        return key
