"""PostgreSQL: the claim protocol as single statements, with LISTEN/NOTIFY wake-ups.

Read top to bottom: insert (and notify on commit), claim (lock with SKIP LOCKED inside a
materialised CTE, so the planner cannot run the LIMIT subquery twice), finish (fenced on
owner and attempt), release, take back a dead owner's jobs, promote due scheduled jobs.
Statements that lock rows another statement may also lock take them in id order (a
materialised ``SELECT … ORDER BY id FOR UPDATE`` first), so they do not deadlock each
other; were a deadlock to happen anyway, it is retried as a transient error.

Only the database's clock decides: a job's state and times at insert, when a retry may run,
when a scheduled job is due, when a process is silent, when a row is old. Hosts may disagree
about the time; the database never disagrees with itself.
"""

import functools
import re
from collections.abc import Sequence
from typing import Any

from django.db import DatabaseError

from stalwart import events
from stalwart.db.claims import NO_LIVE_OWNER, Claims
from stalwart.db.rows import (
    CLAIM_COLUMNS,
    INSERT_COLUMNS,
    INSERT_CONSTANTS,
    ClaimedJob,
    Death,
    Interruption,
    NewJob,
    Outcome,
    Released,
)
from stalwart.db.uniqueness import Uniqueness
from stalwart.db.wakeups import CHANNEL, SCHEDULED_CHANNEL
from stalwart.queues import QueuePattern

SMALL_INSERT = 20  # rows up to which an insert sends VALUES rather than arrays
# Another job given back in the same statement with the same unique key and a smaller id.
_SIBLING_IN_VERDICT = """
    SELECT 1 FROM verdict AS other_verdict JOIN stalwart_job AS other ON other.id = other_verdict.id
    WHERE other.unique_key = job.unique_key AND other.id < job.id"""
# A job given back is charged if it is blamed (the one suspect of a death), or if it has used
# up its free interruptions; charged at its last attempt, it has failed for good.
_CHARGED = "(verdict.blamed OR verdict.exhausted)"
# Whether a job has used up its free interruptions (read from the row before the update).
_EXHAUSTED = "jsonb_array_length(held_job.interruptions) >= held_job.max_interruptions"
_FAILS = f"({_CHARGED} AND jsonb_array_length(job.errors) + 1 >= job.max_attempts)"
# The type of each column an insert writes, for the casts of its parameters.
_COLUMN_TYPES = {
    "id": "uuid",
    "task_path": "text",
    "backend": "text",
    "queue_name": "text",
    "priority": "smallint",
    "status": "text",
    "args": "jsonb",
    "kwargs": "jsonb",
    "run_after": "timestamptz",
    "available_at": "timestamptz",
    "enqueued_at": "timestamptz",
    "max_attempts": "integer",
    "attempt": "integer",
    "worker_ids": "jsonb",
    "errors": "jsonb",
    "concurrency_key": "text",
    "concurrency_limit": "integer",
    "concurrency_duration": "float8",
    "unique_key": "text",
    "unique_while_running": "boolean",
    "max_interruptions": "integer",
    "interruptions": "jsonb",
}
_INSERT_TYPES = [_COLUMN_TYPES[name] for name in INSERT_COLUMNS]
_INSERT_INTO = f"INSERT INTO stalwart_job ({', '.join([*INSERT_COLUMNS, *INSERT_CONSTANTS])})"
# Typed, since PostgreSQL would read an untyped literal in a VALUES list as text.
_CONSTANTS = [f"{value}::{_COLUMN_TYPES[name]}" for name, value in INSERT_CONSTANTS.items()]
# Whether a new job is due, and since when, is the database clock's verdict on its
# run_after (enqueued_at stays the caller's record of when it called enqueue).
_BY_THE_DATABASE_CLOCK = {
    "status": "CASE WHEN row.status = 'pending' THEN 'pending' "
    "WHEN row.run_after > now() THEN 'scheduled' "
    "WHEN row.concurrency_key IS NOT NULL THEN 'blocked' ELSE 'ready' END",
    "available_at": "GREATEST(row.run_after, now())",
}
_ROW = f"row({', '.join(INSERT_COLUMNS)})"


