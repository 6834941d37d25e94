"""A role's main loop and the database going away: it reconnects, says so once, and says
so in its heartbeat while it cannot do its work."""

import os
import threading
from dataclasses import replace

import pytest
from django.db import connection, connections

from stalwart.conf import SchedulerOptions
from stalwart.models import RecurringRun
from stalwart.processes.scheduler import Scheduler
from stalwart.recurring import read_recurring
from stalwart.status import collect_status
from tests.helpers import (
    PGBOUNCER,
    WITHOUT_TIMEOUTS,
    ApplicationTransaction,
    WorkerThread,
    in_a_bookkeeping_session,
    wait_for,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def postgresql(vendor):
    if vendor != "postgresql":
        pytest.skip(
            "sessions are found by application_name, tables locked by LOCK TABLE: "
            "PostgreSQL's (SQLite is a file; MySQL's session bounds: test_mysql.py)"
        )


def every_second(backend):
    recurring = read_recurring(
        {"tick": {"task": "tests.testapp.tasks.noop", "schedule": "* * * * * *"}},
        "recurring",
        "UTC",
    )
    return replace(backend.config, recurring=recurring)


def terminate(application_name: str) -> int:
    """End, on the server, every session with this name (what a failover does to them)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name = %s AND datname = current_database()",
            [application_name],
        )
        return cursor.fetchone()[0]


@pytest.mark.skipif(
    PGBOUNCER,
    reason="through PgBouncer, a terminated server session is PgBouncer's to replace: the "
    "scheduler's own connection, to PgBouncer, is not cut",
)
def test_a_scheduler_whose_connection_is_terminated_reconnects_and_keeps_ticking(
    postgresql, backend, recorded_events
):
    scheduler = Scheduler(
        config=every_second(backend), scheduler=SchedulerOptions(polling_interval=0.1)
    )
    running = WorkerThread(scheduler).start()
    try:
        wait_for(RecurringRun.objects.exists, message="the first tick")
        wait_for(
            lambda: terminate(f"stalwart:scheduler:{os.getpid()}") == 1,
            message="the scheduler's session to be terminated",
        )
        ticks = RecurringRun.objects.count()
        wait_for(
            lambda: RecurringRun.objects.count() >= ticks + 2,
            timeout=10,
            message="ticks after the outage",
        )
    finally:
        scheduler.request_stop()
        running.join(15)
    mine = [action for action, fields in recorded_events if fields.get("process") == scheduler.name]
    assert mine.count("database_unavailable") == 1, mine
    assert mine.count("database_recovered") == 1, mine


@pytest.mark.skipif(PGBOUNCER, reason=WITHOUT_TIMEOUTS)
def test_a_scheduler_that_cannot_work_is_reported_by_the_health_check(postgresql, backend):
    config = every_second(backend)
    scheduler = Scheduler(config=config, scheduler=SchedulerOptions(polling_interval=0.1))
    # An application transaction that keeps the scheduler's table locked.
    application = ApplicationTransaction(
        ("LOCK TABLE stalwart_recurring_run IN ACCESS EXCLUSIVE MODE", [])
    ).begin()
    running = None
    try:
        running = WorkerThread(scheduler).start()

        def reported() -> list[str]:
            return [
                problem
                for problem in collect_status(config).problems(max_ready_age=None)
                if scheduler.name in problem and "failed to do its work" in problem
            ]

        problems = wait_for(reported, timeout=15, message="the failing scheduler to be reported")
        assert "lock timeout" in problems[0]
        application.end()
        wait_for(RecurringRun.objects.exists, timeout=10, message="a tick")
        wait_for(lambda: not reported(), timeout=10, message="the report to clear")
    finally:
        application.end()
        if running is not None:
            scheduler.request_stop()
            running.join(15)


@pytest.mark.skipif(PGBOUNCER, reason=WITHOUT_TIMEOUTS)
def test_the_queues_sessions_carry_a_name_and_timeouts_the_applications_do_not(postgresql):
    queue = in_a_bookkeeping_session(
        "SELECT current_setting('application_name'), "
        "current_setting('statement_timeout'), current_setting('lock_timeout')"
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('statement_timeout')")
        application = cursor.fetchone()
    assert queue == ("stalwart:worker:4242", "1250ms", "500ms")
    assert application == ("0",)  # set at connection: nothing leaks to other sessions


@pytest.mark.skipif(PGBOUNCER, reason=WITHOUT_TIMEOUTS)
def test_a_forked_childs_sessions_carry_its_own_name_not_its_parents(postgresql):
    """A child forked by the supervisor runs on the thread that forked it, with that thread's
    connection wrapper: its sessions must be named for the child, not for the supervisor."""
    from stalwart.db.session import bookkeeping

    seen: list[str] = []

    def bookkeeping_thread() -> None:
        try:
            for name in ("stalwart:supervisor:4241", "stalwart:worker:4242"):
                bookkeeping("default", application_name=name, statement_timeout=1, lock_timeout=1)
                with connections["default"].cursor() as cursor:
                    cursor.execute("SELECT current_setting('application_name')")
                    seen.append(cursor.fetchone()[0])
        finally:
            connections.close_all()

    thread = threading.Thread(target=bookkeeping_thread)
    thread.start()
    thread.join(10)
    assert seen == ["stalwart:supervisor:4241", "stalwart:worker:4242"]


@pytest.mark.skipif(not PGBOUNCER, reason="needs PgBouncer (python -m tests.pgbouncer)")
def test_behind_pgbouncer_the_queues_sessions_carry_their_name_and_nothing_it_refuses(
    postgresql, recorded_events
):
    queue = in_a_bookkeeping_session("SELECT current_setting('application_name')", pooled=True)
    # PgBouncer passes application_name on; the timeouts (the 'options' startup parameter,
    # which it refuses) are not sent, so the first connection is not refused either.
    assert queue == ("stalwart:worker:4242",)
    assert "session_options_refused" not in [action for action, _ in recorded_events]
