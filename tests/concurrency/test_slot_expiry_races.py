"""Expiring concurrency slots (``concurrency_duration``) raced on two real connections.

A release takes no lock on the key, so a hand-out running at the same moment may count the
released job's slot as expired and give it away. The release must not then also keep the
slot for its own job: the key would have two jobs running with a limit of one.
"""

import threading
import uuid
from datetime import UTC, timedelta

import pytest
from django.db import connection, connections, transaction
from django.db.models import F

from stalwart.db import Interruption
from stalwart.jobs import JobStore
from stalwart.models import Job
from stalwart.queues import QueueSelector
from tests.helpers import impatient, register_processes, row_locks, wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

EVERYTHING = QueueSelector.parse("*")


class HeldRelease(threading.Thread):
    """Owner 31 gives its jobs back on its own connection, and waits, its transaction open,
    before it hands on slots and commits (the two halves of ``Statements.release``).

    Its waits are bounds against a hung test, not timings: on a loaded machine (the suite's
    legs side by side) the main thread's sweep has taken more than ten seconds, so they are
    generous. A sweep that really waited on this transaction would still exhaust them."""

    PATIENCE = 60.0

    def __init__(self, jobs: list[tuple[uuid.UUID, int]]) -> None:
        super().__init__(daemon=True)
        self.jobs = jobs
        self.released_rows = threading.Event()
        self.go_on = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        store = JobStore("default")
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                released = store.statements.release_rows(
                    cursor,
                    owner=31,
                    jobs=[Interruption(job_id, attempt, "stop") for job_id, attempt in self.jobs],
                )
                self.released_rows.set()
                assert self.go_on.wait(self.PATIENCE), (
                    f"the test never let the release go on ({self.PATIENCE:.0f} s)"
                )
                store.statements.hand_on_slots(cursor, released, notify=True)
        except BaseException as error:  # noqa: BLE001 - reported by finish()
            self.error = error
        finally:
            self.released_rows.set()
            connections.close_all()

    def finish(self) -> None:
        self.go_on.set()
        self.join(self.PATIENCE)
        assert not self.is_alive(), "the release did not finish"
        if self.error:
            raise self.error


def database_now():
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SELECT UTC_TIMESTAMP(6)")
            return cursor.fetchone()[0].replace(tzinfo=UTC)
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def test_a_release_racing_a_hand_out_of_its_expiring_slot_never_doubles_the_key(vendor):
    row_locks(vendor, "two writers at once need row locks (SQLite has one writer)")
    register_processes(31, 32)
    store = JobStore("default")
    holder = tasks.one_at_a_time_for_a_minute.enqueue("k")
    with impatient():
        store.claim(owner=31, worker_name="w31", selector=EVERYTHING, limit=1)
    waiting = tasks.one_at_a_time_for_a_minute.enqueue("k")
    # The holder's attempt began almost a minute ago: its slot expires in half a second.
    Job.objects.filter(pk=holder.id).update(
        last_attempted_at=F("last_attempted_at") - timedelta(seconds=59.5)
    )
    expiry = Job.objects.get(pk=holder.id).last_attempted_at + timedelta(minutes=1)

    release = HeldRelease([(uuid.UUID(holder.id), 1)])
    release.start()
    assert release.released_rows.wait(HeldRelease.PATIENCE)
    try:
        # While the release is open, the slot expires, and the sweep hands it on.
        wait_for(lambda: database_now() > expiry, message="the slot to expire")
        assert store.unblock_all() == 1
        assert Job.objects.get(pk=waiting.id).status == "ready"
    finally:
        release.finish()

    states = dict(Job.objects.values_list("id", "status"))
    assert states[uuid.UUID(waiting.id)] == "ready"
    assert states[uuid.UUID(holder.id)] == "blocked"  # it waits for the slot it lost
