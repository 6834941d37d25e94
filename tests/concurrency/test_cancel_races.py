"""A cancel racing a claim for the same waiting job, on two real connections (PostgreSQL,
MySQL/MariaDB).

The pausing trigger of the claim races stops one statement between its row lock and its
write, so the other acts at exactly that moment: whoever locked the row first wins, and the
loser leaves the row as the winner wrote it.
"""

import threading

import pytest
from django.db import connection, connections, transaction

import stalwart
from stalwart.control import Cancelled
from stalwart.jobs import JobStore
from stalwart.models import Job
from tests.concurrency.test_claim_races import (  # the race machinery, shared
    ClaimThread,
    claim,
    pause_trigger,  # noqa: F401 - a fixture
    paused_session,
    release,
    wait_until_paused,
    waiting_for_a_row_lock,
)
from tests.helpers import DATABASES, register_processes, row_locks, wait_for
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)


@pytest.fixture(autouse=True)
def processes():
    register_processes(1, 2)


class CancelThread(threading.Thread):
    """``stalwart.cancel`` on its own connection; optionally paused mid-statement."""

    def __init__(self, job_id: str, *, paused: bool = False) -> None:
        super().__init__(daemon=True)
        self.job_id, self.paused = job_id, paused
        self.done: Cancelled | None = None
        self.error: BaseException | None = None
        self.backend_pid: int | None = None

    def run(self) -> None:
        try:
            with transaction.atomic():
                self.backend_pid = paused_session(self.paused)
                self.done = stalwart.cancel(self.job_id)
        except BaseException as error:  # noqa: BLE001 - reported by result()
            self.error = error
        finally:
            connections.close_all()

    def result(self, timeout: float = 10.0) -> Cancelled:
        self.join(timeout)
        assert not self.is_alive(), "the cancel did not finish"
        if self.error:
            raise self.error
        return self.done


def test_a_claim_that_locked_the_job_first_wins_and_the_cancel_asks_it_to_stop(
    pause_trigger,  # noqa: F811 - the fixture imported above
):
    job = tasks.noop.enqueue()
    claiming = ClaimThread(owner=1, limit=1, paused=True)
    claiming.start()
    wait_until_paused(wait_for(lambda: claiming.backend_pid, message="the claim to start"))
    # The claim holds the row, between its lock and its write: the cancel waits for it.
    cancelling = CancelThread(job.id)
    cancelling.start()
    wait_for(
        lambda: cancelling.backend_pid and waiting_for_a_row_lock(cancelling.backend_pid),
        message="the cancel to wait for the claim's row lock",
    )
    release(pause_trigger)
    assert [str(claimed.id) for claimed in claiming.result()] == [job.id]
    # The cancel found the job running: it did not cancel it, it asked it to stop.
    assert cancelling.result() == Cancelled(cancelled=0, requested=1)
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.owner, row.attempt) == ("running", 1, 1)
    assert row.cancel_requested_at is not None
    assert row.finished_at is None


def test_a_cancel_that_locked_the_job_first_wins_and_the_claim_skips_it(
    pause_trigger,  # noqa: F811 - the fixture imported above
):
    job = tasks.noop.enqueue()
    other = tasks.noop.enqueue()
    cancelling = CancelThread(job.id, paused=True)
    cancelling.start()
    wait_until_paused(wait_for(lambda: cancelling.backend_pid, message="the cancel to start"))
    # The cancel holds the row between its lock and its write: a claim passes it by.
    assert [str(claimed.id) for claimed in claim(owner=2, limit=2)] == [other.id]
    release(pause_trigger)
    assert cancelling.result() == Cancelled(cancelled=1, requested=0)
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.owner, row.attempt) == ("cancelled", None, 0)
    assert claim(owner=2, limit=2) == []


class ReleaseThread(threading.Thread):
    """A worker giving a running job back (its process died, or stopped), on its own
    connection: it locks the job's row, then waits for ``go`` before it releases and
    commits."""

    def __init__(self, job_id: str, attempt: int) -> None:
        super().__init__(daemon=True)
        self.job_id, self.attempt = job_id, attempt
        self.locked, self.go = threading.Event(), threading.Event()
        self.released: list | None = None

    def run(self) -> None:
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT 1 FROM stalwart_job WHERE id = %s FOR UPDATE", [self.job_id])
                self.locked.set()
                self.go.wait(10)
                self.released = JobStore("default").release(
                    owner=1, jobs=[(self.job_id, self.attempt)], cause="its worker died"
                )
        finally:
            connections.close_all()


def test_a_job_given_back_between_the_cancels_two_phases_is_cancelled(vendor):
    row_locks(vendor, "SQLite has one writer: a release cannot come between two statements")
    job = tasks.noop.enqueue()
    [claimed] = claim(owner=1, limit=1)
    releasing = ReleaseThread(job.id, claimed.attempt)
    releasing.start()
    assert releasing.locked.wait(10), "the release did not lock the row"
    # The cancel finds the job running, not waiting: it asks it to stop, and that request
    # waits for the row the worker holds, which gives the job back meanwhile.
    cancelling = CancelThread(job.id)
    cancelling.start()
    wait_for(
        lambda: cancelling.backend_pid and waiting_for_a_row_lock(cancelling.backend_pid),
        message="the cancel's request to wait for the release's row lock",
    )
    releasing.go.set()
    releasing.join(10)
    assert releasing.released is not None
    assert len(releasing.released) == 1
    # Neither lost nor run again: the job is cancelled, and the answer says so.
    assert cancelling.result() == Cancelled(cancelled=1, requested=0)
    row = Job.objects.get(pk=job.id)
    assert (row.status, row.owner) == ("cancelled", None)
    assert claim(owner=2, limit=1) == []
