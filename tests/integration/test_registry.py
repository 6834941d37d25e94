"""The process table: registration, heartbeats on the database clock, pruning by CAS."""

from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from stalwart.jobs import JobStore
from stalwart.models import Job, Process
from stalwart.processes.registry import (
    PROCESS_DIED,
    Registration,
    prune_dead_processes,
    prune_under_lease,
    remove_reaped_child,
)
from stalwart.queues import QueueSelector
from tests.helpers import (
    PGBOUNCER,
    WITHOUT_TIMEOUTS,
    locking_job_row,
    row_locks,
    session_lock_timeout,
)
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def register(kind: str = "worker", supervisor: int | None = None) -> Registration:
    registration = Registration(
        "default", kind=kind, name=f"{kind}-{Process.objects.count()}", supervisor=supervisor
    )
    registration.register({"queues": "*"})
    return registration


def age(registration: Registration, seconds: float) -> None:
    Process.objects.filter(pk=registration.id).update(
        last_heartbeat_at=F("last_heartbeat_at") - timedelta(seconds=seconds)
    )


def hold_a_job(owner: int) -> Job:
    tasks.add.enqueue(1, 1)
    claimed = JobStore("default").claim(
        owner=owner, worker_name="w", selector=QueueSelector.parse("*"), limit=1
    )
    return Job.objects.get(pk=claimed[0].id)


def test_registration_uses_the_database_clock_and_heartbeats_detect_removal():
    registration = register()
    row = Process.objects.get(pk=registration.id)
    assert abs(row.last_heartbeat_at - timezone.now()) < timedelta(seconds=5)
    assert registration.heartbeat({"busy": 1}) is True
    assert Process.objects.get(pk=registration.id).metadata == {"busy": 1}
    Process.objects.filter(pk=registration.id).delete()
    assert registration.heartbeat({}) is False


def test_prune_removes_only_silent_processes_and_releases_their_jobs():
    silent = register()
    alive = register()
    job = hold_a_job(owner=silent.id)
    age(silent, 120)
    gone = prune_dead_processes("default", threshold=60, exclude=None)
    assert [process.id for process in gone] == [silent.id]
    assert [released.id for released in gone[0].released] == [job.id]
    assert list(Process.objects.values_list("id", flat=True)) == [alive.id]
    job.refresh_from_db()
    assert (job.status, job.owner) == ("ready", None)
    assert job.errors[-1]["exception_class_path"] == PROCESS_DIED
    assert "sent no heartbeat for over 60 s" in job.errors[-1]["traceback"]


def test_a_process_whose_whole_tree_fell_silent_is_pruned_as_an_interruption():
    # A host lost or cut off: its supervisor went silent with its worker. Nothing its job
    # did: the job runs again, uncharged, not isolated.
    supervisor = register("supervisor")
    worker = register("worker", supervisor=supervisor.id)
    job = hold_a_job(owner=worker.id)
    age(supervisor, 120)
    age(worker, 120)
    prune_dead_processes("default", threshold=60, exclude=None)
    job.refresh_from_db()
    assert (job.status, job.errors, job.isolated) == ("ready", [], False)
    assert "whole process tree fell silent" in job.interruptions[0]["cause"]


def test_a_worker_that_fell_silent_alone_is_pruned_as_a_crash_of_its_jobs():
    # Its supervisor still beats (or it has none): whatever silenced it may be its job.
    supervisor = register("supervisor")
    worker = register("worker", supervisor=supervisor.id)
    job = hold_a_job(owner=worker.id)
    age(worker, 120)
    prune_dead_processes("default", threshold=60, exclude=None)
    job.refresh_from_db()
    assert (job.status, job.isolated, len(job.errors)) == ("ready", True, 1)


def test_a_silent_process_that_gave_its_verdict_is_pruned_by_it():
    worker = register("worker")
    job = hold_a_job(owner=worker.id)
    Process.objects.filter(pk=worker.id).update(
        metadata={"verdict": {"death": "interrupted", "cause": "its heartbeats failed for 9 s"}}
    )
    age(worker, 120)
    prune_dead_processes("default", threshold=60, exclude=None)
    job.refresh_from_db()
    assert (job.status, job.errors, job.isolated) == ("ready", [], False)
    assert "its heartbeats failed for 9 s" in job.interruptions[0]["cause"]


def test_prune_never_removes_the_process_doing_it():
    me = register("supervisor")
    age(me, 600)
    assert prune_dead_processes("default", threshold=60, exclude=me.id) == []
    assert Process.objects.filter(pk=me.id).exists()


