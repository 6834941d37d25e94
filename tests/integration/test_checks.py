"""Stalwart's system checks, as ``manage.py check`` runs them."""

import pytest
from django.core import checks
from django.test import override_settings

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
