"""The hot statements' plans and times on a job table of a million rows.

    python benchmarks/plans.py [--jobs 1000000] [--rounds 5] [--keep] [--accumulate 100000]

PostgreSQL only (database ``stalwart_bench_plans``, created and migrated here). It fills the
job table as a year of production leaves it (800k successful, 60k failed, 50k scheduled, 80k
ready of which 70k in one queue, 5k running, 5k blocked; a mix of priorities, unique keys and
concurrency keys; 500k recurring ticks), runs ``VACUUM ANALYZE``, then calls each hot
statement exactly as Stalwart issues it (the SQL comes from the ``Statements`` classes and
the functions that call them, never from a copy) and runs each under
``EXPLAIN (ANALYZE, BUFFERS)``. Writes are rolled back, so every round sees the same table.

For each statement it prints the time the server reports (planning and execution, the
median of ``--rounds``), the indexes read on ``stalwart_job``, whether the job table was
read by a sequential scan, and how many rows a filter threw away. Figures are printed,
never asserted; the machine is shared, so compare figures measured in one run.

``--accumulate N`` then turns ``N`` jobs of the big queue over (claimed, finished, and
replaced by new ready jobs, committed) and measures the claims again after each fifth of
them: once with no vacuum at all, once with a vacuum each time the job table's dead rows
pass the threshold its autovacuum settings (migration 0001) give, as autovacuum would.
``--pending N`` adds N jobs waiting for their parents (50 to a parent, each due later today)
and marks N finished jobs as having had dependants, before measuring (the claims beside a
graph of blocked jobs, and the dispatcher's looks at them). ``--keep`` reuses the table of
an earlier run; ``--only TEXT`` measures only the statements
whose name contains it; ``--show`` prints each plan in full.
"""

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("STALWART_BENCH_DB_NAME", "stalwart_bench_plans")
os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
os.environ["STALWART_BENCH_DATABASE"] = "postgresql"

BIG = "bulk"  # the queue with the backlog (70k ready jobs), paused in some cases
SMALL = ("default", "mail", "reports")
LIVE_OWNERS = 500  # worker processes holding the running jobs, about ten each
ORPHAN_OWNER = 987_654_321  # an owner with no process row: the orphan sweep's work
RECURRING_KEYS = 20


