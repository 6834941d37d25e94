"""The hot statements' plans on a job table big enough for PostgreSQL's planner to care.

Each test runs a statement exactly as Stalwart sends it (through ``Statements``), under
``EXPLAIN (ANALYZE, FORMAT JSON)`` in a transaction that is rolled back, and asserts the
plan's shape: the index it reads, no sequential scan of ``stalwart_job``, and no filter that
throws away another queue's rows. Never the time: ``benchmarks/plans.py`` prints that.
"""

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection, transaction

from stalwart import ticks
from stalwart.db import Interruption, Outcome, statements_for
from stalwart.models import Job, Process
from stalwart.queues import QueuePattern

pytestmark = pytest.mark.django_db

BIG = "bulk"
EVERY = QueuePattern("", is_prefix=True)
ORPHAN = 987_654_321


@pytest.fixture(scope="module")
def big_table(django_db_setup, django_db_blocker) -> Iterator[int]:
    """~200,000 jobs: mostly successful; a backlog of 30,000 ready jobs in one queue, at the
    higher priorities; a few thousand ready elsewhere, failed (with unique keys), scheduled,
    blocked and running; 50,000 recurring ticks. Analyzed. Yields a registered owner."""
    with django_db_blocker.unblock():
        if connection.vendor != "postgresql":
            pytest.skip(
                "plans are PostgreSQL's: SQLite's planner has no partial indexes to mix up, "
                "and MySQL's plans are checked in test_mysql.py"
            )
        owner = Process.objects.create(
            kind="worker",
            name="worker-plans",
            pid=1,
            hostname="test",
            created_at="2026-01-01T00:00Z",
            last_heartbeat_at="2099-01-01T00:00Z",
        ).id
        insert = """
            INSERT INTO stalwart_job (id, task_path, backend, queue_name, priority, status,
                args, kwargs, available_at, enqueued_at, finished_at, attempt, max_attempts,
                owner, worker_ids, errors, concurrency_key, concurrency_limit, unique_key,
                unique_while_running, isolated)
            SELECT gen_random_uuid(), 't.task', 'default', {queue}, {priority}, %s, '[]', '{{}}',
                   {available}, now(), {finished}, 1, 1, {owner}, '[]', '[]', {key},
                   CASE WHEN {key} IS NULL THEN NULL ELSE 1 END, {unique}, false, false
            FROM generate_series(1, %s) AS n"""
        spread = "(ARRAY['default', 'mail', 'reports', 'bulk'])[1 + mod(n, 4)]"
        small = "(ARRAY['default', 'mail', 'reports'])[1 + mod(n, 3)]"
        ago = "now() - mod(n, 86400) * interval '1 s'"
        rows = [
            ("successful", 150_000, spread, "mod(n, 3) - 1", ago, ago, "NULL", "NULL", "NULL"),
            ("failed", 6_000, spread, "0", ago, ago, "NULL", "NULL", "'u-' || n"),
            ("ready", 30_000, f"'{BIG}'", "mod(n, 3)", ago, "NULL", "NULL", "NULL", "NULL"),
            ("ready", 3_000, small, "mod(n, 3) - 1", ago, "NULL", "NULL", "NULL", "'u-' || n"),
            (
                "scheduled",
                5_000,
                spread,
                "0",
                "now() + CASE WHEN mod(n, 50) = 0 THEN -1 ELSE n END * interval '1 s'",
                "NULL",
                "NULL",
                "NULL",
                "NULL",
            ),
            ("blocked", 1_000, spread, "0", ago, "NULL", "NULL", "'k-' || mod(n, 200)", "NULL"),
            ("running", 1_000, spread, "0", ago, "NULL", str(owner), "NULL", "NULL"),
            ("running", 10, spread, "0", ago, "NULL", str(ORPHAN), "NULL", "NULL"),
        ]
        with connection.cursor() as cursor:
            for state, count, queue, priority, available, finished, holder, key, unique in rows:
                cursor.execute(
                    insert.format(
                        queue=queue,
                        priority=priority,
                        available=available,
                        finished=finished,
                        owner=holder,
                        key=key,
                        unique=unique,
                    ),
                    [state, count],
                )
            cursor.execute(
                "INSERT INTO stalwart_recurring_run (key, run_at, job_id, created_at) "
                "SELECT 'tick-' || mod(n, 5), now() - n * interval '1 minute', "
                "gen_random_uuid(), now() FROM generate_series(1, 50000) AS n"
            )
            cursor.execute("VACUUM ANALYZE stalwart_job")
            cursor.execute("VACUUM ANALYZE stalwart_recurring_run")
    yield owner
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("TRUNCATE stalwart_job, stalwart_recurring_run, stalwart_process")


