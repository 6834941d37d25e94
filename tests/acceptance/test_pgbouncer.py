"""Wake-ups through PgBouncer in transaction mode (the postgresql-pgbouncer leg).

The queue's connections go through PgBouncer, where a LISTEN is lost as soon as the server
connection goes back to the pool. With ``listen_database`` (a direct connection) a worker
hears NOTIFY anyway; without it, it polls, and still runs every job.
"""

import signal

import pytest
from django.db import connections

from stalwart.models import Job
from tests import processes
from tests.helpers import DATABASES, PGBOUNCER, SESSION_DATABASE, Child, wait_for
from tests.testapp import tasks

pytestmark = [
    pytest.mark.django_db(transaction=True, databases=DATABASES),
    pytest.mark.skipif(
        not PGBOUNCER,
        reason="needs PgBouncer: run with python -m tests.pgbouncer (the pgbouncer leg of "
        "scripts/test)",
    ),
]


def start_worker(*extra: str, **env: str) -> Child:
    return processes.start_worker("--threads", "2", *extra, **env)


def listening_sessions(pid: int) -> int:
    """The worker's sessions that ran LISTEN, as PostgreSQL itself sees them."""
    with connections[SESSION_DATABASE].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s AND query LIKE 'LISTEN %%'",
            [f"stalwart:worker:{pid}:listener"],
        )
        return cursor.fetchone()[0]


def done(job_id: str) -> bool:
    return Job.objects.filter(pk=job_id, status="successful").exists()


def stop(worker: Child) -> None:
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=30) == 0, worker.output


def test_an_idle_worker_behind_pgbouncer_is_woken_by_notify_on_the_direct_connection():
    # Polling once a minute: a job run within seconds was announced by NOTIFY.
    with start_worker("--poll-interval", "60") as worker:
        wait_for(lambda: listening_sessions(worker.pid) == 1, message="the worker to LISTEN")
        result = tasks.noop.enqueue()
        wait_for(lambda: done(result.id), timeout=20, message="the job to be run")
        stop(worker)
    # Nothing it sent through PgBouncer was refused (the timeouts' startup parameter).
    assert "session_options_refused" not in worker.output
    assert "Traceback" not in worker.output


def test_without_listen_database_a_worker_behind_pgbouncer_polls_and_runs_every_job():
    with start_worker("--poll-interval", "0.2", STALWART_LISTEN_DATABASE="") as worker:
        results = [tasks.noop.enqueue() for _ in range(5)]
        for result in results:
            wait_for(lambda result=result: done(result.id), message="the job to be run")
        assert listening_sessions(worker.pid) == 0  # no LISTEN anywhere
        stop(worker)
    assert "session_options_refused" not in worker.output
    assert "Traceback" not in worker.output