def _insert_select(*, cast_json: bool) -> str:
    columns = [
        _BY_THE_DATABASE_CLOCK.get(name)
        or (f"row.{name}::jsonb" if cast_json and kind == "jsonb" else f"row.{name}")
        for name, kind in zip(INSERT_COLUMNS, _INSERT_TYPES, strict=True)
    ]
    return f"{_INSERT_INTO} SELECT {', '.join(columns + _CONSTANTS)}"


# A few rows go as VALUES (cheap to send)...
_VALUES_ROW = "(" + ", ".join(f"%s::{kind}" for kind in _INSERT_TYPES) + ")"
_INSERT_VALUES = _insert_select(cast_json=False) + " FROM (VALUES {rows}) AS " + _ROW
# ...many as one array per column that differs between the rows (JSON as text, cast on
# the way out), and one value for each column the rows share: the jobs of one
# enqueue_many() share all but their ids and arguments.
_INSERT_TAKEN_AS = {kind: "text" if kind == "jsonb" else kind for kind in _INSERT_TYPES}


@functools.cache
def _insert_unnest(varying: tuple[bool, ...]) -> str:
    """The insert for the columns flagged ``varying`` sent as arrays (after the shared
    values, in column order)."""
    columns = zip(INSERT_COLUMNS, _INSERT_TYPES, varying, strict=True)
    select, arrays, names = [], [], []
    for name, kind, varies in columns:
        if varies:
            select.append(f"u.{name}")
            arrays.append(f"%s::{_INSERT_TAKEN_AS[kind]}[]")
            names.append(name)
        else:
            select.append(f"%s::{_INSERT_TAKEN_AS[kind]} AS {name}")
    return (
        _insert_select(cast_json=True)
        + f" FROM (SELECT {', '.join(select)} FROM unnest({', '.join(arrays)})"
        + f" AS u({', '.join(names)})) AS row"
    )


def _unnest_params(rows: list[list]) -> tuple[tuple[bool, ...], list]:
    """Which columns differ between ``rows``, and the parameters of ``_insert_unnest``."""
    columns = [list(column) for column in zip(*rows, strict=True)]
    varying = tuple(column.count(column[0]) != len(column) for column in columns)
    shared = [column[0] for column, varies in zip(columns, varying, strict=True) if not varies]
    arrays = [column for column, varies in zip(columns, varying, strict=True) if varies]
    return varying, shared + arrays


# One row (a single enqueue) goes as a plain INSERT ... VALUES, the clock's verdicts
# computed in place, and its notification sent from RETURNING: a quarter cheaper than the
# statement of several rows, whose subquery and aggregates cost as much as the insert.
_INSERT_ONE = (
    f"{_INSERT_INTO} VALUES ("
    + ", ".join(
        re.sub(r"row\.(\w+)", lambda column: f"%({column[1]})s::{_COLUMN_TYPES[column[1]]}", sql)
        for sql in (_BY_THE_DATABASE_CLOCK.get(name) or f"row.{name}" for name in INSERT_COLUMNS)
    )
    + ", "
    + ", ".join(_CONSTANTS)
    + ")"
)
# (A CASE calls pg_notify only for the branch taken: a blocked job notifies no one.)
_INSERT_ONE_NOTIFIED = f"""{_INSERT_ONE}
    RETURNING CASE status
        WHEN 'ready' THEN pg_notify('{CHANNEL}', queue_name)
        WHEN 'scheduled'
            THEN pg_notify('{SCHEDULED_CHANNEL}', extract(epoch FROM available_at)::text)
    END"""

# The end of a release (of given jobs, or of a dead owner's): wake the workers of the
# queues that have a job ready again, and list what was released.
_WAKE_AND_LIST_RELEASED = f"""
            wake AS (
                SELECT pg_notify('{CHANNEL}', q)
                FROM (SELECT DISTINCT queue_name AS q FROM released WHERE status = 'ready') AS qs
            )
            SELECT id, status, queue_name, concurrency_key, task_path, charged
            FROM released, (SELECT count(*) FROM wake) AS woken
            """
