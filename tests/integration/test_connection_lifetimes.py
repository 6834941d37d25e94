"""Stalwart keeps no thread's connection alive: each goes when its thread closes it and ends."""

import gc
import threading

import pytest
from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from stalwart.models import Job
from tests.helpers import drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def live_connection_objects() -> int:
    gc.collect()
    # type(), not isinstance(): isinstance() asks __class__, which sets up Django's lazy objects.
    return sum(1 for thing in gc.get_objects() if issubclass(type(thing), BaseDatabaseWrapper))


def in_short_lived_threads(work, count: int, *, at_once: int = 10) -> None:
    """Run ``work(n)`` in ``count`` threads, ``at_once`` at a time, each closing its
    connections at the end as Django does after a request (or as an app's thread should)."""
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            work(n)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)
        finally:
            connections.close_all()

    for start in range(0, count, at_once):
        threads = [threading.Thread(target=run, args=(n,)) for n in range(start, start + at_once)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert not any(thread.is_alive() for thread in threads)
    assert errors == []


def test_threads_that_enqueue_leave_no_connection_object_behind():
    before = live_connection_objects()

    def enqueue(n: int) -> None:
        if n % 2:
            tasks.add.enqueue(n, 1)
        else:
            tasks.unique_report.enqueue(day=f"day-{n}")  # the guarded insert, ON CONFLICT

    in_short_lived_threads(enqueue, 200)
    assert Job.objects.count() == 200
    assert live_connection_objects() - before < 10


def test_workers_that_come_and_go_leave_no_connection_object_behind():
    tasks.add.enqueue(1, 1)
    drain(threads=2)
    before = live_connection_objects()
    for n in range(10):
        tasks.add.enqueue(n, 1)
        drain(threads=2)  # a worker in its own threads: claims decode rows, heartbeats write
    assert Job.objects.filter(status="successful").count() == 11
    assert live_connection_objects() - before < 5
