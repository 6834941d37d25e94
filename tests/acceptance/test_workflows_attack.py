"""Attacks on jobs that run after other jobs, with real processes (``queue supervise``,
``queue work``): reproducers of what breaks on bc92de9."""

import time

import pytest
from django.db import connection

from stalwart import enqueue_after
from stalwart.models import Job
from tests.acceptance.supervision import start_supervisor, stop
from tests.helpers import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _successful(result) -> bool:
    return Job.objects.filter(pk=result.id, status="successful").exists()


def test_a_listening_dispatcher_releases_a_dependant_within_its_polling_interval(reaped):
    """FAILS on bc92de9 (PostgreSQL, LISTEN/NOTIFY on, the default): a dependant enqueued
    while the dispatcher sleeps waits up to ``listen_timeout`` (30 s) after its parent has
    succeeded, not ``polling_interval`` (0.1 s in the test settings, 1 s by default) as
    docs/how-to/workflows.md promises. The dispatcher caps its wait at polling_interval only
    if some job was pending *at its last look* (dispatcher.py:103-106); a pending job's
    INSERT sends no notification (db/claims/postgresql.py _INSERT_ONE_NOTIFIED has no
    'pending' branch; likewise the many-row insert), and a parent's end notifies nobody, so
    a dispatcher that went to sleep with nothing pending sleeps its full listen_timeout.
    Fix: notify the scheduled channel for a pending insert (due now), so the dispatcher
    wakes, sees the pending job and shortens its wait."""
    if connection.vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY: PostgreSQL only")
    supervisor = start_supervisor("--processes", "1", "--threads", "2", children=3)
    reaped.append(supervisor)

    # Warm-up: once this dependant has run, the dispatcher's last look released it and
    # found nothing pending: it now sleeps listen_timeout (nothing scheduled either).
    warm_parent = tasks.noop.enqueue()
    warm_child = enqueue_after([warm_parent], tasks.noop)
    wait_for(lambda: _successful(warm_child), timeout=45, message="the warm-up dependant")

    parent = tasks.noop.enqueue()
    child = enqueue_after([parent], tasks.noop)
    wait_for(lambda: _successful(parent), timeout=10, message="the parent to run")
    parent_done = time.monotonic()
    wait_for(lambda: _successful(child), timeout=45, message="the dependant to run at all")
    latency = time.monotonic() - parent_done

    assert stop(supervisor) == 0, supervisor.output
    assert latency < 5, (
        f"the dependant ran {latency:.1f} s after its parent, polling_interval is 0.1 s"
    )
