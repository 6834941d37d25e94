"""Idle roles wait for what wakes them, not on a clock: a dispatcher sleeps until its next
due job or a notification of a sooner one, a scheduler until its next tick, and a worker
that hears no notifications still polls.

The dispatchers here poll every 30 s: any job they make ready within a second or two of its
time was found by the wait on its due time, or by a notification.
"""

import threading
import time
from dataclasses import replace
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone

from stalwart import control
from stalwart.conf import DispatcherOptions, SchedulerOptions
from stalwart.models import Job, RecurringRun
from stalwart.processes import worker as worker_module
from stalwart.processes.dispatcher import Dispatcher
from stalwart.processes.listener import Listener
from stalwart.processes.scheduler import Scheduler
from stalwart.processes.worker import LISTEN_WARM_UP
from stalwart.recurring import read_recurring
from tests.helpers import DATABASES, WorkerThread, make_worker, wait_for, worker_thread
from tests.testapp import tasks

# DATABASES: behind PgBouncer, roles LISTEN on the direct alias.
pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)

SLOW_POLL = 30.0
# How late a delayed job may be made ready: far less than SLOW_POLL, with room for a
# loaded machine.
LATE_BY_AT_MOST = 5.0


@pytest.fixture
def postgresql(vendor):
    if vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's (on SQLite and MySQL, idle roles poll)")


def dispatcher(backend) -> Dispatcher:
    return Dispatcher(
        config=backend.config,
        dispatcher=DispatcherOptions(polling_interval=SLOW_POLL, listen_timeout=SLOW_POLL),
    )


def asleep(role: Dispatcher) -> bool:
    """The dispatcher hears notifications, and has planned its next look."""
    return role._listening() and role._look_at != float("inf")


def status(result) -> str:
    return Job.objects.get(id=result.id).status


def test_a_dispatcher_wakes_when_its_next_scheduled_job_is_due(postgresql, backend):
    result = tasks.noop.using(run_after=timezone.now() + timedelta(seconds=2)).enqueue()
    due = time.monotonic() + 2
    running = WorkerThread(dispatcher(backend)).start()
    try:
        wait_for(lambda: asleep(running.worker), message="the dispatcher to go to sleep")
        assert status(result) == "scheduled"
        wait_for(
            lambda: status(result) == "ready",
            timeout=due + LATE_BY_AT_MOST - time.monotonic(),
            message="the job to be made ready at its time",
        )
    finally:
        running.worker.request_stop()
        running.join(10)


def test_a_scheduled_job_due_sooner_wakes_a_sleeping_dispatcher(postgresql, backend):
    later = tasks.noop.using(run_after=timezone.now() + timedelta(minutes=10)).enqueue()
    running = WorkerThread(dispatcher(backend)).start()
    try:
        wait_for(lambda: asleep(running.worker), message="the dispatcher to go to sleep")
        sooner = tasks.noop.using(run_after=timezone.now() + timedelta(seconds=0.5)).enqueue()
        due = time.monotonic() + 0.5
        wait_for(
            lambda: status(sooner) == "ready",
            timeout=due + LATE_BY_AT_MOST - time.monotonic(),
            message="the sooner job to be made ready at its time",
        )
        assert status(later) == "scheduled"
    finally:
        running.worker.request_stop()
        running.join(10)


