"""The queue's PostgreSQL sessions number their prepared statements from a start of their
own, through psycopg's private state; should that state ever change shape, they prepare
nothing rather than share statement names with every other client of a pooler."""

from types import SimpleNamespace

from stalwart.db import session
from stalwart.db.session import PREPARED_WHEN_ASKED


def connection_making(raw):
    return SimpleNamespace(get_new_connection=lambda conn_params: raw)


def test_a_session_numbers_its_statements_from_a_random_start():
    raws = [
        SimpleNamespace(_prepared=SimpleNamespace(_prepared_idx=0), prepare_threshold=1)
        for _ in range(2)
    ]
    starts = []
    for raw in raws:
        connection = connection_making(raw)
        session._statement_names_of_its_own(connection)
        made = connection.get_new_connection({})
        starts.append(made._prepared._prepared_idx)
        assert made.prepare_threshold == 1
    assert starts[0] != starts[1]
    assert all(start > 0 for start in starts)


def test_a_session_whose_psycopg_keeps_the_count_elsewhere_prepares_nothing():
    raw = SimpleNamespace(prepare_threshold=PREPARED_WHEN_ASKED)  # no _prepared at all
    connection = connection_making(raw)
    session._statement_names_of_its_own(connection)
    assert connection.get_new_connection({}).prepare_threshold is None
