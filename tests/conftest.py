import os

import pytest
from django.db import connection
from django.tasks import task_backends

from stalwart import events


def pytest_report_header(config: pytest.Config) -> str:
    return f"stalwart: database under test = {os.environ.get('STALWART_TEST_DATABASE', 'sqlite')}"


@pytest.fixture
def backend():
    return task_backends["default"]


@pytest.fixture
def vendor() -> str:
    return connection.vendor


@pytest.fixture(autouse=True)
def reap_children():
    """Kill and reap (whole tree) every child process a test started and left running: one
    whose test failed, or one it forgot. Left, it would go on claiming from the test
    database in later tests."""
    from tests.helpers import UNREAPED

    before = set(UNREAPED)
    yield
    for child in UNREAPED - before:
        child.__exit__()


@pytest.fixture
def recorded_events():
    """Every event emitted during the test, as (action, fields) pairs."""
    seen: list[tuple[str, dict]] = []

    def record(action: str, fields: dict) -> None:
        seen.append((action, fields))

    events.subscribe(record)
    yield seen
    events.unsubscribe(record)


if os.environ.get("STALWART_TEST_DATABASE") == "postgresql-pgbouncer":

    @pytest.fixture(scope="session")
    def django_db_setup(django_db_setup, django_db_blocker):
        """Through PgBouncer, the test database is dropped while PgBouncer still holds idle
        server connections to it: end them first, on PostgreSQL itself (``direct``)."""
        yield
        from django.db import connections

        with django_db_blocker.unblock(), connections["direct"].cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        connections["direct"].close()
