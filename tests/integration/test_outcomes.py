"""Outcomes: written once, reported once, never held up by the application's code."""

import threading
import time
from dataclasses import replace

import psycopg
import pytest
from django.db import OperationalError, connection, connections
from django.tasks import TaskResultStatus
from django.tasks.signals import task_finished

from stalwart.db import Interruption, Outcome
from stalwart.db.deadline import cut
from stalwart.jobs import JobStore
from stalwart.models import Job, Process
from stalwart.processes.outcomes import OutcomeWriter
from stalwart.processes.registry import release_orphans
from stalwart.processes.runner import Finished
from stalwart.queues import QueueSelector
from tests.helpers import (
    PGBOUNCER,
    WITHOUT_TIMEOUTS,
    WorkerThread,
    locking_job_row,
    make_worker,
    register_processes,
    row_locks,
    wait_for,
    worker_thread,
)
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

EVERYTHING = QueueSelector.parse("*")


@pytest.fixture
def finished_signals():
    sent: list = []

    def receiver(sender, task_result, **kwargs) -> None:
        sent.append(task_result.id)

    task_finished.connect(receiver)
    yield sent
    task_finished.disconnect(receiver)


def claimed_job(owner: int = 41):
    register_processes(owner)
    result = tasks.add.enqueue(20, 22)
    (job,) = JobStore("default").claim(owner=owner, worker_name="w", selector=EVERYTHING, limit=1)
    return result, job


def success(job, value: str = "42", **changes) -> Finished:
    return Finished(
        job=job,
        outcome=Outcome(id=job.id, attempt=job.attempt, status="successful", return_value=value),
        result=None,
        duration=0.0,
        **changes,
    )


def deferrals(recorded_events) -> list:
    return [
        (action, str(fields["job"]))
        for action, fields in recorded_events
        if action == "outcome_deferred"
    ]


def test_a_receiver_that_raises_neither_kills_the_worker_nor_strands_a_job(recorded_events):
    def raises(sender, task_result, **kwargs) -> None:
        raise RuntimeError("a receiver with a bug")

    task_finished.connect(raises)
    try:
        results = [tasks.add.enqueue(number, number) for number in range(12)]
        with worker_thread(threads=2) as worker:
            wait_for(
                lambda: Job.objects.filter(status="successful").count() == len(results),
                timeout=15,
                message="every job to succeed despite the receiver",
            )
            assert worker.exit_status == 0
    finally:
        task_finished.disconnect(raises)
    assert not Job.objects.exclude(status="successful").exists()
    failures = [fields for action, fields in recorded_events if action == "signal_receiver_failed"]
    assert len(failures) == len(results)
    assert failures[0]["signal"] == "task_finished"
    assert "a receiver with a bug" in failures[0]["traceback"]


def test_a_timed_out_attempt_that_also_finished_is_written_and_reported_once(finished_signals):
    result, job = claimed_job()
    writer = OutcomeWriter(JobStore("default"), process="w", sender=object)
    timed_out = Finished(
        job=job,
        outcome=Outcome(id=job.id, attempt=job.attempt, status="failed", errors="[]"),
        result=None,
        duration=0.0,
        timed_out=True,
    )
    real = success(job)
    object.__setattr__(real, "result", result)
    settled = writer.flush(41, [timed_out, real])
    assert settled == [real]
    assert finished_signals == [result.id]
    result.refresh()
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


def test_an_outcome_whose_commit_answer_was_lost_is_reported_not_discarded(
    vendor, recorded_events, finished_signals
):
    if vendor != "postgresql":
        pytest.skip(
            "the lost answer is injected as psycopg's error (SQLite is a local file; "
            "MySQL's drivers are covered by the retry classification's unit tests)"
        )
    result, job = claimed_job()
    lost = []

    def lose_the_answer(execute, sql, params, many, context):
        answer = execute(sql, params, many, context)  # committed (autocommit)...
        if "UPDATE stalwart_job" in sql and not lost:
            lost.append(sql)
            cut(connection)  # ...and the link goes down before the answer arrives
            message = "server closed the connection unexpectedly"
            raise OperationalError(message) from psycopg.OperationalError(message)
        return answer

    item = success(job)
    object.__setattr__(item, "result", result)
    writer = OutcomeWriter(JobStore("default"), process="w", sender=object)
    with connection.execute_wrapper(lose_the_answer):
        settled = writer.flush(41, [item])
    assert lost, "the fault was not injected"
    assert settled == [item]
    actions = [action for action, _ in recorded_events]
    assert "job_result_discarded" not in actions
    assert "job_succeeded" in actions
    assert finished_signals == [result.id]


