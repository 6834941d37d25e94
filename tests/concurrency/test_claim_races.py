"""Deterministic claim races on two (or three) real connections.

A test-only trigger pauses one claim in the middle (after it has locked its rows, before it
has updated them) until the test lets it go, so the other connections act at exactly that
moment: on PostgreSQL it waits for an advisory lock, on MySQL and MariaDB for a named lock
(``GET_LOCK``), in a trigger before each update of a job row of the paused session.
"""

import threading
from collections.abc import Iterator

import pytest
from django.db import connection, connections, transaction

from stalwart import Call, enqueue_many
from stalwart.jobs import JobStore
from stalwart.models import Job
from stalwart.queues import QueueSelector
from tests.helpers import (
    DATABASES,
    SESSION_DATABASE,
    impatient,
    register_processes,
    row_locks,
    wait_for,
)
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True, databases=DATABASES)

EVERYTHING = QueueSelector.parse("*")


@pytest.fixture(autouse=True)
def processes():
    register_processes(*range(1, 10))


PAUSE_LOCK = 4242


def claim(owner: int, limit: int) -> list:
    """A claim that raises, rather than hangs, if it ever waits on a row lock."""
    with impatient():
        return claim_waiting(owner, limit)


def claim_waiting(owner: int, limit: int) -> list:
    """A claim with no lock timeout of its own: one paused by the trigger waits on the pause
    lock, which PostgreSQL's ``lock_timeout`` would also end."""
    return JobStore("default").claim(
        owner=owner, worker_name=f"w{owner}", selector=EVERYTHING, limit=limit
    )


class ClaimThread(threading.Thread):
    """A claim on its own connection; optionally paused mid-statement by the trigger."""

    def __init__(self, owner: int, limit: int, *, paused: bool = False) -> None:
        super().__init__(daemon=True)
        self.owner, self.limit, self.paused = owner, limit, paused
        self.claimed: list | None = None
        self.error: BaseException | None = None
        self.backend_pid: int | None = None

    def run(self) -> None:
        try:
            if connection.vendor == "sqlite":
                self.claimed = claim(self.owner, self.limit)
                return
            with transaction.atomic():
                self.backend_pid = paused_session(self.paused)
                if self.paused:
                    self.claimed = claim_waiting(self.owner, self.limit)
                else:
                    self.claimed = claim(self.owner, self.limit)
        except BaseException as error:  # noqa: BLE001 - reported by result()
            self.error = error
        finally:
            connections.close_all()

    def result(self, timeout: float = 10.0) -> list:
        self.join(timeout)
        assert not self.is_alive(), "the claim did not finish"
        if self.error:
            raise self.error
        return self.claimed


MYSQL_PAUSE = f"""
    CREATE TRIGGER stalwart_test_pause BEFORE UPDATE ON stalwart_job FOR EACH ROW
    BEGIN
        IF @stalwart_pause = 'on' THEN
            SET @stalwart_paused = GET_LOCK('stalwart_pause_{PAUSE_LOCK}', 30);
            SET @stalwart_paused = RELEASE_LOCK('stalwart_pause_{PAUSE_LOCK}');
        END IF;
    END"""