def plans(work: Callable[[Any], Any]) -> tuple[Any, list[dict]]:
    """Run ``work(cursor)`` (rolled back); return its result and the plan of each statement
    it sent, each run first under EXPLAIN ANALYZE (rolled back to a savepoint)."""
    found: list[dict] = []

    def explain(execute, sql, params, many, context):
        if not sql.lstrip().upper().startswith(("SAVEPOINT", "RELEASE", "ROLLBACK")):
            raw = context["cursor"].cursor
            raw.execute("SAVEPOINT plan")
            raw.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
            plan = raw.fetchone()[0]
            raw.execute("ROLLBACK TO SAVEPOINT plan")
            found.append((plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"])
        return execute(sql, params, many, context)

    with transaction.atomic():
        with connection.execute_wrapper(explain), connection.cursor() as cursor:
            result = work(cursor)
        transaction.set_rollback(True)
    return result, found


def nodes(plan: dict) -> Iterator[dict]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def job_scans(plan: dict) -> list[dict]:
    return [node for node in nodes(plan) if node.get("Relation Name") == "stalwart_job"]


def indexes(plan: dict) -> set[str]:
    """Every index the plan reads (bitmap index scans name no table: all are listed)."""
    return {node["Index Name"] for node in nodes(plan) if "Index Name" in node}


def assert_flat(plan: dict) -> None:
    """No sequential scan of the job table, and no job row read only to be filtered out."""
    for node in job_scans(plan):
        assert node["Node Type"] != "Seq Scan", json.dumps(plan, indent=1)
        removed = node.get("Rows Removed by Filter", 0)
        assert removed == 0, f"{node.get('Index Name')} filtered {removed} rows: {node}"


def claim_with(statements, owner, pattern, excluded=(), outcomes=None):
    if outcomes is None:
        return lambda cursor: statements.claim(
            cursor,
            owner=owner,
            worker_name="w",
            pattern=pattern,
            excluded=list(excluded),
            limit=5,
        )
    return lambda cursor: statements.finish_and_claim(
        cursor,
        owner=owner,
        outcomes=outcomes,
        worker_name="w",
        pattern=pattern,
        excluded=list(excluded),
        limit=5,
    )[1]


def finishing(owner) -> list[Outcome]:
    held = Job.objects.filter(status="running", owner=owner).order_by("id")[:5]
    return [Outcome(id=job.id, attempt=job.attempt, status="successful") for job in held]


def expected(queues: set[str] | None, excluded: set[str] = frozenset()) -> list:
    """The five jobs a claim must take: most urgent first (priority, then availability)."""
    ready = Job.objects.filter(status="ready").exclude(queue_name__in=excluded)
    if queues is not None:
        ready = ready.filter(queue_name__in=queues)
    return list(ready.order_by("-priority", "available_at", "id").values_list("id", flat=True)[:5])


@pytest.mark.parametrize("queue", ["mail", BIG])
def test_a_claim_on_a_named_queue_reads_only_that_queue_in_claim_and_finish_and_claim(
    big_table, queue
):
    statements = statements_for(connection)
    for outcomes in (None, finishing(big_table)):
        claimed, found = plans(claim_with(statements, big_table, QueuePattern(queue), (), outcomes))
        claim = found[0]
        assert "stalwart_job_claim_queue" in indexes(claim)
        assert "stalwart_job_claim_any" not in indexes(claim)
        assert_flat(claim)
        assert sorted(job.id for job in claimed) == sorted(expected({queue}))


def test_a_claim_on_every_queue_with_a_paused_backlog_never_reads_the_paused_rows(big_table):
    statements = statements_for(connection)
    for outcomes in (None, finishing(big_table)):
        claimed, found = plans(
            claim_with(statements, big_table, EVERY, [QueuePattern(BIG)], outcomes)
        )
        claim = found[0]
        assert indexes(claim) >= {"stalwart_job_claim_queue"}
        assert "stalwart_job_claim_any" not in indexes(claim)
        assert_flat(claim)
        # Most urgent first across the other queues, none from the paused one.
        assert sorted(job.id for job in claimed) == sorted(expected(None, {BIG}))


def test_a_claim_on_a_prefix_reads_the_heads_of_its_queues(big_table):
    statements = statements_for(connection)
    claimed, found = plans(claim_with(statements, big_table, QueuePattern("b", is_prefix=True)))
    assert "stalwart_job_claim_any" not in indexes(found[0])
    assert_flat(found[0])
    assert sorted(job.id for job in claimed) == sorted(expected({BIG}))


def test_a_claim_on_every_queue_reads_the_head_of_claim_any(big_table):
    statements = statements_for(connection)
    for outcomes in (None, finishing(big_table)):
        claimed, found = plans(claim_with(statements, big_table, EVERY, (), outcomes))
        assert "stalwart_job_claim_any" in indexes(found[0])
        assert_flat(found[0])
        assert sorted(job.id for job in claimed) == sorted(expected(None))


def test_finish_promote_and_release_read_their_own_indexes(big_table):
    statements = statements_for(connection)
    outcomes = finishing(big_table)
    _, found = plans(lambda c: statements.finish(c, owner=big_table, outcomes=outcomes))
    assert_flat(found[0])
    _, found = plans(lambda c: statements.promote_due(c, limit=500, notify=False))
    assert "stalwart_job_due" in indexes(found[0])
    assert not any(node["Node Type"] == "Seq Scan" for node in job_scans(found[0]))
    held = [Interruption(outcome.id, outcome.attempt, "stop") for outcome in outcomes]
    _, found = plans(lambda c: statements.release(c, owner=big_table, jobs=held, notify=False))
    for plan in found:
        assert_flat(plan)


def test_retry_reads_failed_jobs_by_id_and_checks_twins_on_the_unique_indexes(big_table):
    statements = statements_for(connection)
    conditions, params = statements.selection_sql()
    count, found = plans(
        lambda c: statements.count_requeueable(
            c, status="failed", conditions=conditions, params=params
        )
    )
    assert count == 6_000 - 3_000  # the first 3,000 have a ready twin holding their key
    assert not any(node["Node Type"] == "Seq Scan" for node in job_scans(found[0]))
    # The twin checks are joins, not a subplan run once per failed job.
    assert not any("Subplan Name" in node for node in job_scans(found[0]))
    _, found = plans(
        lambda c: statements.requeue_batch(
            c,
            status="failed",
            conditions=conditions,
            params=params,
            limit=1000,
            grant_attempt=True,
        )
    )
    assert "stalwart_job_failed_id" in indexes(found[0])
    assert not any(node["Node Type"] == "Seq Scan" for node in job_scans(found[0]))


def test_sweeps_read_indexes_only(big_table):
    statements = statements_for(connection)
    _, found = plans(lambda c: statements.unblock_sweep(c, after=None, limit=1000, notify=False))
    for plan in found:
        assert not any(node["Node Type"] == "Seq Scan" for node in job_scans(plan))
    owners, found = plans(lambda c: statements.orphan_owners(c, limit=50))
    assert owners == [ORPHAN]
    assert "stalwart_job_owner" in indexes(found[0])


def test_the_pruners_look_reads_indexes_only(big_table):
    """The statement an idle cluster's pruner sends every heartbeat interval: the lease,
    the silent processes, whether a running job has lost its owner's row."""
    statements = statements_for(connection)
    survey, found = plans(
        lambda c: statements.survey_for_prune(
            c, lease="plans", holder="me", ttl=20, threshold=60, exclude=None
        )
    )
    assert survey == ([], True)  # the table's owner beats until 2099; ORPHAN has no row
    assert not any(node["Node Type"] == "Seq Scan" for node in job_scans(found[0]))
    assert "stalwart_job_owner" in indexes(found[0])


def test_the_latest_ticks_and_the_waiting_queues_are_loose_index_scans(big_table):
    statements = statements_for(connection)
    latest, found = plans(lambda c: ticks.last_runs("default"))
    runs = [node for node in nodes(found[0]) if node.get("Relation Name")]
    assert runs
    assert all(node["Node Type"] != "Seq Scan" for node in runs)
    assert {node.get("Index Name") for node in runs} == {"stalwart_recurring_run_once"}
    assert sorted(latest) == [f"tick-{n}" for n in range(5)]
    waiting, found = plans(statements.waiting_queues)
    assert waiting == ["bulk", "default", "mail", "reports"]
    assert indexes(found[0]) >= {"stalwart_job_claim_queue", "stalwart_job_waiting_queue"}
    assert not any(node["Node Type"] == "Seq Scan" for node in job_scans(found[0]))


def test_the_job_table_is_vacuumed_after_500_changes_plus_one_percent(vendor):
    """The autovacuum settings that keep the claim indexes' heads clean (migration 0001;
    ``benchmarks/plans.py --accumulate`` shows their effect)."""
    if vendor != "postgresql":
        pytest.skip("autovacuum is PostgreSQL's")
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT option_name, option_value FROM pg_class, pg_options_to_table(reloptions) "
            "WHERE relname = 'stalwart_job'"
        )
        options = dict(cursor.fetchall())
    for kind in ("vacuum", "vacuum_insert", "analyze"):
        assert options[f"autovacuum_{kind}_scale_factor"] == "0.01"
        assert options[f"autovacuum_{kind}_threshold"] == "500"


def test_the_look_at_dependants_of_jobs_just_ended_reads_only_jobs_with_dependants(big_table):
    """150,000 jobs ended in the last day, none with dependants: the dispatcher's look at
    the dependants of jobs ended in the last hour reads none of them."""
    from datetime import timedelta

    from django.utils import timezone

    from stalwart.db import dependencies

    since = timezone.now() - timedelta(hours=1)
    children, found = plans(
        lambda c: dependencies.recent_children("default", since=since, limit=1000)
    )
    assert children == []
    assert "stalwart_job_parents" in indexes(found[0])
    assert "stalwart_job_finished" not in indexes(found[0])
    assert_flat(found[0])


@pytest.mark.parametrize(
    "pattern",
    [EVERY, QueuePattern(BIG), QueuePattern("b", is_prefix=True)],
    ids=["every-queue", "one-queue", "prefix"],
)
def test_a_claim_reads_only_what_it_takes_when_the_statistics_say_nothing_is_ready(
    big_table, pattern
):
    """The table was last analyzed when no job was ready (a quiet queue, most of the time),
    then a backlog arrived: the claim still reads the head of its index and its rows by
    primary key, not every ready job once per row it claims."""
    statements = statements_for(connection)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("UPDATE stalwart_job SET status = 'scheduled' WHERE status = 'ready'")
        cursor.execute("ANALYZE stalwart_job")  # rolled back with the transaction
        cursor.execute(
            "UPDATE stalwart_job SET status = 'ready' "
            "WHERE status = 'scheduled' AND available_at < now() - interval '1 second'"
        )
        for outcomes in (None, finishing(big_table)):
            _, found = plans(claim_with(statements, big_table, pattern, (), outcomes))
            ready = {"stalwart_job_claim_any", "stalwart_job_claim_queue"}
            for node in job_scans(found[0]):
                if node.get("Index Name") not in ready:
                    continue  # the finish's read of the jobs the worker holds, by owner
                read = node["Actual Rows"] * node["Actual Loops"]
                assert read <= 200, f"{node.get('Index Name')} read {read} rows: {node}"
        transaction.set_rollback(True)


def test_the_look_at_a_draining_batch_reads_its_newest_members_not_the_finished_ones(
    big_table,
):
    """A closed batch of 20,000 members, all but the 10 newest finished (members run in the
    order they were added): whether it is done reads a few members, not 19,990."""
    import uuid

    from stalwart.db import batches

    batch = uuid.uuid4()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO stalwart_batch (id, backend, label, created_at, closed_at, total, "
            "callbacks) VALUES (%s, 'default', '', now(), now(), 20000, '{}')",
            [batch],
        )
        cursor.execute(
            "INSERT INTO stalwart_batch_job (batch, job, role) "
            "SELECT %s, id, 'member' FROM ("
            "  SELECT id FROM stalwart_job WHERE status = 'successful' ORDER BY id LIMIT 19990"
            ") AS finished ORDER BY id",
            [batch],
        )
        cursor.execute(
            "INSERT INTO stalwart_batch_job (batch, job, role) "
            "SELECT %s, id, 'member' FROM stalwart_job WHERE status = 'ready' "
            "ORDER BY id LIMIT 10",
            [batch],
        )
        cursor.execute("ANALYZE stalwart_batch_job")
        done, found = plans(lambda c: batches.waiting("default", limit=10))
        assert done == []
        for node in nodes(found[0]):
            if node.get("Relation Name") in ("stalwart_job", "stalwart_batch_job"):
                read = node["Actual Rows"] * node["Actual Loops"]
                assert read <= 20, f"{node.get('Index Name')} read {read} rows: {node}"
        transaction.set_rollback(True)


def test_resolving_pending_jobs_reads_their_own_dependencies_not_every_dependency(big_table):
    """20,000 jobs wait for parents that have not ended (of 100,000 when the statistics were
    taken): deciding 500 of them reads those
    500 jobs and their parents by id, never the whole job table hashed into an anti-join,
    whatever the statistics say."""
    from django.utils import timezone

    from stalwart.db import dependencies

    with transaction.atomic(), connection.cursor() as cursor:
        # A table of little but these (as in benchmarks/workflows.py): then an anti-join
        # that hashes every dependency and every job looks cheap to the planner.
        cursor.execute("DELETE FROM stalwart_job WHERE status <> 'scheduled'")
        cursor.execute(
            """
            INSERT INTO stalwart_job (id, task_path, backend, queue_name, priority, status,
                args, kwargs, available_at, enqueued_at, attempt, max_attempts, worker_ids,
                errors, unique_while_running, isolated)
            SELECT gen_random_uuid(), 't.task', 'default', 'default', 0, 'pending', '[]',
                   '{}', now(), now(), 0, 1, '[]', '[]', false, false
            FROM generate_series(1, 100000)
            """
        )
        cursor.execute(
            "INSERT INTO stalwart_dependency (child, parent, position, on_failure) "
            "SELECT child.id, parent.id, 0, 'cancel' FROM "
            "(SELECT id, row_number() OVER (ORDER BY id) AS n FROM stalwart_job "
            " WHERE status = 'pending') AS child "
            "JOIN (SELECT id, row_number() OVER (ORDER BY id) AS n FROM stalwart_job "
            " WHERE status = 'scheduled') AS parent ON parent.n = 1 + child.n % 400"
        )
        cursor.execute("ANALYZE stalwart_job")
        cursor.execute("ANALYZE stalwart_dependency")
        # Then most of them went (ran, were pruned) before the statistics were taken again.
        cursor.execute(
            "DELETE FROM stalwart_dependency WHERE child IN (SELECT id FROM stalwart_job "
            "WHERE status = 'pending' ORDER BY id OFFSET 20000)"
        )
        cursor.execute(
            "DELETE FROM stalwart_job WHERE id IN (SELECT id FROM stalwart_job "
            "WHERE status = 'pending' ORDER BY id OFFSET 20000)"
        )
        among = dependencies.pending_page("default", after=None, limit=500)
        decided, found = plans(lambda c: dependencies.resolve("default", among, now=timezone.now()))
        assert decided[:2] == (0, 0)
        # The statements that decide (those that read the jobs as ``child``); the list of
        # their parents is one range of the edge index, or a scan the planner may prefer.
        deciding = [p for p in found if any(n.get("Alias") == "child" for n in nodes(p))]
        assert len(deciding) == 2
        for plan in deciding:
            for node in nodes(plan):
                read = node.get("Actual Rows", 0) * node.get("Actual Loops", 1)
                if node.get("Relation Name") == "stalwart_job":
                    # The 500 jobs and their parents, by id: never the whole job table.
                    assert read <= 1000, f"{node.get('Alias')} read {read} rows: {node}"
                if node.get("Relation Name") == "stalwart_dependency":
                    # At most one pass over the dependencies (a scan of a table this
                    # small is the planner's to choose), never one per job.
                    assert read <= 20_000, f"{node.get('Alias')} read {read} rows: {node}"
        transaction.set_rollback(True)
