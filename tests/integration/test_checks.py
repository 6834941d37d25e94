"""Stalwart's system checks, as ``manage.py check`` runs them."""

from types import SimpleNamespace

import pytest
from django.core import checks
from django.test import override_settings

from stalwart.checks import check_isolation, check_pool

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
