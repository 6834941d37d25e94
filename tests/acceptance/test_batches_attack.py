"""Attacks on batches with real processes (``queue supervise``): reproducers of what
breaks on a8cb2de."""

from datetime import timedelta

import pytest
from django.utils import timezone

import stalwart
from stalwart.models import Batch as BatchRow
from stalwart.models import Job
from tests.acceptance.supervision import start_supervisor, stop
from tests.helpers import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_batch_whose_callback_is_gone_stops_the_dispatcher_for_everyone(reaped):
    """FAILS on a8cb2de: one closed batch whose callback's task no longer resolves in the
    dispatcher (renamed or removed by a deploy after the batch was made) makes every look of
    the dispatcher raise ``TaskNotFound`` from ``JobStore._finish_batch``
    (``resolve_task``, jobs.py); ``finish_batches`` runs first in ``promote_due`` and the
    dispatcher's ``step`` propagates anything but a database failure, so the dispatcher
    crashes, is restarted by its supervisor, and crashes again at its first look. A plain
    job scheduled a second later is never promoted: one bad batch stops scheduling, retries
    with backoff and dependency resolution for the whole deployment."""
    with stalwart.batch(on_finish=tasks.noop, label="made before the deploy") as poisoned:
        pass
    BatchRow.objects.filter(pk=poisoned.id).update(
        callbacks={
            "on_finish": {
                "task_path": "tests.testapp.tasks.removed_by_the_deploy",
                "queue_name": "default",
                "priority": 0,
                "args": [],
                "kwargs": {},
            }
        }
    )
    supervisor = start_supervisor("--processes", "1", "--threads", "2", children=3)
    reaped.append(supervisor)
    later = tasks.noop.using(run_after=timezone.now() + timedelta(seconds=1)).enqueue()

    try:
        wait_for(
            lambda: Job.objects.filter(pk=later.id, status="successful").exists(),
            timeout=20,
            message="a job scheduled 1 s ahead to run (the dispatcher promotes it)",
        )
    except AssertionError as error:
        stop(supervisor)
        crashes = supervisor.output.count("TaskNotFound")
        raise AssertionError(
            f"{error}; the supervisor's output names TaskNotFound {crashes} times:\n"
            + supervisor.output[-2500:]
        ) from None
    assert stop(supervisor) == 0, supervisor.output
    # Said once, by the dispatcher, which never crashed.
    assert supervisor.output.count("action=batch_callback_failed") == 1, supervisor.output
    assert "Traceback" not in supervisor.output, supervisor.output[-3000:]
    assert "action=process_exited" not in supervisor.output, supervisor.output[-3000:]
