"""Leases: contention is a return value, never an exception, never a wait."""

from datetime import timedelta

import pytest
from django.db import connection, connections, transaction
from django.db.models import F

from stalwart import leases
from stalwart.db import statements_for
from stalwart.models import Lease
from tests.helpers import at_once, row_locks, transaction_lock_timeout

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_lease_has_one_holder_until_it_expires_or_is_released():
    assert leases.try_acquire("chore", "a", 60, database="default") is True
    assert leases.try_acquire("chore", "b", 60, database="default") is False
    assert leases.try_acquire("chore", "a", 60, database="default") is True  # renewal
    Lease.objects.filter(name="chore").update(expires_at=F("expires_at") - timedelta(hours=1))
    assert leases.try_acquire("chore", "b", 60, database="default") is True  # a dead holder's
    assert leases.release("chore", "a", database="default") is False  # not a's any more
    assert leases.release("chore", "b", database="default") is True
    assert leases.try_acquire("chore", "a", 60, database="default") is True
    assert Lease.objects.get(name="chore").holder == "a"


@pytest.mark.parametrize("round_number", range(8))
def test_racers_for_a_new_lease_get_one_winner_and_no_exception(round_number):
    racers = 6
    usable_after: list[int] = []

    def race(number: int) -> bool:
        with transaction.atomic():
            won = leases.try_acquire(
                f"new-{round_number}", f"racer-{number}", 60, database="default"
            )
            # Win or lose, the transaction is still usable.
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
                usable_after.append(cursor.fetchone()[0])
        return won

    outcomes = at_once(racers, race)
    assert sorted(outcomes) == [False] * (racers - 1) + [True]
    assert usable_after == [1] * racers
    assert Lease.objects.filter(name=f"new-{round_number}").count() == 1


def test_a_lease_row_locked_by_another_transaction_is_contention_not_a_wait(vendor):
    row_locks(vendor, "SQLite has no row locks; its single writer makes the upsert the whole CAS")
    leases.try_acquire("locked", "old", 60, database="default")
    Lease.objects.filter(name="locked").update(expires_at=F("expires_at") - timedelta(hours=1))
    other = connections.create_connection("default")
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute("SELECT * FROM stalwart_lease WHERE name = 'locked' FOR UPDATE")
        with transaction_lock_timeout(2):  # a wait would raise, not return False
            assert leases.try_acquire("locked", "new", 60, database="default") is False
            with connection.cursor() as cursor:
                cursor.execute("SELECT 1")
        other.rollback()
    finally:
        other.close()
    assert leases.try_acquire("locked", "new", 60, database="default") is True


def test_a_database_failure_is_raised_not_reported_as_contention(vendor):
    from django.db import DatabaseError

    if vendor == "mysql":
        # DDL commits at once on MySQL: the table goes away for a moment, and comes back.
        with connection.cursor() as cursor:
            cursor.execute("RENAME TABLE stalwart_lease TO stalwart_lease_away")
        try:
            with pytest.raises(DatabaseError):
                leases.try_acquire("gone", "a", 60, database="default")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RENAME TABLE stalwart_lease_away TO stalwart_lease")
        assert leases.try_acquire("gone", "a", 60, database="default") is True
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE stalwart_lease")
        with pytest.raises(DatabaseError):
            leases.try_acquire("gone", "a", 60, database="default")
        transaction.set_rollback(True)
    assert leases.try_acquire("gone", "a", 60, database="default") is True


def survey_for_prune(holder: str) -> tuple[list, bool] | None:
    with connection.cursor() as cursor:
        return statements_for(connection).survey_for_prune(
            cursor, lease="prune", holder=holder, ttl=60, threshold=60, exclude=None
        )


@pytest.mark.parametrize("lease", ["new", "lapsed"] * 3)
def test_racers_for_the_pruners_survey_get_one_pruner(lease):
    """The pruner's survey takes the lease in the statement that looks for work: of
    supervisors that ask at once, for a lease never taken or one whose holder died, one
    alone is told the work, the others None (not an empty survey, not an exception)."""
    if lease == "lapsed":
        assert survey_for_prune("dead-holder") == ([], connection.vendor != "postgresql")
        Lease.objects.filter(name="prune").update(expires_at=F("expires_at") - timedelta(hours=1))
    racers = 6
    outcomes = at_once(racers, lambda number: survey_for_prune(f"racer-{number}"))
    assert sorted(outcomes, key=lambda outcome: outcome is not None) == [None] * (racers - 1) + [
        ([], connection.vendor != "postgresql")
    ]
    winner = Lease.objects.get(name="prune").holder
    assert survey_for_prune(winner) is not None  # it renews
    assert survey_for_prune("dead-holder") is None