def fill(total: int) -> None:
    """Insert the rows with a few INSERT … SELECT statements (generate_series)."""
    from django.db import connection

    from stalwart.models import Process

    scale = total / 1_000_000
    counts = {
        name: int(count * scale)
        for name, count in {
            "successful": 800_000,
            "failed": 60_000,
            "scheduled": 50_000,
            "ready_big": 70_000,
            "ready_small": 10_000,
            "running": 5_000,
            "blocked": 5_000,
        }.items()
    }
    Process.objects.all().delete()
    now = _now()
    Process.objects.bulk_create(
        Process(
            kind="worker",
            name=f"worker-plans-{number}",
            pid=number + 1,
            hostname="bench",
            created_at=now,
            last_heartbeat_at=now,
            metadata={"queues": "*"},
        )
        for number in range(LIVE_OWNERS)
    )
    owners = list(Process.objects.order_by("id").values_list("id", flat=True))
    small = "ARRAY[" + ", ".join(f"'{queue}'" for queue in SMALL) + "]"
    every = "ARRAY[" + ", ".join(f"'{queue}'" for queue in (*SMALL, BIG)) + "]"
    columns = (
        "id, task_path, backend, queue_name, priority, status, args, kwargs, available_at, "
        "enqueued_at, started_at, last_attempted_at, finished_at, attempt, max_attempts, "
        "owner, worker_ids, errors, concurrency_key, concurrency_limit, unique_key, "
        "unique_while_running, isolated"
    )
    ago = "now() - (mod(n, 86400 * 30)) * interval '1 s'"
    error = (
        "jsonb_build_array(jsonb_build_object('exception_class_path', "
        "'builtins.ConnectionError', 'traceback', 'Traceback: the partner did not answer'))"
    )
    rows = {
        # Per state: count, queue, priority, available_at, finished_at, owner, errors,
        # concurrency key, unique key.
        "successful": (every, "mod(n, 3) - 1", ago, ago, "NULL", "'[]'", "NULL", "NULL"),
        # Failed: two in three have a unique key (a retry's twin check has work to do).
        "failed": (
            every,
            "mod(n, 3) - 1",
            ago,
            ago,
            "NULL",
            error,
            "NULL",
            "CASE WHEN mod(n, 3) <> 0 THEN 'u-failed-' || n END",
        ),
        # Scheduled: 1 in 50 is due now; the rest later today.
        "scheduled": (
            every,
            "mod(n, 3) - 1",
            (
                "CASE WHEN mod(n, 50) = 0 THEN now() - (1 + mod(n, 3600)) * interval '1 s' "
                "ELSE now() + (1 + mod(n, 86400)) * interval '1 s' END"
            ),
            "NULL",
            "NULL",
            "'[]'",
            "CASE WHEN mod(n, 7) = 0 THEN 'acct-' || mod(n, 2500) END",
            "NULL",
        ),
        # The backlog: one queue, the higher priorities; its rows come first in a claim on '*'.
        "ready_big": (f"'{BIG}'", "mod(n, 3)", ago, "NULL", "NULL", "'[]'", "NULL", "NULL"),
        # Ready in the other queues; 2,000 hold the unique key of a failed job (its twin).
        "ready_small": (
            small,
            "mod(n, 3) - 1",
            ago,
            "NULL",
            "NULL",
            "'[]'",
            "NULL",
            "CASE WHEN n <= 2000 THEN 'u-failed-' || (3 * n - 1) END",
        ),
        # Running: half hold a concurrency key's only slot; 100 belong to a vanished process;
        # the others, about ten to each worker process.
        "running": (
            every,
            "0",
            ago,
            "NULL",
            (
                f"CASE WHEN n <= 100 THEN {ORPHAN_OWNER} "
                f"ELSE (ARRAY{owners})[1 + mod(n, {len(owners)})] END"
            ),
            "'[]'",
            "CASE WHEN mod(n, 2) = 0 THEN 'acct-' || mod(n / 2, 2500) END",
            "NULL",
        ),
        # Blocked: two per concurrency key (limit 1), whose slot a running job holds.
        "blocked": (
            every,
            "mod(n, 3) - 1",
            ago,
            "NULL",
            "NULL",
            "'[]'",
            "'acct-' || mod(n, 2500)",
            "NULL",
        ),
    }
    with connection.cursor() as cursor:
        cursor.execute(
            "TRUNCATE stalwart_job, stalwart_concurrency_key, stalwart_recurring_run, "
            "stalwart_queue_pause, stalwart_lease"
        )
        for name, (
            queue,
            priority,
            available,
            finished,
            owner,
            errors,
            key,
            unique,
        ) in rows.items():
            state = name.split("_")[0]
            queue_sql = queue if queue.startswith("'") else f"({queue})[1 + mod(n, 4)]"
            if queue == small:
                queue_sql = f"({small})[1 + mod(n, 3)]"
            ran = state in ("successful", "failed", "running")
            cursor.execute(
                f"""
                INSERT INTO stalwart_job ({columns})
                SELECT gen_random_uuid(), 'benchmarks.tasks.task_' || mod(n, 8), 'default',
                       {queue_sql}, {priority}, %s, jsonb_build_array(n), '{{}}'::jsonb,
                       {available}, {ago} - interval '1 s',
                       {ago if ran else "NULL"}, {ago if ran else "NULL"}, {finished},
                       {1 if ran else 0}, {1 if state == "failed" else 5}, {owner},
                       {"'[\"worker-plans-0\"]'" if ran else "'[]'"}, {errors}, {key},
                       CASE WHEN {key} IS NULL THEN NULL ELSE 1 END, {unique}, false, false
                FROM generate_series(1, %s) AS n
                """,
                [state, counts[name]],
            )
        cursor.execute(
            "INSERT INTO stalwart_concurrency_key (key, slot_limit, updated_at) "
            "SELECT 'acct-' || n, 1, now() FROM generate_series(0, 2499) AS n"
        )
        # Recurring ticks: every minute for a year's worth, spread over the keys.
        ticks = int(500_000 * scale)
        cursor.execute(
            "INSERT INTO stalwart_recurring_run (key, run_at, job_id, created_at) "
            f"SELECT 'recurring-' || mod(n, {RECURRING_KEYS}), "
            "now() - n * interval '1 minute', gen_random_uuid(), now() "
            "FROM generate_series(1, %s) AS n",
            [ticks],
        )
        cursor.execute("VACUUM ANALYZE stalwart_job")
        cursor.execute("VACUUM ANALYZE stalwart_recurring_run")
        cursor.execute("VACUUM ANALYZE stalwart_concurrency_key")


