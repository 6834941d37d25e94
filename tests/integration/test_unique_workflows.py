"""Unique tasks in workflows (issue 20): a job waiting for its parents holds its unique key,
as any waiting job; ``enqueue_after``, ``chain`` and batches compose with uniqueness.

A call whose key a twin holds stores nothing (no job, no edge, no membership) and returns
the twin, as ``enqueue`` does; a job moved back to ``pending`` (a dependant revived when its
parent is retried by hand) respects the key, and a key conflict is never an error.

Workers are real (threads of the test process with connections of their own), on the
database under test; races use threads with connections of their own.
"""

import threading
import uuid

import pytest
from django.db import connection, connections, transaction

import stalwart
from stalwart import Call, chain, enqueue_after
from stalwart.control import Selection, retry_failed
from stalwart.exceptions import InvalidBatch
from stalwart.models import Batch as BatchRow
from stalwart.models import BatchJob, Dependency, Job
from stalwart.models.job import UNIQUE_STATES
from tests.helpers import at_once, drain, wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def job(result) -> Job:
    return Job.objects.get(pk=result.id)


def holders(day: str) -> list[Job]:
    """The jobs of ``unique_report(day)`` that hold its key (``UNIQUE_STATES``)."""
    key = tasks.unique_report.unique_key_for([day], {})
    return list(Job.objects.filter(UNIQUE_STATES, unique_key=key))


def failed_parent():
    """A job that fails for good at its first attempt, once a worker runs it."""
    parent = tasks.fail.enqueue("parent")
    Job.objects.filter(pk=parent.id).update(max_attempts=1)
    return parent


def edges() -> set[tuple[uuid.UUID, uuid.UUID]]:
    return set(Dependency.objects.values_list("child", "parent"))


# -- enqueue_after ---------------------------------------------------------------------------


def test_a_unique_dependant_holds_its_key_while_it_waits_for_its_parents(recorded_events):
    parent = tasks.add.enqueue(1, 2)
    report = enqueue_after([parent], tasks.unique_report, "monday")
    assert job(report).status == "pending"
    assert job(report).unique_key is not None

    again = tasks.unique_report.enqueue("monday")
    assert again.id == report.id
    many = stalwart.enqueue_many(tasks.unique_report, [Call("monday"), Call(day="monday")])
    assert [result.id for result in many] == [report.id, report.id]
    assert [holder.pk for holder in holders("monday")] == [uuid.UUID(report.id)]
    assert ("job_deduplicated", {"task": tasks.unique_report.module_path, "job": report.id}) in (
        recorded_events
    )

    drain(threads=2)
    assert job(report).status == "successful"
    assert job(report).return_value == "monday"
    # Once it has run, the key is free: an equal call makes a new job.
    assert tasks.unique_report.enqueue("monday").id != report.id


def test_enqueue_after_with_a_held_key_returns_the_twin_and_writes_nothing():
    waiting = tasks.unique_report.enqueue("tuesday")
    parent = tasks.add.enqueue(1, 2)
    jobs_before = Job.objects.count()

    again = enqueue_after([parent], tasks.unique_report, "tuesday")

    assert again.id == waiting.id
    assert Job.objects.count() == jobs_before
    assert edges() == set()
    assert not job(parent).has_dependants, "a parent was marked for a dependant never stored"
    assert job(waiting).status == "ready", "the twin started waiting for the parents"

    # A pending twin, too: the second call's parents are not added to the first's.
    first_parent, second_parent = tasks.noop.enqueue(), tasks.noop.enqueue()
    pending = enqueue_after([first_parent], tasks.unique_report, "wednesday")
    twin = enqueue_after([second_parent], tasks.unique_report, "wednesday")
    assert twin.id == pending.id
    assert edges() == {(uuid.UUID(pending.id), uuid.UUID(first_parent.id))}
    assert not job(second_parent).has_dependants

    drain(threads=2)
    assert job(pending).status == "successful"


def test_enqueue_after_inside_a_transaction_that_rolls_back_leaves_the_key_free():
    parent = tasks.noop.enqueue()
    with transaction.atomic():
        enqueue_after([parent], tasks.unique_report, "thursday")
        transaction.set_rollback(True)
    assert holders("thursday") == []
    report = enqueue_after([parent], tasks.unique_report, "thursday")
    assert [holder.pk for holder in holders("thursday")] == [uuid.UUID(report.id)]