# Giving back running jobs (a stop, a death): each as its ``verdict`` row says (blamed, to
# be isolated, the error and the cause), charged as the ``Death`` rules say, then the wake-up.
_GIVE_BACK = f"""
            released AS (
                UPDATE stalwart_job AS job
                SET status = CASE WHEN {_FAILS} THEN 'failed' ELSE {{waiting}} END,
                    finished_at = CASE WHEN {_FAILS} THEN now() END,
                    available_at = CASE WHEN {_CHARGED} THEN now() ELSE job.available_at END,
                    owner = NULL,
                    isolated = job.isolated OR verdict.isolate,
                    {{unique_key}},
                    errors = CASE WHEN {_CHARGED} THEN
                        job.errors || jsonb_build_array(jsonb_build_object(
                            'exception_class_path',
                            CASE WHEN verdict.blamed THEN verdict.error_class
                                 ELSE verdict.exhausted_class END,
                            'traceback', verdict.error_text, 'attempt', job.attempt,
                            'at', now(), 'process', %s::text))
                        ELSE job.errors END,
                    interruptions = CASE WHEN {_CHARGED} THEN job.interruptions ELSE
                        job.interruptions || jsonb_build_array(jsonb_build_object(
                            'attempt', job.attempt, 'cause', verdict.cause, 'at', now(),
                            'process', %s::text))
                        END
                FROM verdict
                WHERE job.id = verdict.id AND job.status = 'running' AND job.owner = %s
                RETURNING job.id, job.status, job.queue_name, job.concurrency_key,
                          job.task_path, {_CHARGED} AS charged
            ),{_WAKE_AND_LIST_RELEASED}"""
_RETURNING = ", ".join(f"job.{name}" for name in CLAIM_COLUMNS)
# Rows written by finish_and_claim, in the claim's columns: their finish time stands in
# last_attempted_at, the rest is NULL.
_FINISHED_AS_CLAIMED = ", ".join(
    "finished.finished_at"
    if name == "last_attempted_at"
    else ("finished.id" if name == "id" else "NULL")
    for name in CLAIM_COLUMNS
)


def _server_bound_cursor(connection: Any, *, prepare: bool = False) -> Any:
    """A psycopg cursor that binds on the server. It never prepares its statements, unless
    ``prepare``: a prepared statement lives in one server session, which a pooler in
    transaction mode (PgBouncer) does not keep from one transaction to the next. psycopg
    prepares one only on a session whose ``prepare_threshold`` is set: the queue's own
    sessions not behind such a pooler (``stalwart.db.session``); elsewhere ``prepare`` is
    ignored, and the statement is bound without being prepared."""
    return _bound_cursor_class(prepare)(connection)


@functools.cache
def _bound_cursor_class(prepare: bool) -> type:
    import psycopg  # here: SQLite-only projects import this module without psycopg

    class Bound(psycopg.Cursor):
        def execute(self, query: Any, params: Any = None, **options: Any) -> Any:
            return super().execute(query, params, **{**options, "prepare": prepare})

    return Bound


