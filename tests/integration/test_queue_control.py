"""Uniqueness, concurrency keys, pausing, bulk retry and discard, retention: in-process."""

import threading
import uuid
from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.db.models import F
from django.tasks import TaskResultStatus, default_task_backend
from django.tasks.exceptions import TaskResultDoesNotExist
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from stalwart import Call, control, enqueue_many
from stalwart.control import Selection
from stalwart.db import Outcome
from stalwart.jobs import JobStore
from stalwart.models import Job
from stalwart.queues import QueueSelector
from tests.helpers import drain, register_processes, wait_for, worker_thread
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


# -- unique jobs ---------------------------------------------------------------------------


def test_a_unique_job_enqueued_twice_returns_the_waiting_one():
    first = tasks.unique_report.enqueue("2026-11-30")
    again = tasks.unique_report.enqueue("2026-11-30")
    other = tasks.unique_report.enqueue("2026-12-01")
    assert again.id == first.id
    assert other.id != first.id
    assert Job.objects.count() == 2
    drain()
    # Once it has run, an equal call makes a new job.
    later = tasks.unique_report.enqueue("2026-11-30")
    assert later.id != first.id


def test_uniqueness_while_running_is_opt_in():
    sync = tasks.sync_account.enqueue(7)
    Job.objects.filter(pk=sync.id).update(status="running", owner=1, attempt=1)
    assert tasks.sync_account.enqueue(7, full=True).id == sync.id  # key is the account only
    report = tasks.unique_report.enqueue("x")
    Job.objects.filter(pk=report.id).update(status="running", owner=1, attempt=1)
    assert tasks.unique_report.enqueue("x").id != report.id


def test_enqueue_many_deduplicates_within_and_across_calls():
    existing = tasks.unique_report.enqueue("a")
    results = enqueue_many(tasks.unique_report, [Call("a"), Call("b"), Call("b")])
    assert results[0].id == existing.id
    assert results[1].id == results[2].id
    assert Job.objects.count() == 2


@pytest.mark.parametrize("round_number", range(4))
def test_unique_enqueue_raced_from_threads_in_transactions_makes_one_job(round_number):
    racers = 6
    barrier = threading.Barrier(racers)
    ids: list[str] = []
    errors: list[BaseException] = []

    def race() -> None:
        try:
            barrier.wait(timeout=10)
            with transaction.atomic():
                ids.append(tasks.unique_report.enqueue(f"day-{round_number}").id)
                # The caller's transaction is still usable after losing the race.
                assert Job.objects.filter(unique_key__isnull=False).exists()
        except BaseException as error:  # noqa: BLE001 - asserted below
            errors.append(error)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=race) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert errors == []
    assert len(ids) == racers
    assert len(set(ids)) == 1
    assert Job.objects.count() == 1


# -- concurrency keys ----------------------------------------------------------------------


def test_jobs_over_the_limit_wait_blocked_and_get_slots_in_order():
    first = tasks.two_per_account.enqueue(1)
    second = tasks.two_per_account.enqueue(1)
    third = tasks.two_per_account.using(priority=5).enqueue(1)
    fourth = tasks.two_per_account.enqueue(1)
    elsewhere = tasks.two_per_account.enqueue(2)
    states = {str(pk): status for pk, status in Job.objects.values_list("id", "status")}
    assert [states[r.id] for r in (first, second, third, fourth, elsewhere)] == [
        "ready",
        "ready",
        "blocked",
        "blocked",
        "ready",
    ]
    # A slot frees: the more urgent blocked job gets it.
    store = JobStore("default")
    Job.objects.filter(pk=first.id).update(status="successful")
    assert store.unblock(["tests.testapp.tasks.two_per_account:1"]) == 1
    assert Job.objects.get(pk=third.id).status == "ready"
    assert Job.objects.get(pk=fourth.id).status == "blocked"
    drain(threads=4)
    assert set(Job.objects.values_list("status", flat=True)) == {"successful"}


def test_a_blocked_job_reports_ready_to_django():
    tasks.one_at_a_time.enqueue("k")
    blocked = tasks.one_at_a_time.enqueue("k")
    assert Job.objects.get(pk=blocked.id).status == "blocked"
    assert default_task_backend.get_result(blocked.id).status == TaskResultStatus.READY


def test_a_slot_freed_without_hand_off_is_found_by_the_sweep():
    tasks.one_at_a_time.enqueue("k")
    waiting = tasks.one_at_a_time.enqueue("k")
    Job.objects.exclude(pk=waiting.id).delete()  # the holder vanished without handing on
    assert JobStore("default").unblock_all() == 1
    assert Job.objects.get(pk=waiting.id).status == "ready"


# -- concurrency slots that expire (concurrency_duration) --------------------------------