def test_a_job_given_back_and_claimed_again_in_one_flush_is_held_as_its_new_attempt():
    """A job whose connection died with the database's is given back, ready at once; the
    same flush's claim may take it again. The worker must hold the new attempt, not forget
    it with the old one (else it gives it back as a claim whose answer was lost, and the job
    runs twice)."""
    result, job = claimed_job()
    worker = make_worker(threads=1)
    worker.registration.id = 41  # the row claimed_job() registered
    worker.outcomes.outage_seen = lambda item: True  # the worker saw its own link go down
    worker.held[job.id] = job
    cut_short = Finished(
        job=job,
        outcome=Outcome(id=job.id, attempt=job.attempt, status="failed", errors="[]"),
        result=None,
        duration=0.0,
        interruption=Interruption(job.id, job.attempt, "its database connection was lost"),
    )
    try:
        claimed = worker.flush(claim=1, extra=[cut_short])
        assert [(again.id, again.attempt) for again in claimed] == [(job.id, 2)]
        assert worker.held[job.id].attempt == 2  # held as what now runs
        row = Job.objects.get(pk=result.id)
        assert (row.status, row.attempt, row.errors) == ("running", 2, [])
        assert [entry["attempt"] for entry in row.interruptions] == [1]
    finally:
        worker.pool.stop(wait=True)


@pytest.mark.skipif(PGBOUNCER, reason=WITHOUT_TIMEOUTS)
def test_an_application_lock_on_a_job_row_does_not_stall_the_worker(vendor, recorded_events):
    row_locks(vendor, "SQLite has no row locks; its one writer is another matter")
    gate = tasks.GATE
    gate.clear()
    blocked = tasks.wait_at_gate.enqueue()
    application = locking_job_row(blocked.id)
    try:
        with worker_thread(threads=1):
            wait_for(
                lambda: Job.objects.get(pk=blocked.id).status == "running",
                message="the job to start",
            )
            application.begin()
            gate.set()  # it finishes while the application holds its row
            unrelated = tasks.add.enqueue(1, 1)
            wait_for(
                lambda: Job.objects.get(pk=unrelated.id).status == "successful",
                timeout=5,
                message="an unrelated job to run while the row is locked",
            )
            assert Job.objects.get(pk=blocked.id).status == "running"
            assert ("outcome_deferred", blocked.id) in deferrals(recorded_events)
            application.end()
            wait_for(
                lambda: Job.objects.get(pk=blocked.id).status == "successful",
                timeout=10,
                message="the outcome to be written once the lock is gone",
            )
    finally:
        application.end()
        gate.clear()


def test_an_application_enqueueing_a_unique_twin_does_not_hold_up_the_queue(
    vendor, recorded_events
):
    row_locks(vendor, "SQLite has one writer: no transaction waits on another's unique key")
    gate = tasks.GATE
    gate.clear()
    first = tasks.unique_fails_once.enqueue("monday")
    opened = threading.Event()
    commit = threading.Event()

    def enqueue_a_twin_and_wait() -> None:
        from django.db import transaction

        try:
            with transaction.atomic():
                tasks.unique_fails_once.enqueue("monday")  # the first is running: a new job
                opened.set()
                commit.wait(30)
        finally:
            connections.close_all()

    application = threading.Thread(target=enqueue_a_twin_and_wait)
    try:
        with worker_thread(threads=1, promote_scheduled=True):
            wait_for(
                lambda: Job.objects.get(pk=first.id).attempt == 1,
                message="the first attempt to start",
            )
            application.start()
            assert opened.wait(10)
            gate.set()  # the first attempt fails now, beside the uncommitted twin
            unrelated = tasks.add.enqueue(2, 2)
            wait_for(
                lambda: Job.objects.get(pk=unrelated.id).status == "successful",
                timeout=5,
                message="an unrelated job to run while the twin is uncommitted",
            )
            assert ("outcome_deferred", first.id) in deferrals(recorded_events)
            commit.set()
            application.join(10)
            wait_for(
                lambda: Job.objects.filter(status="successful").count() == 3,
                timeout=15,
                message="the retry, the twin and the unrelated job to succeed",
            )
    finally:
        commit.set()
        gate.clear()
        if application.is_alive():
            application.join(10)
    # The retry went back to waiting beside its twin: it dropped the key, each ran once.
    assert Job.objects.filter(task_path__endswith="unique_fails_once").count() == 2


def test_a_worker_stopped_past_its_timeout_keeps_the_jobs_its_threads_still_run(backend):
    gate = tasks.GATE
    gate.clear()
    running = tasks.wait_at_gate.enqueue()
    worker = make_worker(threads=2, config=replace(backend.config, shutdown_timeout=0.1))
    try:
        with worker_thread(worker):
            wait_for(
                lambda: Job.objects.get(pk=running.id).status == "running",
                message="the job to start",
            )
        # The worker has ended; the job's thread has not: the job is not given back, and
        # the worker's row says so, for whoever removes it once the process has ended.
        job = Job.objects.get(pk=running.id)
        assert (job.status, job.owner) == ("running", worker.registration.id)
        assert worker.abandoned_threads
        assert Process.objects.get(pk=worker.registration.id).metadata["leaving"] is True
    finally:
        gate.set()


