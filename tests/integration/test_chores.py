"""Chores that scale: the slot sweep is set-based, bounded per transaction and done by the
holder of its lease; the orphan sweep is bounded; bulk retries go through failed jobs once;
``--stop-when-empty`` asks for the waiting queues, not for the waiting jobs."""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.tasks import default_task_backend
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from stalwart import control
from stalwart.control import Selection
from stalwart.db import statements_for
from stalwart.jobs import JobStore
from stalwart.models import Job
from stalwart.processes import registry
from stalwart.processes.chores import Chores
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def blocked_with_free_slots(keys: int, *, prefix: str = "key") -> list[str]:
    """One blocked job per key (limit 1), whose slot nobody holds: the sweep's work."""
    now = timezone.now()
    names = [f"{prefix}-{number:04}" for number in range(keys)]
    Job.objects.bulk_create(
        Job(
            id=uuid.uuid4(),
            task_path="tests.testapp.tasks.noop",
            queue_name="default",
            status="blocked",
            available_at=now,
            enqueued_at=now,
            concurrency_key=name,
            concurrency_limit=1,
        )
        for name in names
    )
    return names


def test_the_slot_sweep_costs_a_few_statements_whatever_the_number_of_keys():
    blocked_with_free_slots(300)
    store = JobStore("default")
    with CaptureQueriesContext(connection) as queries:
        assert store.unblock_all() == 300
    assert set(Job.objects.values_list("status", flat=True)) == {"ready"}
    # Two transactions of a few statements (the second finds no key left), not a few per
    # key: the old sweep sent over a thousand here.
    assert len(queries) <= 20, [query["sql"][:80] for query in queries]


def test_the_slot_sweep_is_bounded_per_transaction_and_goes_on_where_it_stopped():
    names = blocked_with_free_slots(250)
    store = JobStore("default")
    made_ready, after = store.unblock_batch(after=None, batch=100)
    assert (made_ready, after) == (100, names[99])
    ready = set(Job.objects.filter(status="ready").values_list("concurrency_key", flat=True))
    assert ready == set(names[:100])
    assert store.unblock_batch(after=after, batch=100) == (100, names[199])
    assert store.unblock_batch(after=names[199], batch=100) == (50, names[249])
    assert store.unblock_batch(after=names[249], batch=100) == (0, None)  # done


def test_the_sweep_keeps_the_limits_and_the_order_of_each_key():
    first = tasks.two_per_account.enqueue(1)
    tasks.two_per_account.enqueue(1)
    urgent = tasks.two_per_account.using(priority=5).enqueue(1)
    later = tasks.two_per_account.enqueue(1)
    # The first job's slot frees without a hand-on: the sweep gives it to the urgent one.
    Job.objects.filter(pk=first.id).update(status="successful")
    assert JobStore("default").unblock_all() == 1
    assert Job.objects.get(pk=urgent.id).status == "ready"
    assert Job.objects.get(pk=later.id).status == "blocked"
    assert JobStore("default").unblock_all() == 0  # both slots are taken again


def test_one_process_in_the_cluster_sweeps_the_slots():
    config = default_task_backend.config
    one, other = Chores(config, holder="dispatcher-one"), Chores(config, holder="dispatcher-two")
    blocked_with_free_slots(3, prefix="first")
    one.sweep_slots(now=0.0)  # takes the lease, and sweeps
    assert set(Job.objects.values_list("status", flat=True)) == {"ready"}
    waiting = blocked_with_free_slots(1, prefix="second")
    other.sweep_slots(now=0.0)  # the lease is the first one's: no sweep here
    assert Job.objects.get(concurrency_key=waiting[0]).status == "blocked"
    one.sweep_slots(now=10_000.0)  # its next sweep, once due
    assert Job.objects.get(concurrency_key=waiting[0]).status == "ready"


def test_a_sweep_of_many_keys_is_spread_over_calls(monkeypatch):
    monkeypatch.setattr("stalwart.processes.chores.SLOT_SWEEP_BATCH", 10)
    chores = Chores(default_task_backend.config, holder="dispatcher-one")
    blocked_with_free_slots(25)
    ready = []
    for _ in range(3):  # each call: one batch of 10 keys, then the next call goes on
        chores.sweep_slots(now=0.0)
        ready.append(Job.objects.filter(status="ready").count())
    assert ready == [10, 20, 25]


def test_the_orphan_sweep_takes_jobs_back_in_bounded_transactions(monkeypatch):
    monkeypatch.setattr(registry, "ORPHAN_OWNERS_PER_TRANSACTION", 2)
    now = timezone.now()
    Job.objects.bulk_create(
        Job(
            id=uuid.uuid4(),
            task_path="tests.testapp.tasks.noop",
            queue_name="default",
            status="running",
            available_at=now,
            enqueued_at=now,
            attempt=1,
            owner=1000 + number,  # no such process
        )
        for number in range(5)
    )
    released = registry.release_orphans("default")
    assert len(released) == 5
    assert set(Job.objects.values_list("status", flat=True)) == {"ready"}


def test_a_bulk_retry_in_small_batches_goes_through_every_failed_job_once():
    results = [tasks.unique_report.enqueue(f"day-{number}") for number in range(5)]
    Job.objects.update(status="failed", finished_at=timezone.now())
    twin = tasks.unique_report.enqueue("day-2")  # waits with the key of a failed job
    everything = Selection(everything=True)
    assert control.retry_failed(everything, dry_run=True) == 4
    assert control.retry_failed(everything, batch_size=2) == 4
    states = dict(Job.objects.values_list("id", "status"))
    assert [states[uuid.UUID(result.id)] for result in results] == [
        "ready",
        "ready",
        "failed",  # its twin holds the key: left as it is
        "ready",
        "ready",
    ]
    assert states[uuid.UUID(twin.id)] == "ready"


def test_the_waiting_queues_are_those_with_ready_blocked_or_scheduled_jobs():
    tasks.noop.using(queue_name="ready-here").enqueue()
    tasks.noop.using(queue_name="later", run_after=timezone.now() + timedelta(hours=1)).enqueue()
    tasks.one_at_a_time.using(queue_name="slots").enqueue("k")
    tasks.one_at_a_time.using(queue_name="slots-blocked").enqueue("k")
    tasks.noop.using(queue_name="done").enqueue()
    Job.objects.filter(queue_name="done").update(status="successful")
    with connection.cursor() as cursor:
        queues = statements_for(connection).waiting_queues(cursor)
    assert queues == ["later", "ready-here", "slots", "slots-blocked"]