EVERYTHING = QueueSelector.parse("*")
MINUTE_KEY = "tests.testapp.tasks.one_at_a_time_for_a_minute:k"


@pytest.fixture
def slot_held_for_a_minute():
    """A job of a key with limit 1 and a one-minute duration, running for worker 31; a
    second job of the key, blocked."""
    register_processes(31, 32)
    store = JobStore("default")
    holder = tasks.one_at_a_time_for_a_minute.enqueue("k")
    assert [job.id for job in store.claim(**claim_for(31))] == [uuid.UUID(holder.id)]
    waiting = tasks.one_at_a_time_for_a_minute.enqueue("k")
    assert Job.objects.get(pk=waiting.id).status == "blocked"
    return store, holder, waiting


def claim_for(owner: int) -> dict:
    return {"owner": owner, "worker_name": f"w{owner}", "selector": EVERYTHING, "limit": 5}


def started_ago(result, seconds: float) -> None:
    """As if the job's attempt had begun ``seconds`` ago."""
    Job.objects.filter(pk=result.id).update(
        last_attempted_at=F("last_attempted_at") - timedelta(seconds=seconds)
    )


def status_of(result) -> str:
    return Job.objects.get(pk=result.id).status


def test_the_duration_is_stored_with_each_job_in_seconds():
    result = tasks.one_at_a_time_for_a_minute.enqueue("k")
    assert Job.objects.get(pk=result.id).concurrency_duration == 60.0
    assert Job.objects.get(pk=tasks.one_at_a_time.enqueue("k").id).concurrency_duration is None


def test_a_running_job_holds_its_slot_until_its_duration_has_passed(slot_held_for_a_minute):
    store, holder, waiting = slot_held_for_a_minute
    started_ago(holder, 50)
    assert store.unblock_all() == 0
    assert status_of(waiting) == "blocked"
    started_ago(holder, 11)
    assert store.unblock_all() == 1
    assert status_of(waiting) == "ready"
    assert status_of(holder) == "running"  # it runs on; only its slot was taken from it


def test_a_slot_without_a_duration_never_expires():
    register_processes(31)
    store = JobStore("default")
    holder = tasks.one_at_a_time.enqueue("k")
    store.claim(**claim_for(31))
    waiting = tasks.one_at_a_time.enqueue("k")
    started_ago(holder, 86400 * 365)
    assert store.unblock_all() == 0
    assert status_of(waiting) == "blocked"


def test_a_job_released_after_its_slot_expired_waits_for_a_slot_again(slot_held_for_a_minute):
    store, holder, waiting = slot_held_for_a_minute
    started_ago(holder, 61)
    store.unblock_all()
    (taken,) = store.claim(**claim_for(32))
    assert str(taken.id) == waiting.id
    # The first holder's worker stops and gives its job back: the slot is someone else's.
    assert store.release(owner=31, jobs=[(uuid.UUID(holder.id), 1)]) == [uuid.UUID(holder.id)]
    assert status_of(holder) == "blocked"
    assert store.claim(**claim_for(31)) == []
    # The slot frees when the second job finishes: the first job gets it.
    store.finish(
        owner=32,
        outcomes=[Outcome(id=taken.id, attempt=1, status="successful", return_value="null")],
        free_keys=[MINUTE_KEY],
    )
    assert status_of(holder) == "ready"


def test_a_job_of_a_dead_process_whose_slot_expired_waits_for_a_slot(slot_held_for_a_minute):
    store, holder, waiting = slot_held_for_a_minute
    started_ago(holder, 61)
    store.unblock_all()
    store.claim(**claim_for(32))
    released = store.release_owner(owner=31, error_class="x.Died", error_text="killed")
    assert [(str(job.id), job.status) for job in released] == [(holder.id, "blocked")]
    assert (status_of(holder), status_of(waiting)) == ("blocked", "running")
    assert store.unblock_all() == 0  # the slot is still taken by the job of worker 32


def test_a_job_released_before_its_slot_expired_keeps_it(slot_held_for_a_minute):
    store, holder, waiting = slot_held_for_a_minute
    started_ago(holder, 30)
    assert store.release(owner=31, jobs=[(uuid.UUID(holder.id), 1)]) == [uuid.UUID(holder.id)]
    assert (status_of(holder), status_of(waiting)) == ("ready", "blocked")


def test_an_expired_slot_given_back_with_no_one_waiting_is_taken_again():
    register_processes(31)
    store = JobStore("default")
    holder = tasks.one_at_a_time_for_a_minute.enqueue("k")
    store.claim(**claim_for(31))
    started_ago(holder, 61)
    store.release_owner(owner=31, error_class="x.Died", error_text="killed")
    assert status_of(holder) == "ready"  # blocked, then handed the free slot at once


