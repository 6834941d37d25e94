"""Which modules a worker process takes tasks from: the project's, never a row's.

The workers here are real ``queue work`` processes, so what they import is what their own
start-up and the task catalog import, not what this test process happens to have loaded.
"""

import json
import signal

import pytest
from django.db import connections
from django.tasks import TaskResultStatus

from stalwart.models import Job
from tests.helpers import Child, child_env, wait_for
from tests.testapp import outside_tasks, tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)

ZEN = "Beautiful is better than ugly"


def drain_in_a_process(**env: str) -> str:
    """Run ``queue work --stop-when-empty`` to the end; return what it printed. A task the
    worker cannot find fails at once (no grace for another release that might have it)."""
    env.setdefault("STALWART_TASK_NOT_FOUND_GRACE", "0")
    connections.close_all()
    with Child(
        "queue",
        "work",
        "--stop-when-empty",
        "--threads",
        "1",
        "--poll-interval",
        "0.05",
        env=child_env(**env),
    ) as worker:
        assert worker.wait(timeout=60) == 0, worker.output
    return worker.output


def error_of(job_id: str) -> tuple[str, str, str]:
    job = Job.objects.get(pk=job_id)
    return job.status, job.errors[-1]["exception_class_path"], job.errors[-1]["traceback"]


def test_a_row_naming_any_module_is_failed_without_importing_that_module():
    planted = tasks.noop.enqueue()
    Job.objects.filter(pk=planted.id).update(task_path="this.s")
    fine = tasks.add.enqueue(2, 3)
    output = drain_in_a_process()
    assert ZEN not in output  # importing 'this' prints the Zen of Python
    status, error, traceback = error_of(planted.id)
    assert (status, error) == ("failed", "stalwart.exceptions.TaskNotFound")
    assert "'this.s' is in module 'this', which is not one of the project's task modules" in (
        traceback
    )
    fine.refresh()
    assert fine.return_value == 5  # the app's own tasks module was loaded by the worker


def test_a_task_outside_the_task_modules_fails_until_its_module_is_listed():
    refused = outside_tasks.record_outside.enqueue()
    drain_in_a_process()
    status, error, traceback = error_of(refused.id)
    assert (status, error) == ("failed", "stalwart.exceptions.TaskNotFound")
    assert "Add 'tests.testapp.outside_tasks' to TASKS[...]['OPTIONS']['task_modules']" in traceback
    assert not Execution.objects.filter(label="outside").exists()

    accepted = outside_tasks.record_outside.enqueue()
    drain_in_a_process(STALWART_TASK_MODULES=json.dumps(["tests.testapp.outside_tasks"]))
    accepted.refresh()
    assert accepted.status == TaskResultStatus.SUCCESSFUL
    assert Execution.objects.filter(label="outside", job_id=accepted.id).count() == 1


def test_a_task_a_worker_lacks_waits_for_a_worker_that_has_it_as_in_a_rolling_deploy():
    job = outside_tasks.record_outside.enqueue()
    connections.close_all()
    # A worker still on the old release (the module is not one of its task modules)...
    with Child(
        "queue", "work", "--threads", "1", env=child_env(STALWART_TASK_NOT_FOUND_GRACE="600")
    ) as old:
        # ...gives the job back for later, neither failed nor charged, and says so once.
        wait_for(
            lambda: "action=task_not_found_deferred" in old.output,
            timeout=30,
            message="the old worker to defer the job",
        )
        row = Job.objects.get(pk=job.id)
        assert (row.status, row.errors, row.interruptions) == ("scheduled", [], [])
        old.signal(signal.SIGTERM)
        assert old.wait(timeout=60) == 0, old.output
    assert old.output.count("action=task_not_found_deferred") == 1, old.output
    assert not Execution.objects.filter(label="outside").exists()
    # The new release's worker has it, and runs it.
    drain_in_a_process(STALWART_TASK_MODULES=json.dumps(["tests.testapp.outside_tasks"]))
    job.refresh()
    assert job.status == TaskResultStatus.SUCCESSFUL
    row = Job.objects.get(pk=job.id)
    assert (row.errors, row.interruptions) == ([], [])
    assert Execution.objects.filter(label="outside", job_id=job.id).count() == 1


def test_queue_check_reports_a_task_module_that_cannot_be_imported():
    connections.close_all()
    env = child_env(STALWART_TASK_MODULES=json.dumps(["tests.testapp.missing_module"]))
    with Child("queue", "check", env=env) as check:
        assert check.wait(timeout=30) == 1, check.output
    assert (
        "error: TASKS['default']['OPTIONS']['task_modules'][0]: module "
        "'tests.testapp.missing_module' cannot be imported: ModuleNotFoundError"
    ) in check.output
