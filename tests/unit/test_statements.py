"""Each database's statements are every database's (``Statements``) with that database's
concern mixins in front; a database overrides a method only in its mixin for the concern
that defines the method, so each concern reads whole in its own module."""

import inspect

import pytest

from stalwart.db.claims import Claims
from stalwart.db.dialect import Dialect
from stalwart.db.mysql import MySQLStatements
from stalwart.db.postgresql import PostgreSQLStatements
from stalwart.db.slots import PostgreSQLSlots
from stalwart.db.sqlite import SQLiteStatements
from stalwart.db.statements import Statements

DATABASES = [MySQLStatements, PostgreSQLStatements, SQLiteStatements]
CONCERNS = [*Statements.__bases__, Dialect]


def misplaced_overrides(composed: type) -> list[str]:
    """Names that ``composed`` takes from a class that does not derive from every other
    class defining them: an override that sits outside its concern (or a generic method
    that hides a database's)."""
    misplaced = []
    for name in dir(composed):
        if name.startswith("__"):
            continue
        definers = [klass for klass in composed.__mro__ if name in vars(klass)]
        if any(not issubclass(definers[0], other) for other in definers[1:]):
            misplaced.append(f"{name}: {', '.join(klass.__name__ for klass in definers)}")
    return misplaced


@pytest.mark.parametrize("composed", DATABASES, ids=lambda composed: composed.vendor)
def test_each_override_sits_in_its_concern(composed):
    assert misplaced_overrides(composed) == []


def test_an_override_outside_its_concern_is_found():
    class SlotsThatInsert(PostgreSQLSlots):
        def insert_params(self, job):
            return []

    class Misplaced(SlotsThatInsert, Statements):
        vendor = "postgresql"

    assert misplaced_overrides(Misplaced) == ["insert_params: SlotsThatInsert, Claims"]


@pytest.mark.parametrize("composed", DATABASES, ids=lambda composed: composed.vendor)
def test_a_database_lists_one_mixin_per_concern_then_every_databases_statements(composed):
    *mixins, last = composed.__bases__
    assert last is Statements
    concerns = [
        next(concern for concern in CONCERNS if issubclass(mixin, concern)) for mixin in mixins
    ]
    assert len(set(concerns)) == len(concerns)


def abstract(function) -> bool:
    return "raise NotImplementedError" in inspect.getsource(function)


@pytest.mark.parametrize("composed", DATABASES, ids=lambda composed: composed.vendor)
def test_every_step_is_written_for_every_database(composed):
    """Only PostgreSQL's dispatchers listen, so only it says when the next job is due."""
    unwritten = {
        name
        for name, function in inspect.getmembers(composed, inspect.isfunction)
        if abstract(function)
    }
    assert unwritten == (set() if composed is PostgreSQLStatements else {"next_due"})
    assert abstract(Claims.claim)  # (what is looked for is there to find)
