"""Attacks on the day's changes (a pending job holds its unique key, enqueue_after decides a
dependant whose parent had ended, batch retention, the claim's index): races between real
connections on the database under test, and what each must end with.
"""

import threading
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.utils import timezone

from stalwart import After, enqueue_after
from stalwart.control import prune_finished
from stalwart.exceptions import InvalidDependency
from stalwart.models import Job
from tests.helpers import drain, wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

DAY = timedelta(days=1)


def job(result) -> Job:
    return Job.objects.get(pk=result.id)


def lock_waits() -> int:
    """How many of the test database's sessions wait for a row lock now (SQLite: none,
    its writers wait for the database's write lock before they read)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        elif connection.vendor == "mysql":
            # INNODB_TRX is a cache that MariaDB refreshes only after 0.1 s without a read:
            # pollers of other test processes can keep it stale. A statement of this
            # database on the job table still running after 0.2 s waits, in these tests.
            cursor.execute(
                "SELECT (SELECT count(*) FROM information_schema.innodb_trx "
                "        WHERE trx_state = 'LOCK WAIT') "
                "     + (SELECT count(*) FROM information_schema.processlist "
                "        WHERE db = DATABASE() AND id <> CONNECTION_ID() AND command = 'Query' "
                "          AND info LIKE '%%stalwart_job%%' AND time_ms > 200)"
            )
        else:
            return 1
        return cursor.fetchone()[0]


def in_thread(work, outcome: dict, name: str) -> threading.Thread:
    def run() -> None:
        try:
            outcome[name] = work()
        except BaseException as error:  # noqa: BLE001 - asserted by the test
            outcome[name] = error
        finally:
            connections.close_all()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# -- enqueue_after racing retention --------------------------------------------------------


@pytest.mark.parametrize("on_failure", ["cancel", "run"])
def test_enqueue_after_a_parent_that_retention_deletes_meanwhile_is_refused_or_decided(
    on_failure,
):
    """Retention deletes an old parent (no dependant yet: has_dependants is false) in a
    transaction that commits only once the enqueue after it has read the parent and waits
    for its lock. The enqueue must then refuse (InvalidDependency) or decide the dependant;
    a pending job whose only parent is gone would wait for the sweep, a minute on."""
    parent = tasks.add.enqueue(1, 2)
    drain(threads=1)
    assert job(parent).status == "successful"
    Job.objects.filter(pk=parent.id).update(finished_at=timezone.now() - 2 * DAY)
    deleted, go = threading.Event(), threading.Event()
    outcome: dict = {}

    def prune() -> int:
        with transaction.atomic():
            count = prune_finished(older_than=DAY)
            deleted.set()
            assert go.wait(20)
        return count

    pruner = in_thread(prune, outcome, "pruned")
    assert deleted.wait(20)
    enqueuer = in_thread(
        lambda: enqueue_after([After(parent, on_failure=on_failure)], tasks.noop),
        outcome,
        "child",
    )
    wait_for(lambda: lock_waits() or "child" in outcome, message="the enqueue to wait")
    go.set()
    pruner.join(20)
    enqueuer.join(20)
    assert outcome["pruned"] == 1
    child = outcome["child"]
    if isinstance(child, InvalidDependency):
        assert not Job.objects.exclude(pk=parent.id).exists()
        return
    assert not isinstance(child, BaseException), child
    assert not Job.objects.filter(pk=parent.id).exists()
    assert job(child).status == ("cancelled" if on_failure == "cancel" else "ready")


# -- a retry of a failed unique job racing a twin that takes the key ------------------------


def failed_unique(day: str):
    """A job of ``unique_report(day)`` that failed for good: it holds no key."""
    report = tasks.unique_report.enqueue(day)
    Job.objects.filter(pk=report.id).update(status="failed", finished_at=timezone.now(), attempt=1)
    return report


@pytest.mark.parametrize("twin_by", ["enqueue", "revive"])
def test_a_retry_racing_an_uncommitted_twin_leaves_the_failed_job_failed(twin_by):
    """A twin takes the key in a transaction not committed yet (a caller's enqueue, or a
    retry of a parent that revives a unique dependant); the retry of the failed job cannot
    see it, waits for it at the unique index, and must answer: not retried (the twin holds
    the key), never an IntegrityError."""
    from stalwart.control import Selection, retry_failed

    failed = failed_unique("friday")
    if twin_by == "revive":
        parent = tasks.fail.enqueue("parent")
        Job.objects.filter(pk=parent.id).update(max_attempts=1)
        dependant = enqueue_after([parent], tasks.unique_report, "friday")
        drain(threads=1)
        assert job(dependant).status == "cancelled"
    holding, commit = threading.Event(), threading.Event()
    outcome: dict = {}

    def take_the_key() -> object:
        with transaction.atomic():
            if twin_by == "enqueue":
                taken = tasks.unique_report.enqueue("friday").id
            else:
                assert retry_failed(Selection(ids=[parent.id])) == 1
                taken = dependant.id
            holding.set()
            assert commit.wait(20)
        return taken

    holder = in_thread(take_the_key, outcome, "twin")
    assert holding.wait(20), outcome
    retrier = in_thread(lambda: retry_failed(Selection(ids=[failed.id])), outcome, "retried")
    if connection.vendor != "sqlite":
        wait_for(lambda: lock_waits() or "retried" in outcome, message="the retry to wait")
    commit.set()
    holder.join(20)
    retrier.join(20)
    assert not isinstance(outcome["twin"], BaseException), outcome["twin"]
    assert outcome["retried"] == 0, outcome["retried"]
    assert job(failed).status == "failed"
    key = tasks.unique_report.unique_key_for(["friday"], {})
    from stalwart.models.job import UNIQUE_STATES

    holders = list(Job.objects.filter(UNIQUE_STATES, unique_key=key).values_list("pk", flat=True))
    assert [str(pk) for pk in holders] == [str(outcome["twin"])]


# -- the claim on every queue at the priority range's edges ----------------------------------


@pytest.mark.parametrize("selector", ["*", "edge*", "*,!other", "edge"])
def test_every_claim_shape_takes_jobs_at_the_edges_of_the_priority_range_in_order(selector):
    """``claim_any``'s condition (and the claim on every queue) say ``priority >= -100``: a
    job at -100 is still claimed, last; one at 100 first; an isolated job is left to a
    claimant that runs it alone, whatever its priority."""
    from stalwart.jobs import JobStore
    from stalwart.queues import QueueSelector
    from tests.helpers import register_processes

    register_processes(61, 62)
    made = {
        priority: tasks.noop.using(queue_name="edge", priority=priority).enqueue().id
        for priority in (-100, 0, 100, -99, 99)
    }
    alone = tasks.noop.using(queue_name="edge", priority=-100).enqueue().id
    Job.objects.filter(pk=alone).update(isolated=True)
    store = JobStore("default")
    took = []
    for _ in range(5):
        claimed = store.claim(
            owner=61, worker_name="w61", selector=QueueSelector.parse(selector), limit=1
        )
        took += [str(claimed_job.id) for claimed_job in claimed]
    assert took == [made[priority] for priority in (100, 99, 0, -99, -100)]
    assert (
        store.claim(owner=61, worker_name="w61", selector=QueueSelector.parse(selector), limit=5)
        == []
    )
    isolated = store.claim(
        owner=62,
        worker_name="w62",
        selector=QueueSelector.parse(selector),
        limit=5,
        isolated_first=True,
    )
    assert [str(claimed_job.id) for claimed_job in isolated] == [alone]


# -- enqueue_after's locks, in id order --------------------------------------------------------


def test_enqueue_after_failed_parents_takes_their_locks_in_id_order():
    """enqueue_after marks the parents without dependants (locking them), then decides the
    dependant of parents that ended, locking the failed ones: two sets of locks, each in id
    order, but not together. Another transaction that locks the same failed parents in id
    order (a retry by hand, retention) holds the first and wants the second, which the
    enqueue holds while it waits for the first: a deadlock, and the enqueue is its victim."""
    from stalwart.control import Selection, retry_failed

    first, second = (tasks.fail.enqueue("parent") for _ in range(2))
    Job.objects.filter(pk__in=[first.id, second.id]).update(max_attempts=1)
    drain(threads=1)
    assert {job(first).status, job(second).status} == {"failed"}
    low, high = sorted([first, second], key=lambda result: str(job(result).pk))
    # The lower one has a dependant already (marked), the higher one none.
    enqueue_after([After(low, on_failure="run")], tasks.noop)
    assert (job(low).has_dependants, job(high).has_dependants) == (True, False)
    holding, go = threading.Event(), threading.Event()
    outcome: dict = {}

    def retry_both_in_one_transaction() -> int:
        with transaction.atomic():
            count = retry_failed(Selection(ids=[low.id]))
            holding.set()
            assert go.wait(20)
            return count + retry_failed(Selection(ids=[high.id]))

    retrier = in_thread(retry_both_in_one_transaction, outcome, "retried")
    assert holding.wait(20), outcome
    enqueuer = in_thread(
        lambda: enqueue_after(
            [After(low, on_failure="run"), After(high, on_failure="run")], tasks.noop
        ),
        outcome,
        "child",
    )
    if connection.vendor != "sqlite":
        wait_for(lambda: lock_waits() or "child" in outcome, message="the enqueue to wait")
    go.set()
    retrier.join(30)
    enqueuer.join(30)
    assert not isinstance(outcome["child"], BaseException), outcome["child"]
    assert not isinstance(outcome["retried"], BaseException), outcome["retried"]


# -- a dependant decided at its enqueue, in a transaction that rolls back --------------------


def test_a_dependant_decided_at_its_enqueue_in_a_rolled_back_transaction_never_existed():
    """The enqueue releases a dependant whose parent had succeeded, in the caller's
    transaction: rolled back, neither the job, nor its edge, nor the parent's mark, nor its
    unique key is left."""
    from stalwart.models import Dependency

    parent = tasks.add.enqueue(1, 2)
    drain(threads=1)
    with transaction.atomic():
        report = enqueue_after([parent], tasks.unique_report, "rolled back")
        assert job(report).status == "ready"
        transaction.set_rollback(True)
    assert list(Job.objects.values_list("pk", flat=True)) == [job(parent).pk]
    assert not Dependency.objects.exists()
    assert job(parent).has_dependants is False
    again = tasks.unique_report.enqueue("rolled back")
    assert job(again).status == "ready"
