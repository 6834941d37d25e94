"""A job thread's connections between jobs: Django's request cycle, and never a dead one.

A job is a request: ``CONN_MAX_AGE`` and ``CONN_HEALTH_CHECKS`` mean what Django says they
mean. And once the worker has seen the database fail, each job thread checks its
connections before its next job, whatever ``CONN_HEALTH_CHECKS`` says.
"""

import os

import pytest
from django.db import connection, connections

from stalwart.models import Job
from tests.helpers import wait_for, worker_thread
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def conn_settings():
    """Change the default database's connection settings for threads started from now on."""
    saved = dict(connections.settings["default"])

    def change(**values):
        connections.settings["default"].update(values)

    yield change
    connections.settings["default"].clear()
    connections.settings["default"].update(saved)


def identities(count: int, worker, *, client: bool = False) -> list:
    """The connections ``count`` jobs used in turn: the server's session ids, or (``client``)
    Django's client connections, the same through a pooler in transaction mode."""
    task = tasks.client_connection_identity if client else tasks.connection_identity
    results = []
    for _ in range(count):
        result = task.enqueue()
        wait_for(
            lambda result=result: Job.objects.get(pk=result.id).status == "successful",
            message="the job",
        )
        result.refresh()
        results.append(result.return_value)
    return results


def test_conn_max_age_zero_gives_each_job_a_connection_of_its_own(conn_settings):
    conn_settings(CONN_MAX_AGE=0)
    with worker_thread(threads=1) as worker:
        seen = identities(3, worker, client=True)
    assert len(set(seen)) == 3


def test_persistent_connections_are_kept_from_one_job_to_the_next(conn_settings):
    conn_settings(CONN_MAX_AGE=None)
    with worker_thread(threads=1) as worker:
        seen = identities(3, worker, client=True)
    assert len(set(seen)) == 1


def test_after_an_outage_no_job_starts_on_a_connection_that_died(conn_settings, vendor):
    if vendor != "postgresql":
        pytest.skip("the session is ended with pg_terminate_backend (PostgreSQL's)")
    if os.environ.get("STALWART_PGBOUNCER_PORT"):
        pytest.skip(
            "behind PgBouncer a server session serves every client in turn: ending the job's "
            "ends the test's own (tests/faults restart a real server instead)"
        )
    conn_settings(CONN_MAX_AGE=None, CONN_HEALTH_CHECKS=False)
    with worker_thread(threads=1) as worker:
        (first,) = identities(1, worker)
        with connection.cursor() as cursor:  # a restart, for this one session
            cursor.execute("SELECT pg_terminate_backend(%s)", [first])
        worker.pool.suspicion.suspect()  # as the worker's loop does when it sees an outage
        (second,) = identities(1, worker)
    assert second != first
    assert not Job.objects.exclude(status="successful").exists()