# -- pausing -------------------------------------------------------------------------------


def test_a_paused_queue_is_not_claimed_from_until_resumed():
    assert control.pause("reports") is True
    assert control.pause("reports") is False
    assert control.paused_queues() == ["reports"]
    paused = tasks.add.using(queue_name="reports").enqueue(1, 1)
    other = tasks.add.enqueue(2, 2)
    with worker_thread(threads=2) as worker:
        wait_for(
            lambda: Job.objects.get(pk=other.id).status == "successful",
            message="the other queue to be served",
        )
        wait_for(
            lambda: worker.jobs_done >= 1 and worker._next_pause_check > 0,
            message="a second look at the pauses",
        )
        assert Job.objects.get(pk=paused.id).status == "ready"
        assert control.resume("reports") is True
        wait_for(
            lambda: Job.objects.get(pk=paused.id).status == "successful",
            message="the resumed queue to be served",
        )
    assert control.resume("reports") is False


# -- failed jobs: retry, discard; scheduled jobs: run now ---------------------------------


def make_failed(count: int, task=tasks.add, queue: str = "default", call=None) -> None:
    enqueue_many(task.using(queue_name=queue), [call or Call(1, 2)] * count)
    Job.objects.filter(status="ready").update(
        status="failed",
        attempt=1,
        finished_at=timezone.now(),
        errors=[{"exception_class_path": "builtins.ValueError", "traceback": "boom"}],
    )


def test_retry_and_discard_thousands_in_bounded_batches():
    make_failed(2500)
    make_failed(300, task=tasks.noop, call=Call())
    selection = Selection(task_path="tests.testapp.tasks.add")
    assert control.retry_failed(selection, dry_run=True) == 2500
    assert Job.objects.filter(status="failed").count() == 2800
    with CaptureQueriesContext(connection) as queries:
        assert control.retry_failed(selection, batch_size=1000) == 2500
    updates = [q for q in queries.captured_queries if "UPDATE stalwart_job" in q["sql"]]
    assert len(updates) == 3  # 1000 + 1000 + 500: never one statement for all
    retried = Job.objects.filter(task_path="tests.testapp.tasks.add")
    assert set(retried.values_list("status", flat=True)) == {"ready"}
    assert set(retried.values_list("max_attempts", flat=True)) == {5}
    assert retried.filter(finished_at__isnull=False).count() == 0
    assert len(retried.first().errors) == 1  # the history stays

    assert control.discard_failed(Selection(everything=True), dry_run=True) == 300
    with CaptureQueriesContext(connection) as queries:
        assert control.discard_failed(Selection(everything=True), batch_size=128) == 300
    deletes = [q for q in queries.captured_queries if "DELETE FROM stalwart_job" in q["sql"]]
    assert len(deletes) == 3
    assert not Job.objects.filter(status="failed").exists()


def test_a_failed_job_retried_gets_one_more_attempt_even_at_its_cap():
    result = tasks.always_fails.enqueue()
    drain(threads=1)
    assert Job.objects.get(pk=result.id).status == "failed"
    assert control.retry_failed(Selection(ids=[result.id])) == 1
    job = Job.objects.get(pk=result.id)
    assert (job.status, job.max_attempts) == ("ready", 4)
    drain(threads=1)
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert len(result.errors) == 4


def test_retrying_a_failed_unique_job_leaves_it_if_its_twin_waits():
    failed = tasks.unique_report.enqueue("d")
    Job.objects.filter(pk=failed.id).update(status="failed")
    waiting = tasks.unique_report.enqueue("d")
    assert waiting.id != failed.id
    assert control.retry_failed(Selection(everything=True)) == 0
    assert Job.objects.get(pk=failed.id).status == "failed"


def test_retried_failed_jobs_with_a_concurrency_key_wait_for_a_slot():
    holder = tasks.one_at_a_time.enqueue("k")
    extra = tasks.one_at_a_time.enqueue("k")
    Job.objects.filter(pk=extra.id).update(status="failed")
    assert control.retry_failed(Selection(ids=[extra.id])) == 1
    assert Job.objects.get(pk=extra.id).status == "blocked"
    assert Job.objects.get(pk=holder.id).status == "ready"


def test_run_now_makes_a_scheduled_job_ready():
    later = tasks.add.using(run_after=timezone.now() + timedelta(days=1)).enqueue(1, 1)
    assert control.run_now(Selection(ids=[later.id]), dry_run=True) == 1
    assert control.run_now(Selection(ids=[later.id])) == 1
    assert Job.objects.get(pk=later.id).status == "ready"
    drain()
    later.refresh()
    assert later.return_value == 2