@pytest.fixture
def pause_trigger(vendor) -> Iterator[object]:
    """Install the pausing trigger; yield a control connection holding the pause lock."""
    if vendor == "sqlite":
        pytest.skip("row-level races need row locks (SQLite has one writer)")
    if vendor == "mysql":
        yield from mysql_pause_trigger()
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            CREATE OR REPLACE FUNCTION stalwart_test_pause() RETURNS trigger AS $$
            BEGIN
                IF current_setting('stalwart.pause', true) = 'on' THEN
                    PERFORM pg_advisory_xact_lock_shared({PAUSE_LOCK});
                END IF;
                RETURN NEW;
            END $$ LANGUAGE plpgsql;
            CREATE TRIGGER stalwart_test_pause BEFORE UPDATE ON stalwart_job
                FOR EACH ROW EXECUTE FUNCTION stalwart_test_pause();
            """
        )
    control = connections.create_connection(SESSION_DATABASE)  # holds a session lock
    with control.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [PAUSE_LOCK])
    try:
        yield control
    finally:
        with control.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock_all()")
        control.close()
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS stalwart_test_pause ON stalwart_job")
            cursor.execute("DROP FUNCTION IF EXISTS stalwart_test_pause()")


def paused_session(paused: bool) -> int:
    """In a transaction: its session's id on the server and, if ``paused``, make its updates
    of job rows pause (``SET LOCAL stalwart.pause`` on PostgreSQL, the user variable
    ``@stalwart_pause`` on MySQL). One transaction keeps one server connection, through
    PgBouncer too."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("SELECT CONNECTION_ID()")
            session = cursor.fetchone()[0]
            if paused:
                cursor.execute("SET @stalwart_pause = 'on'")
            return session
        cursor.execute("SELECT pg_backend_pid()")
        session = cursor.fetchone()[0]
        if paused:
            cursor.execute("SET LOCAL stalwart.pause = 'on'")
        return session


def mysql_pause_trigger() -> Iterator[object]:
    with connection.cursor() as cursor:
        cursor.execute(MYSQL_PAUSE)
    control = connections.create_connection("default")
    with control.cursor() as cursor:
        cursor.execute(f"SELECT GET_LOCK('stalwart_pause_{PAUSE_LOCK}', 10)")
    try:
        yield control
    finally:
        with control.cursor() as cursor:
            cursor.execute("SELECT RELEASE_ALL_LOCKS()")
        control.close()
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER IF EXISTS stalwart_test_pause")


def wait_until_paused(backend_pid: int) -> None:
    def waiting() -> bool:
        with connection.cursor() as cursor:
            if connection.vendor == "mysql":
                cursor.execute(
                    "SELECT 1 FROM information_schema.PROCESSLIST "
                    "WHERE id = %s AND state = 'User lock'",
                    [backend_pid],
                )
            else:
                cursor.execute(
                    "SELECT 1 FROM pg_locks "
                    "WHERE pid = %s AND locktype = 'advisory' AND NOT granted",
                    [backend_pid],
                )
            return cursor.fetchone() is not None

    wait_for(waiting, message="the claim to pause inside its statement")


