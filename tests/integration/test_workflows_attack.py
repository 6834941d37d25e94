"""Attacks on jobs that run after other jobs (bc92de9): reproducers of what breaks.

Each test that fails on bc92de9 says so in its docstring ("FAILS on bc92de9: ..."); the
others pin behaviour that was checked and holds. Workers are real (threads of the test
process with connections of their own); races use a second thread with its own connection.
"""

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import IntegrityError, connections
from django.tasks import TaskResultStatus
from django.utils import timezone

import stalwart
from stalwart import After, chain, enqueue_after
from stalwart.control import Selection, prune_finished, retry_failed
from stalwart.exceptions import InvalidDependency
from stalwart.jobs import JobStore
from stalwart.models import Dependency, Job
from tests.helpers import at_once, drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def job(result) -> Job:
    return Job.objects.get(pk=result.id)


def resolve() -> tuple[int, int]:
    return JobStore("default").resolve_dependencies()


def finished(result, status: str) -> None:
    Job.objects.filter(pk=result.id).update(status=status, finished_at=timezone.now())


# -- retention -------------------------------------------------------------------------------


def test_retention_deletes_the_dependency_rows_of_the_jobs_it_deletes():
    """FAILS on bc92de9: nothing ever deletes from stalwart_dependency. Retention
    (prune_finished, discard_failed) deletes finished jobs, but every edge of every workflow
    stays for ever: the table grows without bound, and ``queue show PARENT`` keeps listing
    children long gone (db/dependencies.py has no delete; control.py prune_finished and
    Statements.delete_batch do not touch the table)."""
    parent = tasks.add.enqueue(1, 2)
    child = enqueue_after([parent], tasks.plus_parents)
    drain(threads=1)
    assert job(child).status == "successful"
    assert Dependency.objects.count() == 1
    deleted = prune_finished(older_than=timedelta(0))
    assert deleted == 2
    assert not Job.objects.exists()
    assert list(Dependency.objects.values_list("child", "parent")) == []


def test_a_parent_that_succeeded_then_was_pruned_does_not_cancel_its_dependant():
    """FAILS on bc92de9: with OPTIONS["retention"]["successful"] = 0 (allowed: 0 to 100
    years), the retention chore that runs between a parent's success and the dispatcher's
    next look deletes the parent, and the look then cancels the dependant as if its parent
    had failed ("no longer exists (deleted by retention?)"), although it succeeded. The same
    happens with any retention when the look lags (a backlog beyond ``limit`` per look, the
    dispatcher down) or when enqueue_after() names an old successful job. Root cause:
    db/dependencies.py _BROKEN treats 'gone' as failed under on_failure='cancel', and
    retention (control.py prune_finished -> delete_batch) deletes a parent that still has
    pending dependants."""
    parent = tasks.add.enqueue(1, 2)
    child = enqueue_after([parent], tasks.plus_parents)
    # The parent succeeds, and nothing looks at its dependant yet (as when the worker that
    # ran it died between writing its outcome and releasing the dependant).
    finished(parent, "successful")
    assert job(child).status == "pending"
    # The retention chore (delete_expired_jobs with keep_successful=0) runs first: it keeps
    # the parent, which a pending job still runs after.
    prune_finished(older_than=timedelta(0), statuses=["successful"])
    assert Job.objects.filter(pk=parent.id).exists()
    resolve()  # the dispatcher's look
    row = job(child)
    assert row.status == "ready", (row.status, row.errors)
    # Its dependant released, the parent goes with the next retention.
    assert prune_finished(older_than=timedelta(0), statuses=["successful"]) == 1
    assert not Job.objects.filter(pk=parent.id).exists()


# -- --stop-when-empty -----------------------------------------------------------------------


def test_waiting_queues_sees_a_dependant_released_between_its_two_statements(monkeypatch):
    """FAILS on bc92de9: JobStore.waiting_queues (jobs.py:472-484) reads ready, blocked and
    scheduled jobs in one statement, then pending jobs in a second. A dispatcher's look
    between the two (another process) moves a dependant pending -> scheduled -> ready: the
    first statement saw it pending, the second sees it no longer pending, so the queue is
    reported empty while a job is ready in it, and a ``queue work --stop-when-empty`` beside
    a dispatcher exits with work left (worker.py _drained). Fix: read pending first, or add
    'pending' to the single statement."""
    parent = tasks.noop.enqueue()
    finished(parent, "successful")
    child = enqueue_after([parent], tasks.noop)
    store = JobStore("default")
    statements_class = type(store.statements)
    original = statements_class.waiting_queues
    looked = []

    def then_a_dispatcher_looks(self, cursor):
        found = original(self, cursor)
        # Another process's dispatcher looks now, on its own connection.
        looked.extend(at_once(1, lambda _: JobStore("default").promote_due()))
        return found

    monkeypatch.setattr(statements_class, "waiting_queues", then_a_dispatcher_looks)
    queues = store.waiting_queues()
    monkeypatch.undo()
    assert len(looked) == 1
    assert job(child).status == "ready"
    assert "default" in queues, "a queue with a ready job was reported empty"


