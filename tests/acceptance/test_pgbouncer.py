"""Wake-ups through PgBouncer in transaction mode (the postgresql-pgbouncer leg), and a pool
that another application exhausts for as long as the alive threshold.

The queue's connections go through PgBouncer, where a LISTEN is lost as soon as the server
connection goes back to the pool. With ``listen_database`` (a direct connection) a worker
hears NOTIFY anyway; without it, it polls, and still runs every job.
"""

import os
import signal
import time
from collections import Counter

import psycopg
import pytest
from django.db import connections

from stalwart.models import Job, Process
from tests import processes
from tests.helpers import DATABASES, PGBOUNCER, SESSION_DATABASE, Child, child_env, wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution

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


# How long the pool stays saturated: the 60 s against the default 60 s alive
# threshold; here the same ratio to this run's threshold (tests.settings: STALWART_ALIVE).
SATURATION_RATIO = float(os.environ.get("STALWART_PGBOUNCER_SATURATION_RATIO", "1.0"))
POOL_SIZE = 15  # tests/pgbouncer.py: default_pool_size


def holders(count: int) -> list[psycopg.Connection]:
    """``count`` clients that each take a server connection of the pool and keep it (an open
    transaction, in transaction mode): another application exhausting the pool."""
    settings = connections["default"].settings_dict
    held = []
    for _ in range(count):
        client = psycopg.connect(
            host=settings["HOST"],
            port=settings["PORT"],
            user=settings["USER"],
            dbname=settings["NAME"],
            connect_timeout=10,
        )
        client.execute("SELECT 1")  # the transaction begins, and pins its server connection
        held.append(client)
    return held


def test_a_saturated_pool_loses_no_job_and_runs_no_finished_body_twice():
    """Another client holds every server connection of the pool for as long as the alive
    threshold (``STALWART_PGBOUNCER_SATURATION_RATIO`` times it): the tree's statements
    wait in PgBouncer's queue, its processes may reach their kill deadline and be replaced,
    and once the pool is free every job finishes, each body having run to its end once,
    none charged."""
    from django.conf import settings

    threshold = settings.TASKS["default"]["OPTIONS"]["process_alive_threshold"]
    saturation = SATURATION_RATIO * threshold
    connections.close_all()
    with Child(
        "queue", "supervise", "--processes", "1", "--threads", "2", env=child_env()
    ) as supervisor:
        wait_for(lambda: Process.objects.count() == 4, timeout=30, message="the tree to register")
        results = [tasks.record.enqueue(label="saturated", sleep=1.0) for _ in range(6)]
        wait_for(
            lambda: Job.objects.filter(status="running").exists(),
            message="the drain to be under way",
        )
        connections.close_all()  # the test's own connection gives its server one back
        held = holders(POOL_SIZE)
        try:
            time.sleep(saturation)  # holding every server connection of the pool
        finally:
            for client in held:
                client.close()
        ids = [result.id for result in results]
        wait_for(
            lambda: Job.objects.filter(pk__in=ids, status="successful").count() == len(ids),
            timeout=threshold + 60,
            message="every job to finish once the pool is free",
        )
        finished = Counter(
            str(job_id)
            for job_id in Execution.objects.filter(label="saturated").values_list(
                "job_id", flat=True
            )
        )
        assert finished == dict.fromkeys(ids, 1), (
            f"bodies that ran to their end, per job: {finished}\n{supervisor.output}"
        )
        # Starved past their kill deadline, its processes may have ended and been replaced:
        # the jobs they ran were interrupted, not charged.
        charged = {
            str(job.id): len(job.errors) for job in Job.objects.filter(pk__in=ids) if job.errors
        }
        assert not charged, f"jobs charged for the pool's saturation: {charged}"
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=60) == 0, supervisor.output