def waiting_for_a_row_lock(backend_pid: int | None = None) -> bool:
    """Whether the session ``backend_pid`` (or, if None, any session of this database) waits
    for a row lock: PostgreSQL's ``pg_locks``, InnoDB's transactions in ``LOCK WAIT``."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(
                "SELECT 1 FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT' "
                "AND (%s IS NULL OR trx_mysql_thread_id = %s)",
                [backend_pid, backend_pid],
            )
            return cursor.fetchone() is not None
        cursor.execute(
            "SELECT 1 FROM pg_locks JOIN pg_stat_activity AS session USING (pid) "
            "WHERE NOT granted AND locktype IN ('transactionid', 'tuple') "
            "AND session.datname = current_database() AND (%s::integer IS NULL OR pid = %s)",
            [backend_pid, backend_pid],
        )
        return cursor.fetchone() is not None


class LockWaiter(threading.Thread):
    """``work()`` on a connection of its own, expected to wait for a row lock another
    transaction holds (through PgBouncer too: it is found by what it waits for, not by its
    session)."""

    def __init__(self, work) -> None:
        super().__init__(daemon=True)
        self.work = work
        self.returned: object = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.returned = self.work()
        except BaseException as error:  # noqa: BLE001 - reported by result()
            self.error = error
        finally:
            connections.close_all()

    def waits_for_a_row_lock(self) -> None:
        """Return once it waits for a row lock (the only session of the test that may)."""
        wait_for(
            lambda: waiting_for_a_row_lock() or not self.is_alive(),
            message="it to wait for a row lock",
        )
        assert self.is_alive(), f"it did not wait for the row lock: {self.error or self.returned}"

    def result(self, timeout: float = 10.0) -> object:
        self.join(timeout)
        assert not self.is_alive(), "it did not finish"
        if self.error:
            raise self.error
        return self.returned


def release(control) -> None:
    with control.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute(f"SELECT RELEASE_LOCK('stalwart_pause_{PAUSE_LOCK}')")
        else:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [PAUSE_LOCK])


def test_a_row_locked_by_another_transaction_is_skipped_not_waited_on(vendor):
    row_locks(vendor, "SQLite has no row locks: a writer waits for the database lock instead")
    high = tasks.add.using(priority=10).enqueue(1, 1)
    low = tasks.add.enqueue(2, 2)
    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute("SELECT id FROM stalwart_job WHERE id = %s FOR UPDATE", [high.id])
        # Had the claim waited on the lock, its lock timeout would raise instead of returning.
        first = claim(owner=1, limit=2)
        assert [str(job.id) for job in first] == [low.id]
        other.rollback()
    finally:
        other.close()
    second = claim(owner=2, limit=2)
    assert [str(job.id) for job in second] == [high.id]
    assert claim(owner=3, limit=2) == []


def test_two_claims_at_the_same_instant_never_share_a_job(pause_trigger):
    enqueue_many(tasks.noop, [Call() for _ in range(10)])
    paused = ClaimThread(owner=1, limit=4, paused=True)
    paused.start()
    wait_until_paused(wait_for(lambda: paused.backend_pid, message="the claim to start"))
    # The paused claim holds a row lock on the job it is updating (its locking subquery
    # feeds the update row by row); this claim must skip that job, not wait for it.
    concurrent = ClaimThread(owner=2, limit=10)
    concurrent.start()
    others = concurrent.result()
    assert 6 <= len(others) <= 9
    release(pause_trigger)
    mine = paused.result()
    # Resumed, the paused claim skips what the other took: it never returns a taken job.
    assert len(mine) + len(others) == 10
    assert {job.id for job in mine}.isdisjoint({job.id for job in others})
    owners = dict(Job.objects.values_list("id", "owner"))
    assert all(owners[job.id] == 1 for job in mine)
    assert all(owners[job.id] == 2 for job in others)


def test_rows_committed_during_a_claim_are_not_returned_by_it(pause_trigger):
    before = enqueue_many(tasks.noop, [Call() for _ in range(3)])
    paused = ClaimThread(owner=1, limit=5, paused=True)
    paused.start()
    wait_until_paused(wait_for(lambda: paused.backend_pid, message="the claim to start"))
    # New, more urgent jobs are committed while the claim is between its lock and its update.
    during = enqueue_many(tasks.noop.using(priority=100), [Call() for _ in range(5)])
    release(pause_trigger)
    claimed = paused.result()
    assert sorted(str(job.id) for job in claimed) == sorted(result.id for result in before)
    statuses = dict(Job.objects.values_list("id", "status"))
    assert all(statuses[job.id] == "running" for job in claimed)
    assert all(
        Job.objects.get(pk=result.id).status == "ready"
        and Job.objects.get(pk=result.id).owner is None
        for result in during
    )


def test_many_threads_claiming_at_once_get_disjoint_jobs():
    enqueue_many(tasks.noop, [Call() for _ in range(300)])
    threads = [ClaimThread(owner=owner, limit=25) for owner in range(1, 9)]
    for thread in threads:
        thread.start()
    results = [thread.result(timeout=30) for thread in threads]
    ids = [job.id for claimed in results for job in claimed]
    assert len(ids) == len(set(ids)) == 200
    for owner, claimed in enumerate(results, start=1):
        assert all(Job.objects.get(pk=job.id).owner == owner for job in claimed)


def test_sqlite_claims_made_during_a_write_see_its_changes(vendor):
    if vendor != "sqlite":
        pytest.skip("PostgreSQL's row-lock races are covered above")
    enqueue_many(tasks.noop, [Call() for _ in range(6)])
    writer = connections.create_connection("default")
    try:
        writer.set_autocommit(False)
        with writer.cursor() as cursor:
            # Another process claims three jobs in an open write transaction.
            cursor.execute(
                "UPDATE stalwart_job SET status = 'running', owner = 99 WHERE id IN "
                "(SELECT id FROM stalwart_job ORDER BY id LIMIT 3)"
            )
        waiting = ClaimThread(owner=1, limit=10)
        waiting.start()
        # Wherever the claim is (not yet begun, or waiting for the write lock), it may not
        # read around the open write: it sees the claimed rows once they are committed.
        writer.commit()
        claimed = waiting.result()
    finally:
        writer.close()
    assert len(claimed) == 3
    assert not {job.id for job in claimed} & set(
        Job.objects.filter(owner=99).values_list("id", flat=True)
    )


def test_a_prune_racing_a_claim_still_releases_what_the_claim_took(pause_trigger):
    from datetime import timedelta

    from django.db.models import F

    from stalwart.models import Process
    from stalwart.processes.registry import prune_dead_processes

    enqueue_many(tasks.noop, [Call() for _ in range(3)])
    Process.objects.filter(pk=1).update(
        last_heartbeat_at=F("last_heartbeat_at") - timedelta(minutes=5)
    )
    paused = ClaimThread(owner=1, limit=3, paused=True)
    paused.start()
    wait_until_paused(wait_for(lambda: paused.backend_pid, message="the claim to start"))
    # The claim holds a share lock on its process row: the prune must wait for it...
    pruner = LockWaiter(lambda: prune_dead_processes("default", threshold=60, exclude=None))
    pruner.start()
    pruner.waits_for_a_row_lock()
    release(pause_trigger)
    claimed = paused.result()
    pruned = pruner.result()
    # ...and then it sees the claimed jobs and releases them: none is left running.
    assert len(claimed) >= 1
    assert [gone.id for gone in pruned] == [1]
    assert {released.id for released in pruned[0].released} == {job.id for job in claimed}
    assert not Job.objects.filter(status="running").exists()


def test_a_reap_racing_a_claim_still_releases_what_the_claim_took(pause_trigger):
    from stalwart.models import Process
    from stalwart.processes.registry import remove_reaped_child

    enqueue_many(tasks.noop, [Call() for _ in range(2)])
    Process.objects.filter(pk=1).update(supervisor=99, pid=424242)
    paused = ClaimThread(owner=1, limit=2, paused=True)
    paused.start()
    wait_until_paused(wait_for(lambda: paused.backend_pid, message="the claim to start"))
    # The child was SIGKILLed mid-claim; the server commits the claim anyway. The reap must
    # see what the claim took, however the two interleave.
    reaper = LockWaiter(
        lambda: remove_reaped_child(
            "default", supervisors=[99], pid=424242, cause="died: it was killed by SIGKILL"
        )
    )
    reaper.start()
    reaper.waits_for_a_row_lock()  # for the claim to commit
    release(pause_trigger)
    claimed = paused.result()
    gone = reaper.result()
    assert len(claimed) >= 1
    assert {job.id for job in gone[0].released} == {job.id for job in claimed}
    assert not Job.objects.filter(status="running").exists()


def test_enqueueing_a_keyed_job_takes_no_lock_in_the_callers_transaction(vendor):
    row_locks(vendor, "SQLite's single writer serialises transactions anyway")
    from django.db import transaction

    from stalwart.models import Job

    opened = threading.Event()
    finish = threading.Event()
    gave_up = threading.Event()

    def long_transaction() -> None:
        try:
            with transaction.atomic():
                tasks.one_at_a_time.enqueue("shared-key")
                opened.set()
                if not finish.wait(10):
                    gave_up.set()  # and commits: whoever waited on it goes on
        finally:
            connections.close_all()

    holder = threading.Thread(target=long_transaction)
    holder.start()
    try:
        assert opened.wait(10)
        other = tasks.one_at_a_time.enqueue("shared-key")
        # Handing out the key's slots waits for nobody either: had the enqueue waited for
        # the holder, it would have gone on only once the holder gave up and committed.
        assert Job.objects.get(pk=other.id).status == "ready"
        assert not gave_up.is_set()
    finally:
        finish.set()
        holder.join(10)
    assert Job.objects.filter(concurrency_key__endswith=":shared-key").count() == 2