# -- retries ---------------------------------------------------------------------------------


def test_a_parent_retried_by_hand_runs_its_dependants_after_its_successful_attempt():
    """FAILS on bc92de9: docs/how-to/workflows.md says "A retried parent keeps its dependants
    pending: they run after its successful attempt". That holds for automatic retries only.
    A parent that failed for good is seen by the dispatcher's next look (<= polling_interval
    later) and its dependants are cancelled for good; ``queue retry`` / control.retry_failed
    then makes the parent run again and succeed, but nothing revives the dependants
    (_requeue only touches the parent), so a workflow cannot be resumed by retrying its
    failed step. Whether the dependant survives depends only on whether the operator beat
    the dispatcher's look."""
    parent = tasks.flaky.enqueue(failures=1)
    Job.objects.filter(pk=parent.id).update(max_attempts=1)  # its first failure is for good
    child = enqueue_after([parent], tasks.noop)
    drain(threads=1)
    assert job(parent).status == "failed"
    assert retry_failed(Selection(ids=[parent.id])) == 1
    drain(threads=1)
    assert job(parent).status == "successful"
    row = job(child)
    assert row.status == "successful", (row.status, row.errors)


def test_a_run_dependant_released_on_a_failure_that_is_being_retried_runs_beside_it(
    monkeypatch,
):
    """FAILS on bc92de9: db/dependencies.py's docstring says "a parent's success is final, so
    a release decided on it cannot be wrong by the time it is written" -- but release_ready
    also releases on a 'failed' parent (on_failure='run'), and 'failed' is not final: a
    ``queue retry`` between _RELEASABLE's SELECT and the UPDATE (dependencies.py:122-131,
    the UPDATE re-checks only the child's status) makes the dependant ready while its parent
    is ready to run again. The clean-up then runs before, or beside, the retried parent."""
    if connections["default"].vendor == "sqlite":
        pytest.skip("SQLite: the look holds the write lock (IMMEDIATE), a retry waits for it")
    parent = tasks.flaky.enqueue(failures=1)
    Job.objects.filter(pk=parent.id).update(max_attempts=1)
    child = enqueue_after([After(parent, on_failure="run")], tasks.noop)
    # Its last attempt failed, and nothing has looked at its dependant yet.
    finished(parent, "failed")

    from stalwart.db import dependencies

    real_cursor = connections["default"].cursor
    raced = threading.Event()

    class RetryAfterTheSelect:
        """The look's cursor; after _RELEASABLE's SELECT, an operator retries the parent."""

        def __init__(self, cursor):
            self._cursor = cursor

        def __getattr__(self, name):
            return getattr(self._cursor, name)

        def __enter__(self):
            self._cursor.__enter__()
            return self

        def __exit__(self, *exc):
            return self._cursor.__exit__(*exc)

        def fetchall(self):
            rows = self._cursor.fetchall()
            if not raced.is_set():
                raced.set()
                at_once(1, lambda _: retry_failed(Selection(ids=[parent.id])))
            return rows

    monkeypatch.setattr(
        connections["default"], "cursor", lambda *a, **k: RetryAfterTheSelect(real_cursor())
    )
    dependencies.resolve("default", [uuid.UUID(child.id)], now=timezone.now())
    monkeypatch.undo()
    assert raced.is_set()
    assert job(parent).status == "ready"  # it will run again...
    assert job(child).status == "pending", "released while its parent is about to run again"


# -- bad input -------------------------------------------------------------------------------


def test_the_same_parent_spelled_twice_is_an_invalid_dependency():
    """FAILS on bc92de9: workflows._parents checks duplicates on the id *strings*
    (workflows.py:95-104), while uuid.UUID accepts several spellings of one id (upper case,
    braces, 'urn:uuid:', no dashes). Two spellings of one parent pass, reach the INSERT of
    two edges (child, parent), and the unique constraint stalwart_dependency_edge raises
    IntegrityError (not InvalidDependency as documented). Nothing is stored (the atomic
    block rolls back), but the documented error is not raised."""
    parent = tasks.noop.enqueue()
    before = Job.objects.count()
    try:
        with pytest.raises(InvalidDependency, match="listed twice"):
            enqueue_after([parent.id, parent.id.upper()], tasks.noop)
    finally:
        assert Job.objects.count() == before
        assert not Dependency.objects.exists()


