"""Only the database's clock decides: hosts whose clocks are wrong (``faketime``) enqueue,
retry and prune by the database's time, never by their own.

PostgreSQL only: SQLite lives on one host, whose clock is the database's.
"""

import os
import subprocess
import sys
from datetime import UTC, timedelta
from pathlib import Path

import pytest
from django.db import connection, connections

from stalwart.models import Job
from tests.helpers import ROOT, Child, child_env, wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ENQUEUE_LATER = """
import sys
from datetime import datetime
import django
django.setup()
from tests.testapp import tasks
when = datetime.fromisoformat(sys.argv[1])
print(tasks.noop.using(run_after=when).enqueue().id)
"""


def libfaketime() -> str | None:
    found = sorted(Path("/usr/lib").glob("*/faketime/libfaketimeMT.so.1"))
    return str(found[0]) if found else None


@pytest.fixture
def skewed(vendor):
    """The environment of a process whose clock is ``offset`` off (its monotonic clock is
    not: only the time of day is wrong, as on a host whose clock is)."""
    if vendor == "sqlite":
        pytest.skip("SQLite's clock is its host's: there is no other clock to disagree with")
    library = libfaketime()
    if library is None:
        if os.environ.get("CI") == "true":
            pytest.fail("libfaketime is missing; scripts/test installs it (Debian: faketime)")
        pytest.skip("libfaketime is not installed (Debian package faketime)")

    def environment(offset: str) -> dict[str, str]:
        return child_env(LD_PRELOAD=library, FAKETIME=offset, FAKETIME_DONT_FAKE_MONOTONIC="1")

    return environment


def database_now():
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SELECT UTC_TIMESTAMP(6)")
            return cursor.fetchone()[0].replace(tzinfo=UTC)
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


def test_a_host_whose_clock_is_fast_cannot_make_a_job_due_early(skewed):
    # Due in two minutes by the database's clock, long past by the host's (five minutes
    # fast): the command has two minutes to start and enqueue, however loaded the machine.
    run_after = database_now() + timedelta(seconds=120)
    enqueued = subprocess.run(
        [sys.executable, "-c", ENQUEUE_LATER, run_after.isoformat()],
        cwd=ROOT,
        env=skewed("+300s"),
        capture_output=True,
        text=True,
        timeout=110,
        check=True,
    )
    job = Job.objects.get(pk=enqueued.stdout.strip())
    assert job.status == "scheduled"  # its host thought it due: the database did not
    assert job.available_at == run_after


@pytest.mark.parametrize("offset", ["+600s", "-90s"])
def test_a_retry_waits_its_backoff_by_the_database_clock(skewed, offset):
    result = tasks.fails_slowly.enqueue()  # retried after 30 s
    connections.close_all()
    with Child("queue", "work", "--poll-interval", "0.05", env=skewed(offset)) as worker:
        wait_for(
            lambda: Job.objects.get(pk=result.id).status == "scheduled",
            timeout=20,
            message="the first attempt to fail",
        )
        worker.signal(15)
        assert worker.wait(timeout=30) == 0, worker.output
    job = Job.objects.get(pk=result.id)
    waits = (job.available_at - job.last_attempted_at).total_seconds()
    # Never before its 30 s by the database's clock; after it by the attempt's run and its
    # write (a moment, allowed many times over). Either skew would be far outside: 630 s, -60 s.
    assert 30 <= waits < 45, f"the retry waits {waits:.1f} s by the database clock, not 30 s"


def test_pruning_from_a_host_whose_clock_is_fast_keeps_recent_jobs(skewed):
    result = tasks.add.enqueue(1, 1)
    Job.objects.filter(pk=result.id).update(
        status="successful", finished_at=database_now() - timedelta(minutes=30)
    )
    connections.close_all()
    with Child("queue", "prune", "--older-than", "1h", env=skewed("+2h")) as pruning:
        assert pruning.wait(timeout=60) == 0, pruning.output
    assert Job.objects.filter(pk=result.id).exists()  # 30 minutes old, by the database
    with Child("queue", "prune", "--older-than", "20m", env=skewed("-2h")) as pruning:
        assert pruning.wait(timeout=60) == 0, pruning.output
    assert not Job.objects.filter(pk=result.id).exists()
