"""Jobs that run after other jobs (issue 20): ``enqueue_after``, ``After`` and ``chain``.

Workers here are real (threads of the test process with connections of their own), on the
database under test; the dispatcher's look is ``JobStore.promote_due``, which a draining
worker runs as a standalone ``queue work`` does.
"""

import json
import uuid
from datetime import timedelta

import pytest
from django.db import transaction
from django.tasks import TaskResultStatus
from django.utils import timezone

import stalwart
from stalwart import After, Call, chain, enqueue_after
from stalwart.exceptions import InvalidDependency
from stalwart.jobs import JobStore
from stalwart.models import Dependency, Job
from tests.helpers import at_once, drain, wait_for, worker_thread
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def job(result) -> Job:
    return Job.objects.get(pk=result.id)


def resolve() -> tuple[int, int]:
    return JobStore("default").resolve_dependencies()


def test_a_dependant_waits_for_its_parents_then_reads_their_results():
    first = tasks.add.enqueue(2, 3)
    second = tasks.add.enqueue(10, 20)
    total = enqueue_after([first, second], tasks.plus_parents, n=100)
    assert job(total).status == "pending"
    assert total.status == TaskResultStatus.READY
    assert resolve() == (0, 0)  # its parents have not run
    drain(threads=2)
    total.refresh()
    assert total.status == TaskResultStatus.SUCCESSFUL
    assert total.return_value == 135
    stored = {row.id: row for row in Job.objects.filter(pk__in=[first.id, second.id, total.id])}
    started = stored[uuid.UUID(total.id)].started_at
    assert all(stored[uuid.UUID(r.id)].finished_at <= started for r in (first, second))


def test_a_chain_runs_link_after_link_each_reading_the_one_before():
    links = chain(
        (tasks.add, Call(1, 2)),
        (tasks.plus_parents, Call(n=10)),
        (tasks.plus_parents, Call(n=100)),
    )
    assert [job(link).status for link in links] == ["ready", "pending", "pending"]
    drain(threads=3)
    for link in links:
        link.refresh()
    assert [link.return_value for link in links] == [3, 13, 113]
    rows = [job(link) for link in links]
    assert rows[0].finished_at <= rows[1].started_at
    assert rows[1].finished_at <= rows[2].started_at


def test_a_failed_parent_cancels_its_dependants_all_the_way_down():
    parent = tasks.fail.using(priority=0).enqueue("no")
    Job.objects.filter(pk=parent.id).update(max_attempts=1)
    child = enqueue_after(parent, tasks.noop)
    grandchild = enqueue_after([child], tasks.noop)
    bystander = tasks.noop.enqueue()
    drain(threads=2)
    assert job(parent).status == "failed"
    assert job(bystander).status == "successful"
    for dependant, cause in ((child, parent), (grandchild, child)):
        row = job(dependant)
        assert row.status == "cancelled"
        assert row.attempt == 0  # never ran
        assert row.finished_at is not None
        [error] = row.errors
        assert error["exception_class_path"] == "stalwart.exceptions.ParentFailed"
        assert f"runs after job {cause.id}" in error["traceback"]


def test_on_failure_run_runs_the_dependant_once_its_parent_has_finished_anyhow():
    parent = tasks.fail.enqueue("no")
    Job.objects.filter(pk=parent.id).update(max_attempts=1)
    fine = tasks.add.enqueue(1, 1)
    after_both = enqueue_after([After(parent, on_failure="run"), fine], tasks.parent_states)
    drain(threads=2)
    after_both.refresh()
    assert after_both.status == TaskResultStatus.SUCCESSFUL
    assert after_both.return_value == ["FAILED", "SUCCESSFUL"]


def test_cancelling_a_parent_cancels_its_dependants_and_a_dependant_can_be_cancelled():
    later = timezone.now() + timedelta(hours=1)
    parent = tasks.noop.using(run_after=later).enqueue()
    child = enqueue_after([parent], tasks.noop)
    other = enqueue_after([tasks.noop.using(run_after=later).enqueue()], tasks.noop)
    assert stalwart.cancel(other.id)
    assert job(other).status == "cancelled"
    assert stalwart.cancel(parent.id)
    assert resolve() == (0, 1)
    assert job(child).status == "cancelled"


def test_a_dependant_keeps_its_run_after_and_is_then_due_as_any_job():
    parent = tasks.noop.enqueue()
    later = timezone.now() + timedelta(hours=1)
    child = enqueue_after([parent], tasks.noop.using(run_after=later, priority=7))
    with worker_thread(threads=1, promote_scheduled=True):
        wait_for(lambda: job(child).status != "pending", message="the dependant's release")
    row = job(child)
    assert row.status == "scheduled"
    assert row.available_at == later
    assert row.priority == 7