@pytest.mark.skipif(PGBOUNCER, reason=WITHOUT_TIMEOUTS)
def test_a_timed_out_attempt_is_never_released_while_its_thread_runs(
    vendor, backend, recorded_events
):
    row_locks(vendor, "SQLite has no row locks for an application to hold")
    result = tasks.overruns_recorded.enqueue(4.0)
    first = WorkerThread(make_worker(threads=1)).start()
    wait_for(lambda: Execution.objects.filter(job_id=result.id).exists(), message="the start")
    with locking_job_row(result.id):
        # The attempt times out at 1 s; its outcome waits on the lock; the worker stops.
        wait_for(lambda: first.worker.stop_requested, timeout=10, message="the time-out")
        first.join(15)
    job = Job.objects.get(pk=result.id)
    assert first.worker.pool.busy == 1  # its thread still runs the attempt...
    assert (job.status, job.owner) == ("running", first.worker.registration.id)  # ...so ours


@pytest.mark.skipif(PGBOUNCER, reason=WITHOUT_TIMEOUTS)
def test_an_outcome_written_before_a_cut_link_is_reported_not_discarded(
    vendor, recorded_events, finished_signals
):
    if vendor != "postgresql":
        pytest.skip("the link is cut with pg_terminate_backend (SQLite is a local file)")
    register_processes(41)
    first, second = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
    jobs = JobStore("default").claim(owner=41, worker_name="w", selector=EVERYTHING, limit=2)
    by_id = {str(job.id): job for job in jobs}
    items = [success(by_id[result.id]) for result in (first, second)]
    for item, result in zip(items, (first, second), strict=True):
        object.__setattr__(item, "result", result)
    application = locking_job_row(second.id)
    cuts = []

    def alone(params) -> bool:
        """Whether these parameters carry the second job's outcome, and not the first's
        (however the ids are sent: a list of UUIDs, or an array literal)."""
        sent = repr(params)
        return str(by_id[second.id].id) in sent and str(by_id[first.id].id) not in sent

    def cut_the_link_on_the_second(execute, sql, params, many, context):
        # The second outcome, written alone after the first was (the batch met the lock).
        if "UPDATE stalwart_job" in sql and not cuts and params and alone(params):
            cuts.append(sql)
            cut(connection)
        return execute(sql, params, many, context)

    writer = OutcomeWriter(JobStore("default"), process="w", sender=object)
    try:
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")  # as the queue's sessions have
        application.begin()
        with (
            connection.execute_wrapper(cut_the_link_on_the_second),
            pytest.raises(OperationalError),
        ):
            writer.flush(41, items)
        assert cuts, "the fault was not injected"
        assert Job.objects.get(pk=first.id).status == "successful"
    finally:
        application.end()
    connection.close()
    writer.flush(41, [])
    discarded = [
        fields["job"] for action, fields in recorded_events if action == "job_result_discarded"
    ]
    assert discarded == []
    assert sorted(finished_signals) == sorted([first.id, second.id])


def test_a_finished_job_whose_outcome_waits_is_not_timed_out(vendor, recorded_events):
    row_locks(vendor, "SQLite has no row locks for an application to hold")
    tasks.GATE.clear()
    result = tasks.gate_with_timeout.enqueue()
    application = locking_job_row(result.id)
    try:
        with worker_thread(threads=1) as worker:
            wait_for(lambda: Job.objects.get(pk=result.id).status == "running", message="start")
            application.begin()
            tasks.GATE.set()  # it finishes at once, within its 2 s; its outcome waits
            time.sleep(2.5)  # holding the lock past the job's timeout
            application.end()
            wait_for(
                lambda: Job.objects.get(pk=result.id).status == "successful",
                message="its outcome to be written",
            )
            assert worker.exit_status == 0
    finally:
        application.end()
        tasks.GATE.clear()
    assert "job_timed_out" not in [action for action, _ in recorded_events]


def test_a_worker_that_could_not_give_its_jobs_back_keeps_its_row(backend, recorded_events):
    result = tasks.record.enqueue(label="kept", sleep=0.5)
    worker = make_worker(threads=1, config=replace(backend.config, shutdown_timeout=5))
    running = WorkerThread(worker).start()
    wait_for(lambda: Job.objects.get(pk=result.id).status == "running", message="the start")
    with connection.cursor() as cursor:  # the job table goes; the process table stays
        cursor.execute("ALTER TABLE stalwart_job RENAME TO stalwart_job_away")
    try:
        wait_for(
            lambda: any(action == "database_unavailable" for action, _ in recorded_events),
            timeout=10,
            message="the worker to meet the outage",
        )
        worker.request_stop()
        running.join(15)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE stalwart_job_away RENAME TO stalwart_job")
    # It could not give the job back: its row stays, marked leaving, for a prune...
    assert Process.objects.get(pk=worker.registration.id).metadata["leaving"] is True
    # ...and nothing takes the job as an orphan, charging it a death that never happened.
    assert release_orphans("default") == []
    assert Job.objects.get(pk=result.id).errors == []