def test_a_job_that_comes_due_between_promotion_and_planning_is_promoted_at_once(
    postgresql, backend, monkeypatch
):
    """A look promotes what is due by one reading of the database's clock and plans its
    next look from another, an instant later. A job that comes due in between is due by the
    plan, yet was not promoted: the dispatcher must look again at once, not take it for a
    job it cannot promote and leave it for polling_interval (30 s here)."""
    result = tasks.noop.using(run_after=timezone.now() + timedelta(minutes=10)).enqueue()
    role = dispatcher(backend)
    role._listener = type("Heard", (), {"listening": True})()  # as if LISTEN were up
    promote = role.store.promote_due

    def promote_then_come_due(**kwargs):
        promoted = promote(**kwargs)
        # The job comes due right after the promotion read the clock.
        Job.objects.filter(id=result.id).update(available_at=timezone.now() - timedelta(0, 1))
        return promoted

    monkeypatch.setattr(role.store, "promote_due", promote_then_come_due)
    wait = role._dispatch()
    assert status(result) == "scheduled"
    assert wait < 1.0, f"a job due by the plan waits {wait:.1f} s for the next look"
    monkeypatch.setattr(role.store, "promote_due", promote)
    role._dispatch()
    assert status(result) == "ready"


def test_a_retry_written_by_a_worker_wakes_a_sleeping_dispatcher(postgresql, backend):
    running = WorkerThread(dispatcher(backend)).start()
    try:
        wait_for(lambda: asleep(running.worker), message="the dispatcher to go to sleep")
        with worker_thread(threads=1):
            result = tasks.fails_once_then_waits.enqueue()
            wait_for(lambda: status(result) == "scheduled", message="the retry to be written")
            due = time.monotonic() + 1.5
            wait_for(
                lambda: status(result) == "successful",
                timeout=due + LATE_BY_AT_MOST - time.monotonic(),
                message="the retry to run at its time",
            )
    finally:
        running.worker.request_stop()
        running.join(10)


def test_a_worker_that_hears_no_notifications_polls(backend):
    config = replace(backend.config, listen_notify=False)
    worker = make_worker(config=config, poll_interval=None)
    assert worker.poll_interval() <= 1.0
    with worker_thread(worker):
        result = tasks.noop.enqueue()
        wait_for(lambda: status(result) == "successful", timeout=5, message="the job to run")


def test_a_listening_worker_waits_long_and_is_woken_by_an_enqueue(postgresql, backend):
    worker = make_worker(poll_interval=None)
    with worker_thread(worker):
        wait_for(lambda: worker._listener and worker._listener.listening)
        assert worker.poll_interval() == 1.0  # the first seconds of listening: short polls
        worker._listener.listening_since -= LISTEN_WARM_UP  # as if listening for a while
        assert worker.poll_interval() == SLOW_POLL
        result = tasks.noop.enqueue()
        wait_for(lambda: status(result) == "successful", timeout=5, message="the job to run")


def test_a_resume_notifies_the_listeners_of_its_queue(postgresql, backend):
    """A resume sends the queue's name, marked as resumed, on the channel an enqueue uses
    (on commit), so an idle worker of that queue wakes and reads its pauses again; a pause
    wakes no one."""
    heard: list[str] = []
    listener = Listener(
        backend.config.listen_database or "default",
        lambda queue: heard.append(queue) or True,
        lambda: None,
    )
    listener.start()
    try:
        wait_for(lambda: listener.listening, message="LISTEN to take effect")
        control.pause("reports")
        control.resume("reports")
        control.resume("reports")  # not paused any more: nothing to tell
        wait_for(lambda: "resumed:reports" in heard, timeout=5, message="the resume's notification")
        tasks.noop.using(queue_name="marker").enqueue()  # notified after what came before
        wait_for(lambda: "marker" in heard, timeout=5, message="the enqueue's notification")
        assert heard == ["resumed:reports", "marker"]
    finally:
        listener.stop()
        listener.join(5)