def test_a_dependant_of_parents_that_had_already_ended_is_decided_by_its_enqueue():
    done = tasks.add.enqueue(1, 2)
    failed = tasks.fail.enqueue("no")
    Job.objects.filter(pk=failed.id).update(max_attempts=1)
    drain(threads=2)
    assert {job(done).status, job(failed).status} == {"successful", "failed"}
    # No worker or dispatcher will see these parents end again: the enqueue decides.
    released = enqueue_after([done], tasks.plus_parents, n=1)
    cancelled = enqueue_after([failed], tasks.noop)
    tolerant = enqueue_after([After(failed, on_failure="run"), done], tasks.noop)
    assert job(released).status == "ready"
    assert job(cancelled).status == "cancelled"
    assert job(tolerant).status == "ready"
    drain(threads=1)
    released.refresh()
    assert released.return_value == 4


def test_a_parent_deleted_before_its_dependant_was_released_is_resolved_not_stranded():
    doomed_parent = tasks.noop.enqueue()
    tolerant_parent = tasks.noop.enqueue()
    doomed = enqueue_after([doomed_parent], tasks.noop)
    tolerant = enqueue_after([After(tolerant_parent, on_failure="run")], tasks.noop)
    Job.objects.filter(pk__in=[doomed_parent.id, tolerant_parent.id]).delete()  # retention
    assert resolve() == (1, 1)
    assert job(tolerant).status == "ready"
    row = job(doomed)
    assert row.status == "cancelled"
    assert "no longer exists" in row.errors[0]["traceback"]


def test_two_dispatchers_resolving_at_once_release_and_cancel_each_dependant_once():
    succeeded = tasks.noop.enqueue()
    failed = tasks.noop.enqueue()
    released = [enqueue_after([succeeded], tasks.noop) for _ in range(60)]
    doomed = [enqueue_after([failed], tasks.noop) for _ in range(60)]
    # Parents that ended without a worker (as a death or a cancel ends them).
    Job.objects.filter(pk=succeeded.id).update(status="successful", finished_at=timezone.now())
    Job.objects.filter(pk=failed.id).update(status="failed", finished_at=timezone.now())
    outcomes = at_once(4, lambda _: JobStore("default").resolve_dependencies(limit=25))
    more = [resolve() for _ in range(6)]
    assert sum(r for r, _ in outcomes + more) == 60
    assert sum(c for _, c in outcomes + more) == 60
    assert {job(r).status for r in released} == {"ready"}
    assert {job(d).status for d in doomed} == {"cancelled"}
    assert all(len(job(d).errors) == 1 for d in doomed)


@pytest.mark.parametrize(
    ("after", "problem"),
    [
        ([], "got no job to run after"),
        ([str(uuid.UUID(int=7))], "no such job"),
        (["not-an-id"], "is not a job id"),
        ("twice", "is listed twice"),
        ("other backend", "of backend 'limited'"),
        ("bad policy", "on_failure='sometimes' is not one of"),
    ],
)
def test_bad_dependencies_are_refused_at_the_call_and_nothing_is_stored(after, problem):
    parent = tasks.noop.enqueue()
    if after == "twice":
        after = [parent, parent]
    elif after == "other backend":
        after = [tasks.noop.using(backend="limited").enqueue()]
    before = Job.objects.count()
    if after == "bad policy":  # refused where the After is made
        with pytest.raises(InvalidDependency, match=problem):
            enqueue_after([After(parent, on_failure="sometimes")], tasks.noop)
    else:
        with pytest.raises(InvalidDependency, match=problem):
            enqueue_after(after, tasks.noop)
    assert Job.objects.count() == before
    assert not Dependency.objects.exists()


def test_a_chain_with_a_bad_step_enqueues_none_of_its_steps():
    before = Job.objects.count()
    with pytest.raises(InvalidDependency, match="Step 2 of chain"):
        chain(tasks.noop, (print, Call()), tasks.noop)
    with pytest.raises(InvalidDependency, match="of backend 'default'"):
        chain(tasks.noop, tasks.noop.using(backend="limited"))
    assert Job.objects.count() == before


def test_a_dependant_enqueued_in_a_rolled_back_transaction_never_existed():
    parent = tasks.noop.enqueue()

    def enqueue_then_fail() -> None:
        with transaction.atomic():
            enqueue_after([parent], tasks.noop)
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        enqueue_then_fail()
    assert Job.objects.count() == 1
    assert not Dependency.objects.exists()


def test_queue_show_and_queue_jobs_show_the_graph_around_a_job():
    from io import StringIO

    from django.core.management import call_command

    def queue(*args: str) -> str:
        out = StringIO()
        call_command("queue", *args, stdout=out)
        return out.getvalue()

    parent = tasks.add.enqueue(1, 2)
    child = enqueue_after([parent], tasks.plus_parents)
    shown = json.loads(queue("show", child.id, "--json"))
    assert shown["status"] == "pending"
    assert shown["task_result_status"] == "READY"
    assert shown["runs_after"] == [
        {"id": parent.id, "task_path": "tests.testapp.tasks.add", "status": "ready"}
    ]
    assert shown["dependants"] == []
    assert json.loads(queue("show", parent.id, "--json"))["dependants"][0]["id"] == child.id
    assert "runs_after:" in queue("show", child.id)
    listed = json.loads(queue("jobs", "--state", "pending", "--json"))
    assert [row["id"] for row in listed["jobs"]] == [child.id]