def test_a_process_that_beats_just_in_time_is_not_pruned():
    late = register()
    age(late, 120)
    statements = JobStore("default").statements
    with connection.cursor() as cursor:
        candidates = statements.dead_processes(cursor, threshold=60, exclude=None)
        assert [row[0] for row in candidates] == [late.id]
        # It beats between the look and the delete: the delete re-checks, and leaves it.
        assert late.heartbeat({}) is True
        assert statements.delete_process_if_dead(cursor, process_id=late.id, threshold=60) is None
    assert Process.objects.filter(pk=late.id).exists()


def test_a_job_at_its_last_attempt_fails_when_its_process_dies():
    supervisor = register("supervisor")
    worker = register("worker", supervisor=supervisor.id)
    job = hold_a_job(owner=worker.id)
    Job.objects.filter(pk=job.id).update(max_attempts=1)
    pid = Process.objects.get(pk=worker.id).pid
    gone = remove_reaped_child(
        "default", supervisors=[supervisor.id], pid=pid, cause="died: it was killed by SIGKILL"
    )
    assert [released.status for released in gone[0].released] == ["failed"]
    job.refresh_from_db()
    assert job.status == "failed"
    assert job.finished_at is not None
    assert "was killed by SIGKILL" in job.errors[-1]["traceback"]
    assert not Process.objects.filter(pk=worker.id).exists()


@pytest.mark.skipif(PGBOUNCER, reason=WITHOUT_TIMEOUTS)
def test_a_job_an_application_holds_does_not_stop_the_rest_of_the_prune(vendor, recorded_events):
    row_locks(vendor, "SQLite has no row locks for an application to hold")
    blocked, free = register(), register()
    locked_job, other_job = hold_a_job(blocked.id), hold_a_job(free.id)
    age(blocked, 120)
    age(free, 120)
    with locking_job_row(locked_job.id), session_lock_timeout(0.2):  # as the queue's have
        pruned = prune_dead_processes("default", threshold=60, exclude=None)
    assert [gone.id for gone in pruned] == [free.id]  # the other dead process was pruned...
    assert Job.objects.get(pk=other_job.id).status == "ready"
    assert Process.objects.filter(pk=blocked.id).exists()  # ...this one waits for a later turn
    assert ("prune_deferred", blocked.name) in [
        (action, fields.get("process")) for action, fields in recorded_events
    ]


def orphan_a_job() -> Job:
    """A running job whose owner has no process row (gone without giving it back)."""
    owner = register()
    job = hold_a_job(owner=owner.id)
    Process.objects.filter(pk=owner.id).delete()
    return job


def prune_as(holder: str):
    return prune_under_lease("default", holder=holder, threshold=60, interval=10, exclude=None)


def test_the_holder_of_the_pruning_lease_prunes_the_silent_and_takes_back_orphans():
    silent, alive = register(), register()
    held, orphaned = hold_a_job(owner=silent.id), orphan_a_job()
    age(silent, 120)
    gone = prune_as("pruner-one")
    assert [process.id for process in gone] == [silent.id]
    assert list(Process.objects.values_list("id", flat=True)) == [alive.id]
    for job in (held, orphaned):
        job.refresh_from_db()
        assert (job.status, job.owner) == ("ready", None)


def test_another_process_leaves_the_prune_to_the_holder_of_the_lease():
    prune_as("pruner-one")  # takes the lease
    silent = register()
    orphaned = orphan_a_job()
    age(silent, 120)
    assert prune_as("pruner-two") == []
    assert Process.objects.filter(pk=silent.id).exists()
    orphaned.refresh_from_db()
    assert orphaned.status == "running"
    assert [process.id for process in prune_as("pruner-one")] == [silent.id]  # its next turn


def test_an_idle_prune_is_one_statement_on_postgresql(vendor):
    """What an idle cluster's pruner sends each heartbeat interval: the lease, the look for
    silent processes and for orphaned jobs, in one statement."""
    if vendor != "postgresql":
        pytest.skip("one statement on PostgreSQL; elsewhere the lease and each look are apart")
    register()
    prune_as("pruner-one")
    with CaptureQueriesContext(connection) as queries:
        assert prune_as("pruner-one") == []
    assert len(queries) == 1, [query["sql"][:80] for query in queries]
    orphan_a_job()  # now there is something to do: the sweep follows
    with CaptureQueriesContext(connection) as queries:
        prune_as("pruner-one")
    assert len(queries) > 1
    assert Job.objects.get().status == "ready"