def _quoted(text: str | None) -> str:
    """One element of an array literal: ``NULL``, or the text in double quotes (with its
    backslashes and double quotes escaped, as the array parser reads them)."""
    if text is None:
        return "NULL"
    return '"' + str(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _array_literal(elements: Sequence[str]) -> str:
    """``{a,b,...}``: elements already written as the array parser reads them."""
    return "{" + ",".join(elements) + "}"


@functools.lru_cache(maxsize=64)
def _compact_bound(sql: str) -> str:
    """``sql`` with its parameters bound in binary (``%b``), without its indentation and
    comment lines: psycopg parses a statement's placeholders once and keeps the result only
    for statements up to 4,096 characters (otherwise each call pays for it again)."""
    lines = (line.strip() for line in sql.replace("%s", "%b").splitlines())
    return "\n".join(line for line in lines if line and not line.startswith("--"))


def _prepared_statement_lost(error: BaseException) -> bool:
    """Whether ``error`` says the session does not have the prepared statement psycopg
    knows it made (or has one of that name already): a pooler in transaction mode that
    nobody told us about has handed us another server session."""
    state = getattr(error.__cause__ or error, "sqlstate", None)
    return state in ("26000", "42P05")  # invalid_sql_statement_name, duplicate_prepared_...


class PostgreSQLClaims(Claims):
    insert_chunk = 5000  # unnest() takes one array per column, whatever the row count
    writes_are_single_statements = True

    def insert_chunk_of(self, cursor: Any, jobs: Sequence[NewJob], notify: bool) -> None:
        if len(jobs) == 1:
            named = dict(zip(INSERT_COLUMNS, self.insert_params(jobs[0]), strict=True))
            cursor.execute(_INSERT_ONE_NOTIFIED if notify else _INSERT_ONE, named)
            return
        rows = [self.insert_params(job) for job in jobs]
        if len(jobs) <= SMALL_INSERT:
            params = [value for row in rows for value in row]
            insert = _INSERT_VALUES.format(rows=", ".join([_VALUES_ROW] * len(jobs)))
        else:
            varying, params = _unnest_params(rows)
            insert = _insert_unnest(varying)
        if notify:
            # NOTIFY is transactional: idle workers wake when the enqueue commits, not
            # before. Each status is the database clock's verdict: the queues of the new
            # ready jobs, and the earliest new scheduled job for the dispatchers.
            insert = f"""
            WITH inserted AS ({insert} RETURNING status, queue_name, available_at)
            SELECT (SELECT count(*) FROM inserted),
                   (SELECT count(pg_notify('{CHANNEL}', q)) FROM (
                        SELECT DISTINCT queue_name AS q FROM inserted WHERE status = 'ready'
                    ) AS qs),
                   (SELECT count(pg_notify('{SCHEDULED_CHANNEL}', extract(epoch FROM due)::text))
                    FROM (SELECT min(available_at) AS due FROM inserted
                          WHERE status = 'scheduled') AS earliest WHERE due IS NOT NULL)
            """
        if len(jobs) <= SMALL_INSERT or self.connection.queries_logged:
            # (Logged queries, as under DEBUG: Django's logging cursor, which binds here.)
            cursor.execute(insert, params)
            return
        # Many rows: the arrays go as parameters, in binary, on a cursor of the same
        # connection (so in the caller's transaction, through its execute wrappers) that
        # binds on the server. Django's cursors bind on the client, quoting every element
        # of every array into the SQL text: half the time of a bulk enqueue.
        raw = getattr(cursor, "cursor", cursor).connection
        with self.connection.make_cursor(_server_bound_cursor(raw)) as server_cursor:
            server_cursor.execute(insert.replace("%s", "%b"), params)

    def insert_unique(self, cursor: Any, job: NewJob, notify: bool) -> bool:
        cursor.execute(
            f"{_INSERT_VALUES.format(rows=_VALUES_ROW)} "
            f"ON CONFLICT (unique_key) WHERE {self.unique_predicate()} DO NOTHING "
            "RETURNING status",
            self.insert_params(job),
        )
        row = cursor.fetchone()
        if row is not None and notify and row[0] == "ready":
            self.notify(cursor, [job.queue_name])
        if row is not None and notify and row[0] == "scheduled":
            self.notify_scheduled(cursor, due_at=job.run_after or job.available_at)
        return row is not None

    # The claim, in two parts so that it can also follow a finish in one statement. The rows
    # are picked (``_picked``) by a scan of one partial index, the same in both statements.
    _CLAIMANT = """
            claimant AS MATERIALIZED (
                -- Only a registered process claims, and its row cannot be pruned until this
                -- claim commits: a prune then finds these jobs and releases them.
                SELECT id FROM stalwart_process WHERE id = %s FOR KEY SHARE
            )"""
    # Every queue with a ready job, one index descent each (a loose scan of claim_queue):
    # what a claim on several queues walks, never the rows of the queues it leaves out.
    _READY_QUEUES = """
            ready_queue(queue_name) AS (
                SELECT min(queue_name) FROM stalwart_job WHERE status = 'ready'
                UNION ALL
                SELECT (SELECT min(later.queue_name) FROM stalwart_job AS later
                        WHERE later.status = 'ready' AND later.queue_name > ready_queue.queue_name)
                FROM ready_queue WHERE ready_queue.queue_name IS NOT NULL
            )"""
    # The rows picked were ready when locked, and stay so (ours, locked) until this write;
    # its check of the state is a second fence, written so that it matches no partial index
    # on ready jobs: with statistics that say none is ready (last analyzed when the queue
    # was quiet, before a backlog came), the planner would read such an index whole, every
    # ready job, to join it with the rows picked, instead of fetching each by id.
    _CLAIM_UPDATE = """
            UPDATE stalwart_job AS job
            SET status = 'running',
                owner = %s,
                attempt = job.attempt + 1,
                started_at = COALESCE(job.started_at, now()),
                last_attempted_at = now(),
                worker_ids = job.worker_ids || jsonb_build_array(%s::text)
            FROM picked
            WHERE job.id = picked.id AND job.status || '' = 'ready'
            RETURNING {returning}"""

    def _picked(
        self, pattern: QueuePattern, excluded: Sequence[QueuePattern], limit: int, isolated: bool
    ) -> tuple[str, list, bool]:
        """The CTEs that choose and lock the rows to claim: SQL, parameters, and whether it
        needs ``WITH RECURSIVE``.

        Each shape reads one partial index in its own order, so no plan filters the rows of
        a queue it does not claim from (see docs/explanation/claim-protocol.md):

        - one named queue: ``stalwart_job_claim_queue``, the queue's own range. The queue is
          written ``= ANY(array)`` and the order starts with it, an order only that index
          gives without a sort. ``claim_any`` cannot serve it at all: that index's
          condition has a term on the priority that only the claim on every queue states,
          so the planner cannot pick it and filter out the rows of other queues, whatever
          the statistics say (statistics taken when nothing was ready price both at a row).
        - every queue (``*``), none left out: ``stalwart_job_claim_any``, its head (the
          claim says ``priority >= -100``, true of every job, to match its condition).
        - a prefix, or ``*`` with queues left out (paused, ``!name``): the ready queues are
          listed by a loose scan, those claimed from kept, and each one's head read from
          ``claim_queue`` (up to ``limit`` rows each, locked, the best ``limit`` kept).
        - isolated jobs (one at a time, rare): the small ``stalwart_job_isolated`` index.

        The limit is written into the text, not passed: a prepared statement's generic plan
        (``_fetch_prepared``) would take a parameter for a tenth of the table.
        """
        limit = int(limit)  # written into the SQL: an int, whatever it came as
        claimant = "AND EXISTS (SELECT 1 FROM claimant)"
        if isolated:
            conditions, params = self.queue_filter(pattern, excluded)
            return (
                f"""
            picked AS MATERIALIZED (
                SELECT id FROM stalwart_job
                WHERE status = 'ready' AND isolated {conditions} {claimant}
                ORDER BY priority DESC, available_at, id
                LIMIT {limit}
                FOR UPDATE SKIP LOCKED
            )""",
                params,
                False,
            )
        exclusions, exclusion_params = self.queue_filter(QueuePattern("", is_prefix=True), excluded)
        if not pattern.is_prefix:
            return (
                f"""
            picked AS MATERIALIZED (
                SELECT id FROM stalwart_job
                WHERE status = 'ready' AND NOT isolated AND queue_name = ANY(%s::text[])
                  {exclusions} {claimant}
                ORDER BY queue_name, priority DESC, available_at, id
                LIMIT {limit}
                FOR UPDATE SKIP LOCKED
            )""",
                [[pattern.name], *exclusion_params],
                False,
            )
        if pattern.matches_all and not excluded:
            return (
                f"""
            picked AS MATERIALIZED (
                SELECT id FROM stalwart_job
                WHERE status = 'ready' AND priority >= -100 AND NOT isolated {claimant}
                ORDER BY priority DESC, available_at, id
                LIMIT {limit}
                FOR UPDATE SKIP LOCKED
            )""",
                [],
                False,
            )
        conditions, params = self.queue_filter(pattern, excluded)
        return (
            f""",{self._READY_QUEUES},
            picked AS MATERIALIZED (
                SELECT head.id FROM (
                    SELECT queue_name FROM ready_queue
                    WHERE queue_name IS NOT NULL {conditions}
                ) AS queue
                CROSS JOIN LATERAL (
                    SELECT id, priority, available_at FROM stalwart_job
                    WHERE status = 'ready' AND NOT isolated
                      AND queue_name = ANY(ARRAY[queue.queue_name]) {claimant}
                    ORDER BY queue_name, priority DESC, available_at, id
                    LIMIT {limit}
                    FOR UPDATE SKIP LOCKED
                ) AS head
                ORDER BY head.priority DESC, head.available_at, head.id
                LIMIT {limit}
            )""",
            params,
            True,
        )

    def _claim_ctes(
        self, pattern: QueuePattern, excluded: Sequence[QueuePattern], limit: int, isolated: bool
    ) -> tuple[str, list, bool]:
        picked, params, recursive = self._picked(pattern, excluded, limit, isolated)
        if recursive:  # the ready queues' CTE comes between the claimant and the pick
            return self._CLAIMANT + picked, params, True
        return self._CLAIMANT + "," + picked, params, False

    def claim(
        self,
        cursor: Any,
        *,
        owner: int,
        worker_name: str,
        pattern: QueuePattern,
        excluded: Sequence[QueuePattern],
        limit: int,
        isolated: bool = False,
    ) -> list[ClaimedJob]:
        ctes, params, recursive = self._claim_ctes(pattern, excluded, limit, isolated)
        cursor.execute(
            ("WITH RECURSIVE" if recursive else "WITH")
            + ctes
            + self._CLAIM_UPDATE.format(returning=_RETURNING),
            [owner, *params, owner, worker_name],
        )
        return self.claimed_from_rows(cursor.fetchall())

    # The finish, likewise in parts: the outcomes, the rows still ours locked in id order,
    # then the update.
    _OUTCOME_CTES = """
            outcome AS MATERIALIZED (
                SELECT * FROM unnest(
                    %s::uuid[], %s::integer[], %s::text[], %s::text[], %s::text[],
                    %s::float8[], %s::boolean[]
                ) AS o(id, attempt, status, return_value, errors, retry_in, keep_owner)
            ),
            ours AS MATERIALIZED (
                SELECT job.id FROM stalwart_job AS job JOIN outcome ON outcome.id = job.id
                WHERE job.status = 'running' AND job.owner = %s AND job.attempt = outcome.attempt
                ORDER BY job.id
                FOR UPDATE OF job
            )"""
    _SIBLING_IN_OUTCOME = """
            SELECT 1 FROM outcome AS other_outcome
            JOIN stalwart_job AS other ON other.id = other_outcome.id
            WHERE other.unique_key = job.unique_key AND other.id < job.id
              AND other_outcome.status IN ('scheduled', 'blocked', 'ready')"""

    _FINISH_UPDATE = f"""
            UPDATE stalwart_job AS job
            SET status = outcome.status,
                owner = CASE WHEN outcome.keep_owner THEN job.owner END,
                isolated = false,
                finished_at = CASE WHEN outcome.status IN ('successful', 'failed', 'cancelled')
                                   THEN now() END,
                available_at = CASE WHEN outcome.retry_in IS NULL THEN job.available_at
                                    ELSE now() + make_interval(secs => outcome.retry_in) END,
                return_value = outcome.return_value::jsonb,
                errors = COALESCE(outcome.errors::jsonb, job.errors),
                {Uniqueness.unique_key_leaving("job", "outcome.status", _SIBLING_IN_OUTCOME)}
            FROM outcome JOIN ours ON ours.id = outcome.id
            WHERE job.id = outcome.id
              AND job.status = 'running' AND job.owner = %s AND job.attempt = outcome.attempt
            RETURNING job.id, job.finished_at"""

    @staticmethod
    def _outcome_params(outcomes: Sequence[Outcome], owner: int) -> list:
        """The outcome arrays, each as one array literal the server parses (a text
        parameter), not a list the driver adapts element by element in Python."""
        # Outcomes go in id order, so concurrent writers lock rows in one order.
        outcomes = sorted(outcomes, key=lambda outcome: outcome.id)
        return [
            _array_literal([str(outcome.id) for outcome in outcomes]),
            _array_literal([str(outcome.attempt) for outcome in outcomes]),
            _array_literal([_quoted(outcome.status) for outcome in outcomes]),
            _array_literal([_quoted(outcome.return_value) for outcome in outcomes]),
            _array_literal([_quoted(outcome.errors) for outcome in outcomes]),
            _array_literal(
                [
                    "NULL" if outcome.retry_in is None else repr(float(outcome.retry_in))
                    for outcome in outcomes
                ]
            ),
            _array_literal(["t" if outcome.keep_owner else "f" for outcome in outcomes]),
            owner,
        ]

    def finish(self, cursor: Any, *, owner: int, outcomes: Sequence[Outcome]) -> dict:
        cursor.execute(
            "WITH" + self._OUTCOME_CTES + self._FINISH_UPDATE,
            [*self._outcome_params(outcomes, owner), owner],
        )
        return dict(cursor.fetchall())

    can_finish_and_claim = True

    def _fetch_prepared(self, cursor: Any, sql: str, params: list) -> list:
        """Run a statement of a busy worker's every turn, and return its rows: bound on the
        server (its arrays go as binary parameters, not quoted into the SQL text) and, on a
        session that allows it, prepared. Planned at every call, such a statement spends
        more time being planned than being run; prepared, PostgreSQL plans it a few times,
        then keeps a generic plan if that plan is as cheap as the custom ones were (every
        limit is written into the text for that: a parameter would be planned as a tenth of
        the table).

        Behind a pooler in transaction mode that nobody told us about, a prepared statement
        vanishes with its server session: then this connection prepares nothing more."""
        if self.connection.queries_logged:
            # Logged queries, as under DEBUG: Django's logging cursor, which binds here.
            cursor.execute(sql, params)
            return cursor.fetchall()
        raw = getattr(cursor, "cursor", cursor).connection
        sql = _compact_bound(sql)
        with self.connection.make_cursor(_server_bound_cursor(raw, prepare=True)) as bound:
            try:
                bound.execute(sql, params)
            except DatabaseError as error:
                if not _prepared_statement_lost(error) or self.connection.in_atomic_block:
                    raise
                # Not run: the server refused to bind it (or to prepare it). Again, unprepared.
                raw.prepare_threshold = None
                events.emit(
                    "prepared_statements_lost",
                    error=f"{type(error).__name__}: {error}",
                    reason="the server session changed under the connection (a pooler in "
                    "transaction mode?): its statements are no longer prepared",
                )
                bound.execute(sql, params)
            return bound.fetchall()

    def finish_and_claim(
        self,
        cursor: Any,
        *,
        owner: int,
        outcomes: Sequence[Outcome],
        worker_name: str,
        pattern: QueuePattern,
        excluded: Sequence[QueuePattern],
        limit: int,
        isolated: bool = False,
    ) -> tuple[dict, list[ClaimedJob]]:
        """Write outcomes and claim new jobs in one statement: one round trip, one commit.

        The two updates touch different rows (running ones, ready ones), and each keeps its
        own conditions: the finish is fenced on owner and attempt, the claim skips locked
        rows and needs the claimant's row, exactly as when they run apart.
        """
        ctes, params, recursive = self._claim_ctes(pattern, excluded, limit, isolated)
        rows = self._fetch_prepared(
            cursor,
            ("WITH RECURSIVE" if recursive else "WITH")
            + self._OUTCOME_CTES
            + ",\n            finished AS ("
            + self._FINISH_UPDATE
            + "),"
            + ctes
            + ",\n            claimed AS ("
            + self._CLAIM_UPDATE.format(returning=_RETURNING)
            + f")\n            SELECT 'c', {', '.join(CLAIM_COLUMNS)} FROM claimed"
            + f"\n            UNION ALL SELECT 'f', {_FINISHED_AS_CLAIMED} FROM finished",
            [
                *self._outcome_params(outcomes, owner),
                owner,
                owner,
                *params,
                owner,
                worker_name,
            ],
        )
        finished_at = CLAIM_COLUMNS.index("last_attempted_at")
        written = {row[1]: row[1 + finished_at] for row in rows if row[0] == "f"}
        claimed = self.claimed_from_rows([row[1:] for row in rows if row[0] == "c"])
        return written, claimed

    def _give_back(self) -> str:
        return _GIVE_BACK.format(
            waiting=self.status_after_release("job"),
            unique_key=self.unique_key_leaving(
                "job", f"CASE WHEN {_FAILS} THEN 'failed' ELSE 'ready' END", _SIBLING_IN_VERDICT
            ),
        )

    def release_rows(
        self, cursor: Any, *, owner: int, jobs: Sequence[Interruption], process: str = ""
    ) -> list[Released]:
        jobs = sorted(jobs, key=lambda job: job.id)
        cursor.execute(
            f"""
            WITH given AS MATERIALIZED (
                SELECT * FROM unnest(%s::uuid[], %s::integer[], %s::text[], %s::text[],
                                     %s::text[])
                    AS g(id, attempt, cause, error_class, error_text)
            ),
            mine AS MATERIALIZED (
                SELECT job.id FROM stalwart_job AS job JOIN given ON given.id = job.id
                WHERE job.status = 'running' AND job.owner = %s AND job.attempt = given.attempt
                ORDER BY job.id
                FOR UPDATE OF job
            ),
            verdict AS MATERIALIZED (
                SELECT given.id, false AS blamed, {_EXHAUSTED} AS exhausted, false AS isolate,
                       given.cause, given.error_class AS exhausted_class, given.error_class,
                       given.error_text
                FROM given JOIN mine ON mine.id = given.id
                JOIN stalwart_job AS held_job ON held_job.id = given.id
            ),{self._give_back()}""",
            [
                [job.id for job in jobs],
                [job.attempt for job in jobs],
                [job.cause for job in jobs],
                [job.error_class for job in jobs],
                [job.error for job in jobs],
                owner,
                process,
                process,
                owner,
            ],
        )
        return [Released(*row) for row in cursor.fetchall()]

    def release_owner_rows(
        self,
        cursor: Any,
        *,
        owner: int,
        error_class: str,
        error_text: str,
        death: Death = Death.CRASH,
        suspects: Sequence[Any] | None = None,
        process: str = "",
    ) -> list[Released]:
        everyone = death == Death.CRASH and suspects is None
        named = list(suspects or []) if death == Death.CRASH else []
        cursor.execute(
            f"""
            WITH held AS MATERIALIZED (
                SELECT id FROM stalwart_job
                WHERE status = 'running' AND owner = %s
                ORDER BY id
                FOR UPDATE
            ),
            suspect AS MATERIALIZED (
                SELECT id, %s::boolean OR id = ANY(%s::uuid[]) AS suspected FROM held
            ),
            -- One suspect alone is blamed; several are each isolated, and not blamed.
            verdict AS MATERIALIZED (
                SELECT suspect.id,
                       suspect.suspected AND tally.suspects = 1 AS blamed,
                       {_EXHAUSTED} AS exhausted,
                       suspect.suspected AS isolate,
                       %s::text AS cause, %s::text AS error_class, %s::text AS error_text,
                       'stalwart.exceptions.JobInterrupted'::text AS exhausted_class
                FROM suspect
                JOIN stalwart_job AS held_job ON held_job.id = suspect.id
                CROSS JOIN (
                    SELECT count(*) FILTER (WHERE suspected) AS suspects FROM suspect
                ) AS tally
            ),{self._give_back()}""",
            [
                owner,
                everyone,
                named,
                error_text,
                error_class,
                error_text,
                process,
                process,
                owner,
            ],
        )
        return [Released(*row) for row in cursor.fetchall()]

    def promote_due(self, cursor: Any, *, limit: int, notify: bool) -> tuple[int, list]:
        # Jobs with a concurrency key wait for a slot (blocked); the others are ready.
        wake = (
            f", wake AS (SELECT pg_notify('{CHANNEL}', q) "
            "FROM (SELECT DISTINCT queue_name AS q FROM promoted WHERE status = 'ready') AS qs)"
            if notify
            else ""
        )
        cursor.execute(
            f"""
            WITH due AS MATERIALIZED (
                SELECT id FROM stalwart_job AS candidate
                WHERE status = 'scheduled' AND available_at <= now() {NO_LIVE_OWNER}
                ORDER BY available_at, id
                LIMIT %s
                FOR UPDATE SKIP LOCKED
            ),
            promoted AS (
                UPDATE stalwart_job AS job
                SET status = CASE WHEN job.concurrency_key IS NULL THEN 'ready'
                                  ELSE 'blocked' END,
                    owner = NULL
                FROM due WHERE job.id = due.id AND job.status = 'scheduled'
                RETURNING job.queue_name, job.status, job.concurrency_key
            ){wake}
            SELECT count(*), array_remove(array_agg(DISTINCT concurrency_key), NULL)
                   {", (SELECT count(*) FROM wake)" if notify else ""}
            FROM promoted
            """,
            [limit],
        )
        row = cursor.fetchone()
        return row[0], sorted(row[1] or [])