def test_a_worker_serving_a_paused_queue_is_woken_by_its_resume(postgresql, backend):
    """A worker that knows a queue it serves is paused does not poll for its resume: the
    resume's notification wakes it, has it read its pauses again (they would otherwise be
    up to a second stale), and the queue's jobs run at once, long before its next look."""
    control.pause("default")
    worker = make_worker(poll_interval=None)
    heard: list[tuple[str, bool]] = []
    hear = worker._heard
    worker._heard = lambda payload: heard.append((payload, hear(payload))) or heard[-1][1]
    result = tasks.noop.enqueue()  # before the worker listens: not heard
    try:
        with worker_thread(worker):
            wait_for(lambda: "default" in worker._paused, message="the worker to see the pause")
            wait_for(lambda: worker._listener and worker._listener.listening)
            worker._listener.listening_since -= LISTEN_WARM_UP  # as if listening for a while
            assert worker.poll_interval() == SLOW_POLL  # no polling for the resume
            # A new job in the paused queue does not wake it: nothing there to claim.
            tasks.noop.enqueue()
            wait_for(lambda: heard, message="the enqueue's notification")
            assert heard == [("default", False)]
            assert status(result) == "ready"
            control.resume("default")
            wait_for(lambda: status(result) == "successful", timeout=5, message="the job to run")
    finally:
        control.resume("default")


def test_a_scheduler_wakes_for_each_tick_whatever_its_polling_interval(backend):
    recurring = read_recurring(
        {"tick": {"task": "tests.testapp.tasks.noop", "schedule": "* * * * * *"}},
        "recurring",
        "UTC",
    )
    scheduler = Scheduler(
        config=replace(backend.config, recurring=recurring),
        scheduler=SchedulerOptions(polling_interval=SLOW_POLL),
    )
    running = WorkerThread(scheduler).start()
    try:
        wait_for(
            lambda: RecurringRun.objects.filter(key="tick").count() >= 3,
            timeout=8,
            message="three ticks, a second apart",
        )
    finally:
        scheduler.request_stop()
        running.join(10)
    connections.close_all()


def test_a_resume_heard_while_the_worker_reads_its_pauses_is_not_missed(
    postgresql, backend, monkeypatch
):
    """A pause the worker has not read yet, then its resume, heard while the worker reads
    its pauses: the read began before the resume committed, so it says the queue is
    paused, and the notification came while the worker's list did not name the queue yet.
    The worker must read its pauses again at once, not leave the queue's jobs for its next
    look (30 s here). (Heartbeats 10 s apart: no reconciliation's read of the pauses
    mends the list in the meantime.)"""
    config = replace(backend.config, heartbeat_interval=10.0, process_alive_threshold=60.0)
    worker = make_worker(config=config, poll_interval=None)
    heard: list[str] = []
    hear = worker._heard

    def hear_and_record(queue_name: str) -> bool:
        wanted = hear(queue_name)
        heard.append(queue_name)
        return wanted

    worker._heard = hear_and_record  # what the listener calls, from its own thread
    read = worker_module.paused_queues
    armed, read_done, go_on = threading.Event(), threading.Event(), threading.Event()

    def read_then_let_the_resume_land(**kwargs):
        paused = read(**kwargs)
        if armed.is_set() and "reports" in paused:
            armed.clear()
            read_done.set()
            go_on.wait(10)  # the resume commits and is heard before this read's answer is kept
        return paused

    monkeypatch.setattr(worker_module, "paused_queues", read_then_let_the_resume_land)
    try:
        with worker_thread(worker):
            wait_for(lambda: worker._listener and worker._listener.listening)
            worker._listener.listening_since -= LISTEN_WARM_UP  # as if listening for a while
            wait_for(
                lambda: worker._next_poll - time.monotonic() > SLOW_POLL / 2,
                message="the worker to sleep until its next look",
            )
            control.pause("reports")  # notifies no one: the worker does not know yet
            wait_for(
                lambda: time.monotonic() >= worker._next_pause_check,
                message="the worker's pauses to be due for a read",
            )
            armed.set()
            result = tasks.noop.using(queue_name="reports").enqueue()  # wakes the worker
            assert read_done.wait(10), "the worker did not read its pauses"
            control.resume("reports")
            wait_for(lambda: "resumed:reports" in heard, message="the resume to be heard")
            go_on.set()
            wait_for(lambda: status(result) == "successful", timeout=5, message="the job to run")
    finally:
        go_on.set()
        control.resume("reports")
