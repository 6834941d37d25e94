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


@pytest.fixture
def recorded_events():
    """Every event emitted during the test, as (action, fields) pairs."""
    seen: list[tuple[str, dict]] = []

    def record(action: str, fields: dict) -> None:
        seen.append((action, fields))

    events.subscribe(record)
    yield seen
    events.unsubscribe(record)
