"""Settings Stalwart cannot run with stop the commands that run processes, before they start."""

import pytest
from django.db import connections

from stalwart.models import Process
from tests.helpers import Child, child_env

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    "command", [("work", "--stop-when-empty"), ("supervise", "--processes", "1")]
)
def test_use_tz_false_refuses_to_start_with_the_reason_and_the_fix(command):
    connections.close_all()
    with Child("queue", *command, env=child_env(STALWART_USE_TZ="false")) as child:
        status = child.wait(timeout=30)
    assert status == 1, child.output
    assert "stalwart.E003: Stalwart needs USE_TZ = True" in child.output
    assert "compared with the database clock in UTC" in child.output
    assert "Set USE_TZ = True in your settings" in child.output
    assert "Traceback" not in child.output
    assert not Process.objects.exists()