def _now():
    from django.utils import timezone

    return timezone.now()


# -- running statements under EXPLAIN -----------------------------------------------------

_SKIPPED = ("SAVEPOINT", "RELEASE", "ROLLBACK", "SET ", "BEGIN", "COMMIT")


class Recorder:
    """Runs each statement Stalwart sends under EXPLAIN (ANALYZE, BUFFERS) first (rolled
    back to a savepoint), then for real; keeps the plans."""

    def __init__(self) -> None:
        self.plans: list[tuple[str, dict]] = []

    def __call__(self, execute: Callable, sql: str, params: Any, many: bool, context: dict):
        text = sql.strip()
        if many or text.upper().startswith(_SKIPPED) or text.upper().startswith("EXPLAIN"):
            return execute(sql, params, many, context)
        raw = context["cursor"].cursor
        raw.execute("SAVEPOINT stalwart_plans")
        raw.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
        plan = raw.fetchone()[0]
        raw.execute("ROLLBACK TO SAVEPOINT stalwart_plans")
        plan = plan[0] if isinstance(plan, list) else json.loads(plan)[0]
        self.plans.append((text, plan))
        return execute(sql, params, many, context)


def _nodes(node: dict):
    yield node
    for child in node.get("Plans", ()):
        yield from _nodes(child)


def summary(plan: dict) -> dict:
    """Time, indexes read on stalwart_job, sequential scans of it, rows filtered out."""
    indexes, seq, filtered = [], False, 0
    for node in _nodes(plan["Plan"]):
        on_jobs = node.get("Relation Name") == "stalwart_job"
        if on_jobs and node["Node Type"] == "Seq Scan":
            seq = True
        if "Index Name" in node and node["Index Name"] not in indexes:
            indexes.append(node["Index Name"])
        filtered += int(node.get("Rows Removed by Filter", 0) * node.get("Actual Loops", 1))
    return {
        "ms": plan.get("Planning Time", 0) + plan.get("Execution Time", 0),
        "indexes": indexes,
        "seq": seq,
        "filtered": filtered,
    }


def measure(
    name: str, work: Callable[[Any], Any], rounds: int, *, clean: bool = True
) -> list[dict]:
    """Run ``work(cursor)`` ``rounds`` times in a transaction rolled back each time; return
    per statement: its label, median time, indexes, seq scan, rows filtered."""
    from django.db import connection, transaction

    per_round: list[list[dict]] = []
    walls = []
    for _ in range(rounds):
        recorder = Recorder()
        with transaction.atomic():
            with connection.execute_wrapper(recorder), connection.cursor() as cursor:
                work(cursor)
            transaction.set_rollback(True)
        per_round.append([summary(plan) for _, plan in recorder.plans])
        if clean:
            vacuum()
        # The same calls again, timed from Python without EXPLAIN (the round trips included).
        with transaction.atomic():
            begun = time.perf_counter()
            with connection.cursor() as cursor:
                work(cursor)
            walls.append((time.perf_counter() - begun) * 1000)
            transaction.set_rollback(True)
        if clean:
            vacuum()
    statements = per_round[0]
    rows = []
    for index, first in enumerate(statements):
        times = [found[index]["ms"] for found in per_round if index < len(found)]
        rows.append({**first, "ms": statistics.median(times), "label": name, "n": index})
    if len(rows) > 1:  # many statements: their total too (and only it, if they are many)
        if len(rows) > 6:
            rows = []
        rows.append(
            {
                "label": name,
                "n": "all",
                "ms": sum(
                    statistics.median(found[i]["ms"] for found in per_round if i < len(found))
                    for i in range(len(statements))
                ),
                "indexes": sorted({name for row in statements for name in row["indexes"]}),
                "seq": any(row["seq"] for row in statements),
                "filtered": sum(row["filtered"] for row in statements),
                "statements": len(statements),
            }
        )
    for row in rows:
        row["wall"] = statistics.median(walls)
    return rows


