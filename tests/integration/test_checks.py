"""Stalwart's system checks, as ``manage.py check`` runs them."""

from dataclasses import replace
from types import SimpleNamespace

import pytest
from django.core import checks
from django.db import connections
from django.test import override_settings

from stalwart.checks import check_isolation, check_pool, check_pooler

pytestmark = pytest.mark.django_db  # Django's model checks ask the database what it supports


def stalwart_messages() -> list[checks.CheckMessage]:
    return [message for message in checks.run_checks() if message.id.startswith("stalwart.")]


def test_use_tz_false_is_an_error_that_says_why_and_how_to_fix_it():
    with override_settings(USE_TZ=False):
        messages = [message for message in stalwart_messages() if message.id == "stalwart.E003"]
    # Once for the project, however many Stalwart backends TASKS has.
    assert len(messages) == 1
    error = messages[0]
    assert error.level == checks.ERROR
    assert "USE_TZ = True" in error.msg
    assert "database clock in UTC" in error.msg
    assert "prune live processes" in error.msg
    assert error.hint == "Set USE_TZ = True in your settings (Django's default)."


def test_use_tz_true_passes():
    assert [message.id for message in stalwart_messages() if message.is_serious()] == []


def test_without_a_stalwart_backend_the_setting_is_none_of_stalwarts_business():
    immediate = {"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}
    with override_settings(USE_TZ=False, TASKS=immediate):
        assert "stalwart.E003" not in [message.id for message in stalwart_messages()]


def pooled(pool: object, vendor: str = "postgresql") -> SimpleNamespace:
    """A stand-in for a connection whose DATABASES entry has OPTIONS['pool']."""
    return SimpleNamespace(vendor=vendor, settings_dict={"OPTIONS": {"pool": pool}})


def test_a_connection_pool_smaller_than_a_worker_needs_is_a_warning(backend):
    assert max(worker.threads for worker in backend.config.workers) == 5
    (warning,) = check_pool(backend, pooled(True))  # psycopg_pool's default: 4 connections
    assert warning.id == "stalwart.W005"
    assert warning.level == checks.WARNING
    assert warning.msg == (
        "DATABASES['default']['OPTIONS']['pool'] lets a process open 4 connections; a worker "
        "of TASKS['default'] has 5 job threads, each of which may hold one."
    )
    assert "'max_size' to at least 5" in warning.hint


@pytest.mark.parametrize(
    "pool", [{"max_size": 5}, {"min_size": 6}, {"min_size": 2, "max_size": 12}]
)
def test_a_connection_pool_large_enough_passes(backend, pool):
    assert check_pool(backend, pooled(pool)) == []


def test_without_a_pool_there_is_nothing_to_check(backend):
    assert check_pool(backend, pooled(None)) == []
    assert check_pool(backend, pooled(True, vendor="sqlite")) == []


def mysql_at(level: object) -> SimpleNamespace:
    """A stand-in for a MySQL connection whose DATABASES entry sets this isolation level."""
    options = {} if level is None else {"isolation_level": level}
    return SimpleNamespace(vendor="mysql", settings_dict={"OPTIONS": options})


def test_mysql_above_read_committed_is_a_warning():
    (warning,) = check_isolation("default", mysql_at("repeatable read"))
    assert warning.id == "stalwart.W006"
    assert warning.level == checks.WARNING
    assert "'repeatable read', not 'read committed'" in warning.msg
    assert "gaps" in warning.hint


@pytest.mark.parametrize("level", [None, "read committed", "READ COMMITTED"])
def test_mysql_at_read_committed_passes(level):
    assert check_isolation("default", mysql_at(level)) == []


def with_tasks_entry(**entry: object) -> dict:
    """TASKS with the test settings' default entry changed."""
    from django.conf import settings

    default = {**settings.TASKS["default"], **entry}
    return {**settings.TASKS, "default": default}


@pytest.mark.parametrize(
    ("key", "meant"), [("OPTION", "OPTIONS"), ("QUEUE", "QUEUES"), ("options", "OPTIONS")]
)
def test_a_key_of_a_tasks_entry_that_looks_like_a_typo_is_an_error(key, meant):
    with override_settings(TASKS=with_tasks_entry(**{key: {}})):
        messages = [message for message in stalwart_messages() if message.id == "stalwart.E005"]
    assert len(messages) == 1
    assert messages[0].level == checks.ERROR
    assert messages[0].msg == (
        f"TASKS['default'][{key!r}] is not a setting of a task backend, so it is ignored."
    )
    assert messages[0].hint.startswith(f"Did you mean {meant!r}?")


def test_keys_django_reads_are_no_typos():
    assert "stalwart.E005" not in [message.id for message in stalwart_messages()]


BAD_CRON = {
    "nightly": {"task": "tests.testapp.tasks.noop", "schedule": "61 * * * *"},
    "fine": {"task": "tests.testapp.tasks.noop", "schedule": "@daily"},
}


def test_a_bad_cron_expression_is_a_check_error_naming_the_entry_not_a_broken_site():
    options = {"recurring": BAD_CRON}
    with override_settings(TASKS=with_tasks_entry(OPTIONS=options)):
        from django.tasks import task_backends

        from stalwart.models import Job
        from tests.testapp import tasks

        messages = [message for message in stalwart_messages() if message.id == "stalwart.E006"]
        # The rest of the site works: the backend loads, and tasks enqueue.
        backend = task_backends["default"]
        result = tasks.add.enqueue(1, 2)
        assert Job.objects.filter(pk=result.id).exists()
    assert [entry.key for entry in backend.config.recurring] == ["fine"]
    assert len(messages) == 1
    assert messages[0].level == checks.ERROR
    assert messages[0].msg.startswith(
        "TASKS['default']['OPTIONS']['recurring']['nightly'] has an invalid 'schedule' '61 * * * *'"
    )
    assert "The scheduler ('queue supervise') will not start" in messages[0].hint


def behind_a_pooler(backend, **options: object) -> SimpleNamespace:
    """The backend with these OPTIONS (``transaction_pooler``, ``listen_database``), whatever
    the test settings say."""
    options = {"transaction_pooler": False, "listen_database": None, **options}
    return SimpleNamespace(alias=backend.alias, config=replace(backend.config, **options))


def pooled_connection(**settings: object) -> SimpleNamespace:
    """A stand-in for the queue's connection through PgBouncer: the test database's name, on
    another host, set up as the how-to asks unless ``settings`` say otherwise."""
    return SimpleNamespace(
        vendor="postgresql",
        settings_dict={
            "NAME": connections["default"].settings_dict["NAME"],
            "HOST": "pgbouncer.internal",
            "PORT": "6432",
            "DISABLE_SERVER_SIDE_CURSORS": True,
            "OPTIONS": {},
            **settings,
        },
    )


def test_behind_a_transaction_pooler_set_up_as_documented_nothing_is_reported(backend, vendor):
    if vendor != "postgresql":
        pytest.skip("listen_database must be a PostgreSQL database")
    config = behind_a_pooler(backend, transaction_pooler=True, listen_database="default")
    assert check_pooler(config, pooled_connection()) == []


def test_settings_that_cannot_work_behind_a_transaction_pooler_are_warnings(backend):
    config = behind_a_pooler(backend, transaction_pooler=True)
    connection = pooled_connection(
        OPTIONS={"prepare_threshold": 5}, DISABLE_SERVER_SIDE_CURSORS=False
    )
    prepared, cursors = check_pooler(config, connection)
    assert (prepared.id, prepared.level) == ("stalwart.W010", checks.WARNING)
    assert "['prepare_threshold'] is set" in prepared.msg
    assert "PgBouncer 1.21 or later" in prepared.hint
    assert (cursors.id, cursors.level) == ("stalwart.W011", checks.WARNING)
    assert "DISABLE_SERVER_SIDE_CURSORS'] = True" in cursors.hint
    # Without transaction_pooler, they are none of Stalwart's business.
    assert check_pooler(behind_a_pooler(backend), connection) == []


def test_a_listen_database_that_is_not_in_databases_is_an_error(backend):
    config = behind_a_pooler(backend, transaction_pooler=True, listen_database="nowhere")
    (error,) = check_pooler(config, pooled_connection())
    assert error.id == "stalwart.E010"
    assert error.msg == (
        "TASKS['default']['OPTIONS']['listen_database'] is 'nowhere', which is not in DATABASES."
    )


def test_a_listen_database_on_another_database_would_hear_nothing(backend):
    config = behind_a_pooler(backend, transaction_pooler=True, listen_database="default")
    (error,) = check_pooler(config, pooled_connection(NAME="elsewhere"))
    assert error.id == "stalwart.E011"
    assert "would hear no notification" in error.msg


def test_a_listen_database_through_the_pooler_itself_is_an_error(backend, vendor):
    if vendor != "postgresql":
        pytest.skip("listen_database must be a PostgreSQL database")
    config = behind_a_pooler(backend, transaction_pooler=True, listen_database="default")
    messages = check_pooler(config, connections["default"])
    (error,) = [message for message in messages if message.is_serious()]
    assert error.id == "stalwart.E012"
    assert "through the pooler" in error.msg