def test_a_selection_must_say_which_jobs():
    with pytest.raises(ValueError, match="Say which jobs"):
        Selection()


# -- retention -----------------------------------------------------------------------------


def test_old_finished_jobs_are_pruned_and_their_results_are_gone():
    results = [tasks.add.enqueue(i, i) for i in range(5)]
    failure = tasks.fail.enqueue()
    drain()
    old = results[:3]
    Job.objects.filter(pk__in=[r.id for r in old]).update(
        finished_at=F("finished_at") - timedelta(days=2)
    )
    assert control.prune_finished(older_than=timedelta(days=1), dry_run=True) == 3
    assert control.prune_finished(older_than=timedelta(days=1), batch_size=2) == 3
    for result in old:
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result.id)
    assert default_task_backend.get_result(results[4].id).return_value == 8
    assert default_task_backend.get_result(failure.id).status == TaskResultStatus.FAILED


def test_the_retention_chore_applies_the_configured_ages():
    from dataclasses import replace

    success = tasks.add.enqueue(1, 1)
    failure = tasks.fail.enqueue()
    drain()
    Job.objects.update(finished_at=F("finished_at") - timedelta(days=3))
    config = replace(
        default_task_backend.config,
        keep_successful=timedelta(days=1),
        keep_failed=timedelta(days=7),
    )
    assert control.delete_expired_jobs(config) == 1
    assert not Job.objects.filter(pk=success.id).exists()
    assert Job.objects.filter(pk=failure.id).exists()
    # Nothing else is touched: running and waiting jobs are never pruned.
    waiting = tasks.add.enqueue(2, 2)
    Job.objects.filter(pk=waiting.id).update(finished_at=timezone.now() - timedelta(days=30))
    assert control.delete_expired_jobs(config) == 0
    assert Job.objects.filter(pk=waiting.id).exists()
    assert Execution.objects.count() == 0


# -- a unique job going back to waiting while its twin waits -----------------------------


@pytest.fixture
def running_unique_job_with_a_waiting_twin():
    from tests.helpers import register_processes

    register_processes(11)
    first = tasks.unique_report.enqueue("d")
    (claimed,) = JobStore("default").claim(
        owner=11,
        worker_name="w11",
        selector=QueueSelector.parse("*"),
        limit=1,
    )
    twin = tasks.unique_report.enqueue("d")  # the first is running: not a duplicate
    assert twin.id != first.id
    return claimed, twin


def test_a_retry_while_a_twin_waits_drops_the_key_instead_of_failing(
    running_unique_job_with_a_waiting_twin,
):
    from stalwart.db import Outcome

    claimed, twin = running_unique_job_with_a_waiting_twin
    written = JobStore("default").finish(
        owner=11,
        outcomes=[Outcome(id=claimed.id, attempt=1, status="scheduled", retry_in=0)],
    )
    assert set(written) == {claimed.id}
    job = Job.objects.get(pk=claimed.id)
    assert (job.status, job.unique_key) == ("scheduled", None)
    assert Job.objects.get(pk=twin.id).unique_key is not None


def test_a_release_while_a_twin_waits_drops_the_key(running_unique_job_with_a_waiting_twin):
    claimed, _ = running_unique_job_with_a_waiting_twin
    assert JobStore("default").release(owner=11, jobs=[(claimed.id, 1)]) == [claimed.id]
    assert Job.objects.get(pk=claimed.id).unique_key is None


def test_a_death_while_a_twin_waits_drops_the_key(running_unique_job_with_a_waiting_twin):
    claimed, _ = running_unique_job_with_a_waiting_twin
    released = JobStore("default").release_owner(owner=11, error_class="x.Died", error_text="x")
    assert [job.status for job in released] == ["ready"]
    assert Job.objects.get(pk=claimed.id).unique_key is None


def test_run_now_moves_a_scheduled_unique_job_and_dry_runs_agree():
    later = tasks.unique_report.using(run_after=timezone.now() + timedelta(days=1)).enqueue("z")
    assert control.run_now(Selection(ids=[later.id]), dry_run=True) == 1
    assert control.run_now(Selection(ids=[later.id])) == 1
    assert Job.objects.get(pk=later.id).status == "ready"
    failed = tasks.unique_report.enqueue("y")
    Job.objects.filter(pk=failed.id).update(status="failed")
    tasks.unique_report.enqueue("y")  # its twin now waits: a retry would collide
    assert control.retry_failed(Selection(everything=True), dry_run=True) == 0
    assert control.retry_failed(Selection(everything=True)) == 0


def test_batch_size_must_be_positive():
    with pytest.raises(ValueError, match="batch_size must be a whole number of at least 1"):
        control.retry_failed(Selection(everything=True), batch_size=0)