def test_a_chain_whose_link_is_unique_runs_and_a_second_chain_runs_after_that_link():
    first = chain(
        (tasks.add, Call(1, 2)),
        (tasks.unique_report, Call("friday")),
        tasks.parent_states,
    )
    assert [job(link).status for link in first] == ["ready", "pending", "pending"]
    # An equal chain: its unique link is the first chain's, and its next link runs after it.
    second = chain(
        (tasks.add, Call(3, 4)),
        (tasks.unique_report, Call("friday")),
        (tasks.noop, Call()),
    )
    assert second[1].id == first[1].id
    assert Job.objects.count() == 5
    assert edges() == {
        (uuid.UUID(first[1].id), uuid.UUID(first[0].id)),
        (uuid.UUID(first[2].id), uuid.UUID(first[1].id)),
        (uuid.UUID(second[2].id), uuid.UUID(first[1].id)),
    }
    assert not job(second[0]).has_dependants

    drain(threads=3)
    assert {job(link).status for link in [*first, *second]} == {"successful"}
    assert job(first[1]).return_value == "friday"
    assert job(first[2]).return_value == ["SUCCESSFUL"]
    started = job(first[1]).started_at
    assert job(first[0]).finished_at <= started
    assert job(second[2]).started_at >= job(first[1]).finished_at


# -- batches ---------------------------------------------------------------------------------


def test_a_batch_with_unique_members_counts_only_the_jobs_it_made():
    outside = tasks.unique_report.enqueue("a")
    other = stalwart.batch(label="other")
    of_other = other.enqueue(tasks.unique_report, "d")
    with stalwart.batch(
        on_success=(tasks.batch_report, Call(note="ok")), on_finish=tasks.batch_report
    ) as batch:
        results = batch.enqueue_many(
            tasks.unique_report, [Call("a"), Call("b"), Call("b"), Call("c"), Call("d")]
        )
        again = batch.enqueue(tasks.unique_report, "c")
    other.close()

    ids = [result.id for result in results]
    assert ids[0] == outside.id  # a job of no batch
    assert ids[1] == ids[2]  # an earlier call of the same list
    assert again.id == ids[3]  # a member already
    assert ids[4] == of_other.id  # a member of another batch
    members = {str(link.job) for link in BatchJob.objects.filter(batch=batch.id, role="member")}
    assert members == {ids[1], ids[3]}
    assert BatchRow.objects.get(pk=batch.id).total == 2
    assert batch.progress().total == 2
    assert BatchRow.objects.get(pk=other.id).total == 1
    assert [result.id for result in batch.results()] == [ids[1], ids[3]]

    drain(threads=3)
    assert batch.finished
    links = BatchJob.objects.filter(batch=batch.id).exclude(role="member")
    assert sorted(link.role for link in links) == ["on_finish", "on_success"]
    report = Job.objects.get(pk=links.get(role="on_success").job).return_value
    assert (report["total"], report["succeeded"], report["failed"]) == (2, 2, 0)
    assert sorted(report["results"]) == ["b", "c"]
    assert Job.objects.filter(status="successful").count() == 4 + 2  # a to d, two callbacks


def test_a_batch_of_duplicates_only_is_empty_and_still_refused_once_finished():
    waiting = tasks.unique_report.enqueue("e")
    with stalwart.batch(on_finish=tasks.batch_report) as batch:
        assert batch.enqueue(tasks.unique_report, "e").id == waiting.id
    assert BatchRow.objects.get(pk=batch.id).total == 0
    drain(threads=1)
    assert batch.finished
    assert BatchJob.objects.filter(batch=batch.id, role="on_finish").count() == 1
    with pytest.raises(InvalidBatch, match="has finished"):
        batch.enqueue(tasks.unique_report, "e")


def test_a_unique_task_is_still_refused_as_a_callback():
    with pytest.raises(InvalidBatch, match="cannot be a batch's callback"):
        stalwart.batch(on_success=(tasks.unique_report, Call(day="monday")))
    assert not BatchRow.objects.exists()


# -- cancelled and revived dependants --------------------------------------------------------


def test_a_cancelled_unique_dependant_frees_its_key():
    parent = tasks.noop.enqueue()
    report = enqueue_after([parent], tasks.unique_report, "saturday")
    assert stalwart.cancel(report).cancelled == 1
    assert job(report).status == "cancelled"
    again = tasks.unique_report.enqueue("saturday")
    assert again.id != report.id
    assert job(again).status == "ready"


def test_a_dependant_cancelled_by_its_parents_failure_frees_its_key_and_comes_back_if_free():
    parent = failed_parent()
    report = enqueue_after([parent], tasks.unique_report, "sunday")
    drain(threads=1)
    assert job(parent).status == "failed"
    assert job(report).status == "cancelled"
    assert holders("sunday") == []

    assert retry_failed(Selection(ids=[parent.id])) == 1
    assert job(report).status == "pending", "no twin holds its key: it waits again"
    assert tasks.unique_report.enqueue("sunday").id == report.id