def vacuum() -> None:
    """Remove what a rolled-back round left in the indexes, so each round sees the table
    as filled (VACUUM, without ANALYZE: the statistics stay those of the filled table)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM stalwart_job")


# -- the statements, as Stalwart calls them --------------------------------------------------


def add_pending(count: int) -> None:
    """Add ``count`` jobs waiting for their parents (``enqueue_after``): each runs after a
    scheduled job due later today, 50 to a parent; and as many finished jobs that had
    dependants, ended over the last day. Analyzed."""
    from django.db import connection

    if not count:
        return
    parents = max(count // 50, 1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM stalwart_job WHERE status = 'pending'")
        if cursor.fetchone()[0] >= count:
            return
        print(f"Adding {count:,} pending jobs…", flush=True)
        cursor.execute(
            "UPDATE stalwart_job SET has_dependants = true WHERE id IN ("
            "  SELECT id FROM stalwart_job WHERE status = 'scheduled'"
            "  AND available_at > now() ORDER BY id LIMIT %s)",
            [parents],
        )
        cursor.execute(
            "UPDATE stalwart_job SET has_dependants = true WHERE id IN ("
            "  SELECT id FROM stalwart_job WHERE status = 'successful' ORDER BY id LIMIT %s)",
            [count],
        )
        cursor.execute(
            """
            CREATE TEMPORARY TABLE bench_parent AS
            SELECT id, row_number() OVER (ORDER BY id) AS n FROM stalwart_job
            WHERE status = 'scheduled' AND has_dependants
            """
        )
        cursor.execute(
            """
            CREATE TEMPORARY TABLE bench_child AS
            SELECT gen_random_uuid() AS id, n FROM generate_series(1, %s) AS n
            """,
            [count],
        )
        cursor.execute(
            """
            INSERT INTO stalwart_job (id, task_path, backend, queue_name, priority, status, args,
                kwargs, available_at, enqueued_at, attempt, max_attempts, worker_ids, errors,
                unique_while_running, isolated)
            SELECT id, 'benchmarks.tasks.task_' || mod(n, 8), 'default', 'default', 0,
                   'pending', jsonb_build_array(n), '{}'::jsonb, now(), now(), 0, 5, '[]',
                   '[]', false, false
            FROM bench_child
            """
        )
        cursor.execute(
            """
            INSERT INTO stalwart_dependency (child, parent, position, on_failure)
            SELECT child.id, parent.id, 0, 'cancel'
            FROM bench_child AS child
            JOIN bench_parent AS parent ON parent.n = 1 + mod(child.n, %s)
            """,
            [parents],
        )
        cursor.execute("DROP TABLE bench_child, bench_parent")
        cursor.execute("VACUUM ANALYZE stalwart_job")
        cursor.execute("VACUUM ANALYZE stalwart_dependency")


def cases() -> list[tuple[str, Callable[[Any], Any]]]:
    from django.db import connection

    from stalwart import ticks
    from stalwart.db import Interruption, Outcome, statements_for
    from stalwart.models import Job
    from stalwart.queues import QueuePattern, QueueSelector

    statements = statements_for(connection)
    # A process that holds running jobs without a concurrency key.
    owner = (
        Job.objects.filter(status="running", concurrency_key__isnull=True)
        .exclude(owner=ORPHAN_OWNER)
        .values_list("owner", flat=True)
        .first()
    )
    held = list(
        Job.objects.filter(status="running", owner=owner, concurrency_key__isnull=True)
        .order_by("id")
        .values_list("id", "attempt")[:5]
    )
    outcomes = [
        Outcome(id=job_id, attempt=attempt, status="successful", return_value="null")
        for job_id, attempt in held
    ]
    big, mail, every = QueuePattern(BIG), QueuePattern("mail"), QueuePattern("", is_prefix=True)
    paused = [QueuePattern(BIG)]

    def claim(pattern, excluded=()):
        return lambda cursor: statements.claim(
            cursor,
            owner=owner,
            worker_name="worker-plans-0",
            pattern=pattern,
            excluded=list(excluded),
            limit=5,
        )

    def finish_and_claim(pattern, excluded=()):
        return lambda cursor: statements.finish_and_claim(
            cursor,
            owner=owner,
            outcomes=outcomes,
            worker_name="worker-plans-0",
            pattern=pattern,
            excluded=list(excluded),
            limit=5,
        )

    def retry_dry_run(cursor):
        conditions, params = statements.selection_sql(state=None)
        getattr(statements, "without_jit", lambda cursor: None)(cursor)  # as control does
        return statements.count_requeueable(
            cursor, status="failed", conditions=conditions, params=params
        )

    def retry_batch(cursor):
        conditions, params = statements.selection_sql()
        getattr(statements, "without_jit", lambda cursor: None)(cursor)
        return statements.requeue_batch(
            cursor,
            status="failed",
            conditions=conditions,
            params=params,
            limit=1000,
            grant_attempt=True,
        )

    def slot_sweep(cursor):
        sweep = getattr(statements, "unblock_sweep", None)
        if sweep is not None:  # set-based, bounded
            return sweep(cursor, after=None, limit=1000, notify=True)
        for key in statements.blocked_keys(cursor):  # one key at a time
            statements.unblock(cursor, key=key, notify=True)
        return None

    def orphan_sweep(cursor):
        released = []
        for orphan in statements.orphan_owners(cursor):
            released += statements.release_owner_rows(
                cursor, owner=orphan, error_class="x", error_text="gone", death="crash"
            )
        statements.hand_on_slots(cursor, released, notify=True)

    def drained(cursor):
        selector = QueueSelector.parse("*")
        waiting = getattr(statements, "waiting_queues", None)
        if waiting is not None:
            return waiting(cursor)
        # main: the worker's query, through the ORM
        names = (
            Job.objects.filter(status__in=["ready", "scheduled", "blocked"])
            .values_list("queue_name", flat=True)
            .distinct()
        )
        return not any(selector.serves(name) and name != BIG for name in names)

    def retention(cursor):
        return statements.delete_batch(
            cursor,
            statuses=["successful"],
            conditions="",
            params=[],
            limit=1000,
            older_than=14 * 86400,
        )

    def recent_children(cursor):
        from datetime import timedelta

        from django.utils import timezone

        from stalwart.db import dependencies

        since = timezone.now() - timedelta(minutes=1)
        return dependencies.recent_children("default", since=since, limit=1000)

    def pending_page(cursor):
        from stalwart.db import dependencies

        return dependencies.pending_page("default", after=None, limit=1000)

    def resolve_page(cursor):
        from django.utils import timezone

        from stalwart.db import dependencies

        page = dependencies.pending_page("default", after=None, limit=500)
        return dependencies.resolve("default", page, now=timezone.now())

    return [
        (f"claim '{mail}' ({BIG} has a backlog)", claim(mail)),
        (f"claim '{BIG}'", claim(big)),
        ("claim 'mail*' (a prefix)", claim(QueuePattern("mail", is_prefix=True))),
        ("claim '*'", claim(every)),
        (f"claim '*', '{BIG}' paused", claim(every, paused)),
        (f"finish_and_claim '{mail}'", finish_and_claim(mail)),
        ("finish_and_claim '*'", finish_and_claim(every)),
        (f"finish_and_claim '*', '{BIG}' paused", finish_and_claim(every, paused)),
        (
            "finish (5 outcomes)",
            lambda cursor: statements.finish(cursor, owner=owner, outcomes=outcomes),
        ),
        (
            "promote due (batch of 500)",
            lambda cursor: statements.promote_due(cursor, limit=500, notify=True),
        ),
        (
            "release (5 jobs)",
            lambda cursor: statements.release(
                cursor,
                owner=owner,
                jobs=[Interruption(job_id, attempt, "stop") for job_id, attempt in held],
                notify=True,
            ),
        ),
        ("orphan sweep", orphan_sweep),
        (
            "prune: dead processes",
            lambda cursor: statements.dead_processes(cursor, threshold=60, exclude=None),
        ),
        ("slot sweep", slot_sweep),
        ("retry --dry-run (count)", retry_dry_run),
        ("retry (one batch of 1000)", retry_batch),
        ("retention (one batch of 1000)", retention),
        ("ticks.last_runs", lambda cursor: ticks.last_runs("default")),
        ("--stop-when-empty drained check", drained),
        (
            "isolated jobs waiting",
            lambda cursor: statements.isolated_waiting(cursor, pattern=every, excluded=paused),
        ),
        ("dependants of jobs ended in the last minute", recent_children),
        ("pending sweep (a page of 1000)", pending_page),
        ("resolve 500 pending jobs", resolve_page),
    ]


def show(work: Callable[[Any], Any]) -> None:
    """Print the text plan of each statement ``work`` sends (rolled back)."""
    from django.db import connection, transaction

    def explain(execute, sql, params, many, context):
        if not sql.strip().upper().startswith(_SKIPPED):
            raw = context["cursor"].cursor
            raw.execute("SAVEPOINT stalwart_plans")
            raw.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
            print("\n".join(row[0] for row in raw.fetchall()), "\n", flush=True)
            raw.execute("ROLLBACK TO SAVEPOINT stalwart_plans")
        return execute(sql, params, many, context)

    with transaction.atomic():
        with connection.execute_wrapper(explain), connection.cursor() as cursor:
            work(cursor)
        transaction.set_rollback(True)


def print_rows(rows: list[dict]) -> None:
    if not rows:
        return
    width = max(len(f"{row['label']} #{row['n']}") for row in rows)
    print(f"{'statement':{width}}  server ms  wall ms  seq  filtered  indexes")
    for row in rows:
        label = f"{row['label']} #{row['n']}"
        if row["n"] == "all":
            label = f"{row['label']} (all {row['statements']})"
        print(
            f"{label:{width}}  {row['ms']:9.2f}  {row['wall']:7.2f}  "
            f"{'SEQ' if row['seq'] else '   '}  {row['filtered']:8}  {', '.join(row['indexes'])}",
            flush=True,
        )


# -- accumulate: finished rows pile up between vacuums ----------------------------------------


def churn(count: int, *, vacuum_as_autovacuum: bool, batch: int = 500) -> int:
    """Turn ``count`` jobs of the big queue over: claim, finish (committed), refill. With
    ``vacuum_as_autovacuum``, vacuum the job table whenever its dead rows pass the threshold
    its autovacuum settings give (as the autovacuum launcher would, minus its naptime);
    return how many times it did."""
    from django.db import connection

    from stalwart.db import Outcome, statements_for
    from stalwart.models import Process
    from stalwart.queues import QueuePattern

    statements = statements_for(connection)
    owner = Process.objects.order_by("id").values_list("id", flat=True).last()
    done, vacuums = 0, 0
    while done < count:
        with connection.cursor() as cursor:
            claimed = statements.claim(
                cursor,
                owner=owner,
                worker_name="worker-plans-churn",
                pattern=QueuePattern(BIG),
                excluded=[],
                limit=batch,
            )
            statements.finish(
                cursor,
                owner=owner,
                outcomes=[
                    Outcome(id=job.id, attempt=job.attempt, status="successful") for job in claimed
                ],
            )
            cursor.execute(
                f"""
                INSERT INTO stalwart_job (id, task_path, backend, queue_name, priority, status,
                    args, kwargs, available_at, enqueued_at, attempt, max_attempts, worker_ids,
                    errors, unique_while_running, isolated)
                SELECT gen_random_uuid(), 'benchmarks.tasks.task_1', 'default', '{BIG}',
                       mod(n, 3), 'ready', '[]', '{{}}', now(), now(), 0, 5, '[]', '[]',
                       false, false
                FROM generate_series(1, %s) AS n
                """,
                [len(claimed)],
            )
            if vacuum_as_autovacuum and dead_tuples()[0] > vacuum_threshold():
                cursor.execute("VACUUM ANALYZE stalwart_job")
                vacuums += 1
        done += len(claimed)
    return vacuums


def dead_tuples() -> tuple[int, Any]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            "SELECT n_dead_tup, last_autovacuum FROM pg_stat_user_tables "
            "WHERE relname = 'stalwart_job'"
        )
        return cursor.fetchone()


def vacuum_threshold() -> float:
    """Dead rows past which autovacuum vacuums the job table: its own settings (migration
    0001), else the server's."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT coalesce((SELECT option_value::float FROM pg_options_to_table(reloptions)
                             WHERE option_name = 'autovacuum_vacuum_threshold'),
                            current_setting('autovacuum_vacuum_threshold')::float)
                 + coalesce((SELECT option_value::float FROM pg_options_to_table(reloptions)
                             WHERE option_name = 'autovacuum_vacuum_scale_factor'),
                            current_setting('autovacuum_vacuum_scale_factor')::float)
                   * greatest(reltuples, 0)
            FROM pg_class WHERE relname = 'stalwart_job'
            """
        )
        return cursor.fetchone()[0]


def accumulate(total: int, rounds: int) -> None:
    """Measure the claims as ``total`` finished jobs pile up: without any vacuum, then with
    a vacuum wherever the table's autovacuum settings would start one."""
    from django.db import connection

    chosen = [name for name, _ in cases() if name.startswith(("claim", "finish_and_claim"))]
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('autovacuum')")
        server = cursor.fetchone()[0]
    print(
        f"\nThe server's autovacuum is {server}; the job table's threshold is "
        f"{vacuum_threshold():,.0f} dead rows (0001's settings at this size).",
        flush=True,
    )
    for mode in ("no vacuum", "vacuum at the autovacuum threshold"):
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE stalwart_job")
        print(f"\nAccumulate {total:,} finished jobs, {mode} (server ms per statement):")
        print(f"{'turned over':>11}  {'dead rows':>9}  {'vacuums':>7}  " + "  ".join(chosen))
        step = max(total // 5, 1)
        turned, vacuums = 0, 0
        while True:
            found = dict(cases())
            # (measure() vacuums after each round to undo its own rolled-back writes; not here)
            figures = [measure(name, found[name], rounds, clean=False)[0]["ms"] for name in chosen]
            print(
                f"{turned:11,}  {dead_tuples()[0]:9,}  {vacuums:7}  "
                + "  ".join(
                    f"{ms:{len(name)}.2f}" for ms, name in zip(figures, chosen, strict=True)
                ),
                flush=True,
            )
            if turned >= total:
                break
            vacuums += churn(step, vacuum_as_autovacuum=mode != "no vacuum")
            turned += step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="Reuse the table of an earlier run.")
    parser.add_argument("--accumulate", type=int, default=0, metavar="N")
    parser.add_argument("--only", default="", help="Only the statements whose name has this.")
    parser.add_argument("--show", action="store_true", help="Print each plan in full too.")
    parser.add_argument(
        "--pending",
        type=int,
        default=0,
        metavar="N",
        help="Add N jobs waiting for their parents (and N ended jobs that had dependants).",
    )
    options = parser.parse_args()

    import django

    django.setup()
    from benchmarks.bench import filled_table

    filled_table(options.jobs, keep=options.keep, fill=fill)
    add_pending(options.pending)
    rows = []
    for name, work in cases():
        if options.only and options.only not in name:
            continue
        rounds = 1 if name == "slot sweep" else options.rounds
        rows += measure(name, work, rounds)
        if options.show:
            show(work)
    print_rows(rows)
    if options.accumulate:
        accumulate(options.accumulate, options.rounds)


if __name__ == "__main__":
    main()
