"""The defaults Stalwart gives the connections to a queue's SQLite database, and how
DATABASES overrides them (stalwart.db.sqlite_defaults)."""

from contextlib import closing

import pytest
from django.db.backends.sqlite3.base import DatabaseWrapper

pytestmark = pytest.mark.django_db  # pytest-django's switch for opening any connection


def connect(tmp_path, options: dict, alias: str = "default") -> DatabaseWrapper:
    """A new connection to a SQLite file, as Django opens one for ``DATABASES[alias]``."""
    wrapper = DatabaseWrapper(
        {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(tmp_path / "queue.sqlite3"),
            "OPTIONS": options,
            "ATOMIC_REQUESTS": False,
            "AUTOCOMMIT": True,
            "CONN_MAX_AGE": 0,
            "CONN_HEALTH_CHECKS": False,
            "TIME_ZONE": None,
            "USER": "",
            "PASSWORD": "",
            "HOST": "",
            "PORT": "",
            "TEST": {},
        },
        alias=alias,
    )
    wrapper.connect()
    return wrapper


def pragma(wrapper: DatabaseWrapper, name: str) -> object:
    with closing(wrapper.connection.execute(f"PRAGMA {name}")) as cursor:
        return cursor.fetchone()[0]


def test_a_queue_database_without_options_is_made_fit_for_several_processes(tmp_path):
    wrapper = connect(tmp_path, {})
    try:
        assert wrapper.transaction_mode == "IMMEDIATE"
        assert pragma(wrapper, "busy_timeout") == 20_000
        assert pragma(wrapper, "journal_mode") == "wal"
        assert pragma(wrapper, "synchronous") == 1  # NORMAL
    finally:
        wrapper.close()


def test_options_in_databases_win(tmp_path):
    wrapper = connect(
        tmp_path,
        {
            "transaction_mode": "DEFERRED",
            "timeout": 3,
            "init_command": "PRAGMA journal_mode=DELETE",
        },
    )
    try:
        assert wrapper.transaction_mode == "DEFERRED"
        assert pragma(wrapper, "busy_timeout") == 3000
        assert pragma(wrapper, "journal_mode") == "delete"
    finally:
        wrapper.close()


def test_databases_that_hold_no_queue_are_left_alone(tmp_path):
    wrapper = connect(tmp_path, {}, alias="analytics")
    try:
        assert wrapper.transaction_mode is None
        assert pragma(wrapper, "journal_mode") == "delete"
    finally:
        wrapper.close()


def test_an_explicit_transaction_mode_other_than_immediate_is_a_warning(settings):
    from django.db import connections

    from stalwart.checks import check_backend

    connection = connections["default"]
    if connection.vendor != "sqlite":
        pytest.skip("a SQLite setting")
    options = connection.settings_dict["OPTIONS"]
    backend = pytest.importorskip("django.tasks").task_backends["default"]
    original = dict(options)
    try:
        options.pop("transaction_mode")
        assert "stalwart.W001" not in [message.id for message in check_backend(backend)]
        options["transaction_mode"] = "DEFERRED"
        [warning] = [message for message in check_backend(backend) if message.id == "stalwart.W001"]
    finally:
        options.clear()
        options.update(original)
    assert warning.msg == (
        "DATABASES['default'] is SQLite with OPTIONS['transaction_mode'] = 'DEFERRED', "
        "not 'IMMEDIATE'."
    )
