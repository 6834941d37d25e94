"""SQLite with no set-up: the README's quickstart, with ``startproject``'s own database
settings, several workers and several processes enqueueing at once, loses nothing."""

import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from tests.helpers import Child, child_env, wait_for

ENQUEUERS = 4
CALLS = 250  # per enqueuer

# Half the enqueuers enqueue in autocommit; the others as a view in a transaction does,
# after reading (the write lock is then asked for while a worker may hold it).
ENQUEUE = """
import sys
from django.db import transaction
from tests.testapp import tasks
from tests.testapp.models import Execution

errors = []
for number in range({calls}):
    try:
        if {in_transaction}:
            with transaction.atomic():
                Execution.objects.count()
                tasks.record.enqueue(label="quickstart")
        else:
            tasks.record.enqueue(label="quickstart")
    except Exception as error:
        errors.append(f"{{type(error).__name__}}: {{error}}")
print(f"errors={{len(errors)}}", sorted(set(errors)))
"""


def counts(database: Path) -> dict[str, int]:
    with closing(sqlite3.connect(database, timeout=30)) as connection:
        return dict(connection.execute("SELECT status, count(*) FROM stalwart_job GROUP BY 1"))


@pytest.mark.any_database
def test_the_quickstart_with_two_workers_and_four_enqueuers_loses_no_enqueue(tmp_path, vendor):
    if vendor != "sqlite":
        pytest.skip("the quickstart's database is SQLite, whatever the suite runs on")
    env = child_env(
        DJANGO_SETTINGS_MODULE="tests.quickstart_settings", STALWART_QUICKSTART_DIR=str(tmp_path)
    )
    with Child("migrate", env=env) as migrate:
        assert migrate.wait(timeout=120) == 0, migrate.output
    workers = [Child("queue", "work", env=env) for _ in range(2)]
    enqueuers: list[Child] = []
    try:
        for number in range(ENQUEUERS):
            code = ENQUEUE.format(calls=CALLS, in_transaction=number % 2 == 1)
            enqueuers.append(Child("shell", "--no-imports", "-c", code, env=env))
        for enqueuer in enqueuers:
            assert enqueuer.wait(timeout=120) == 0, enqueuer.output
            assert "errors=0 []" in enqueuer.output, enqueuer.output
        total = ENQUEUERS * CALLS
        wait_for(
            lambda: counts(tmp_path / "db.sqlite3").get("successful") == total,
            timeout=120,
            message=f"the {total} jobs to run",
        )
        for worker in workers:
            worker.signal(15)
        for worker in workers:
            assert worker.wait(timeout=60) == 0, worker.output
            assert "database is locked" not in worker.output, worker.output
    finally:
        for child in workers + enqueuers:
            child.__exit__()
    assert counts(tmp_path / "db.sqlite3") == {"successful": total}
    with closing(sqlite3.connect(tmp_path / "db.sqlite3")) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