def test_chain_after_a_single_result_is_refused_or_accepted_as_enqueue_after_does():
    """FAILS on bc92de9: enqueue_after() takes a bare TaskResult (or After) for ``after``;
    chain(after=...) does ``list(after)`` (workflows.py:198) so a bare TaskResult raises
    TypeError ("'TaskResult' object is not iterable"), and a bare id string is split into
    characters, refused with a nonsense message ("Job 'x' is listed twice")."""
    parent = tasks.noop.enqueue()
    try:
        links = chain(tasks.noop, after=parent)
    except InvalidDependency:
        links = None
    except TypeError as error:
        pytest.fail(f"chain(after=TaskResult) raised TypeError: {error}")
    if links is not None:
        assert Dependency.objects.get(child=links[0].id).parent == uuid.UUID(parent.id)


def test_enqueue_after_none_is_an_invalid_dependency():
    """FAILS on bc92de9: ``enqueue_after(None, task)`` raises TypeError ('NoneType' object
    is not iterable, workflows.py:91) instead of InvalidDependency."""
    with pytest.raises(InvalidDependency):
        enqueue_after(None, tasks.noop)
    assert not Job.objects.exists()


# -- what holds (checked, passes) ------------------------------------------------------------


def test_a_dependant_with_a_concurrency_key_is_released_blocked_then_run():
    """Holds: a released dependant with a concurrency key goes scheduled -> blocked/ready and
    runs once."""
    parent = tasks.noop.enqueue()
    children = [enqueue_after([parent], tasks.one_at_a_time, key="k") for _ in range(3)]
    drain(threads=3)
    assert {job(c).status for c in children} == {"successful"}


def test_cancel_and_two_dispatchers_racing_on_pending_jobs_leave_each_job_in_one_state():
    """Holds: stalwart.cancel of pending jobs racing two looks: each job ends up cancelled or
    scheduled, with one error at most, never both."""
    parent = tasks.noop.enqueue()
    finished(parent, "successful")
    children = [enqueue_after([parent], tasks.noop) for _ in range(80)]
    ids = [c.id for c in children]

    def racer(number: int):
        if number == 0:
            return stalwart.cancel(*ids).cancelled
        return JobStore("default").resolve_dependencies(limit=20)

    outcomes = at_once(3, racer)
    while resolve() != (0, 0):
        pass
    rows = list(Job.objects.filter(pk__in=ids))
    assert {row.status for row in rows} <= {"cancelled", "scheduled"}
    cancelled = sum(1 for row in rows if row.status == "cancelled")
    assert cancelled == next(o for o in outcomes if isinstance(o, int))
    assert all(len(row.errors) == 0 for row in rows)


def test_a_dependant_committed_after_its_parent_finished_is_released():
    """Holds: a dependant enqueued in a transaction that commits only after its parent has
    succeeded (and after looks that did not see it) is released by the next look."""
    from django.db import transaction

    if connections["default"].vendor == "sqlite":
        pytest.skip("SQLite: the open transaction holds the write lock the parent's end needs")
    parent = tasks.noop.enqueue()
    with transaction.atomic():
        Job.objects.count()  # the transaction has begun (and read) before the parent ends
        finished_elsewhere = at_once(
            1,
            lambda _: (
                Job.objects.filter(pk=parent.id).update(
                    status="successful", finished_at=timezone.now()
                ),
                JobStore("default").resolve_dependencies(),
            )[1],
        )
        assert finished_elsewhere == [(0, 0)]
        child = enqueue_after([parent], tasks.noop)
    # Released once: by the enqueue when its transaction reads the parent's end (read
    # committed), else by the next look (MySQL's repeatable read keeps the older snapshot).
    committed = job(child).status
    released, _ = resolve()
    assert (committed, released) in {("ready", 0), ("pending", 1)}
    assert job(child).status == "ready"


def test_errors_do_not_leak_with_an_integrity_error_inside_a_callers_transaction():
    """Holds: the IntegrityError above rolls back to enqueue_after's savepoint; the caller's
    transaction goes on."""
    from django.db import transaction

    parent = tasks.noop.enqueue()
    with transaction.atomic():
        with pytest.raises((IntegrityError, InvalidDependency)):
            enqueue_after([parent.id, "{" + parent.id + "}"], tasks.noop)
        ok = enqueue_after([parent], tasks.noop)
    assert job(ok).status == "pending"
    assert ok.status == TaskResultStatus.READY