def test_revive_leaves_a_dependant_cancelled_while_a_twin_holds_its_key():
    parent = failed_parent()
    report = enqueue_after([parent], tasks.unique_report, "monday")
    drain(threads=1)
    assert job(report).status == "cancelled"
    twin = tasks.unique_report.enqueue("monday")  # the key was free: a new job holds it

    assert retry_failed(Selection(ids=[parent.id])) == 1  # no IntegrityError

    assert job(parent).status == "ready"
    assert job(report).status == "cancelled"
    assert [holder.pk for holder in holders("monday")] == [uuid.UUID(twin.id)]


def test_revive_brings_back_one_of_twins_cancelled_by_one_parent():
    parent = failed_parent()
    first = enqueue_after([parent], tasks.unique_report, "tuesday")
    drain(threads=1)
    assert job(first).status == "cancelled"
    # Its parent has failed: the dependant is cancelled at its enqueue.
    second = enqueue_after([parent], tasks.unique_report, "tuesday")
    assert second.id != first.id
    assert job(second).status == "cancelled"

    retry_failed(Selection(ids=[parent.id]))

    assert (job(first).status, job(second).status) == ("pending", "cancelled")


def test_revive_racing_an_uncommitted_twin_leaves_the_dependant_cancelled(vendor):
    """The twin is inserted by a transaction not yet committed, which revive's check cannot
    see: its write waits for that transaction, then meets the unique index. That is an
    answer (the twin holds the key), not an IntegrityError."""
    parent = failed_parent()
    report = enqueue_after([parent], tasks.unique_report, "wednesday")
    drain(threads=1)
    assert job(report).status == "cancelled"

    inserted, commit = threading.Event(), threading.Event()

    def enqueue_twin_and_hold() -> str:
        with transaction.atomic():
            twin = tasks.unique_report.enqueue("wednesday")
            inserted.set()
            assert commit.wait(20), "never told to commit"
        return twin.id

    holder = InThread(enqueue_twin_and_hold)
    assert inserted.wait(10), holder.result()
    retry = InThread(lambda: retry_failed(Selection(ids=[parent.id])))
    if vendor != "sqlite":  # (SQLite: the retry waits for the database's write lock)
        wait_for(
            lambda: waiting_for_a_lock() or not retry.is_alive(),
            message="the revival to wait for the uncommitted twin",
        )
        assert retry.is_alive(), f"the revival did not wait: {retry.result()}"
    commit.set()
    twin = holder.result()

    assert retry.result() == 1  # the parent; no IntegrityError
    assert job(report).status == "cancelled"
    assert [str(row.pk) for row in holders("wednesday")] == [twin]


class InThread(threading.Thread):
    """``work()`` on a thread (and a connection) of its own, started at once."""

    def __init__(self, work) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.returned: object = None
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.returned = self.work()
        except BaseException as error:  # noqa: BLE001 - raised again by result()
            self.error = error
        finally:
            connections.close_all()

    def result(self, timeout: float = 20.0) -> object:
        self.join(timeout)
        assert not self.is_alive(), "it did not finish"
        if self.error:
            raise self.error
        return self.returned


def waiting_for_a_lock() -> bool:
    """Whether a session of this database waits for another transaction (a row, or an
    uncommitted entry of a unique index)."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT 1 FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'"
            )
        else:
            cursor.execute(
                "SELECT 1 FROM pg_locks JOIN pg_stat_activity AS session USING (pid) "
                "WHERE NOT granted AND locktype IN ('transactionid', 'tuple') "
                "AND session.datname = current_database()"
            )
        return cursor.fetchone() is not None


# -- races -----------------------------------------------------------------------------------


def test_enqueue_after_racing_on_one_key_makes_one_pending_job_with_one_set_of_edges():
    racers = 8
    parents = [tasks.noop.enqueue() for _ in range(racers)]

    def enqueue(number: int) -> tuple[str, int]:
        result = enqueue_after([parents[number]], tasks.unique_report, "race")
        return result.id, number

    results = at_once(racers, enqueue)

    assert len({job_id for job_id, _ in results}) == 1, results
    [pending] = holders("race")
    assert pending.status == "pending"
    assert str(pending.pk) == results[0][0]
    [(child, parent)] = edges()
    assert child == pending.pk
    marked = set(Job.objects.filter(has_dependants=True).values_list("pk", flat=True))
    assert marked == {parent}, "a parent was marked for a dependant never stored"
    assert Job.objects.count() == racers + 1
