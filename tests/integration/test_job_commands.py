"""``queue jobs``, ``queue show`` and ``queue cancel``, as a person runs them."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from stalwart.jobs import JobStore
from stalwart.models import Job
from stalwart.queues import QueueSelector
from tests.helpers import Child, child_env, drain, register_processes
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def queue(*args: str) -> str:
    out = StringIO()
    call_command("queue", *args, stdout=out)
    return out.getvalue()


def test_jobs_lists_each_state_in_its_order_with_filters_and_pages():
    low = tasks.add.using(priority=-5).enqueue(1, 1)
    high = tasks.add.using(priority=50).enqueue(2, 2)
    other = tasks.noop.using(queue_name="other").enqueue()
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(3, 3)
    listed = json.loads(queue("jobs", "--state", "ready", "--json"))
    assert [row["id"] for row in listed["jobs"]] == [high.id, other.id, low.id]
    assert listed["count"] == 3
    assert "args" not in listed["jobs"][0]  # lists never show arguments
    by_queue = json.loads(queue("jobs", "--queue", "other", "--json"))
    assert [row["id"] for row in by_queue["jobs"]] == [other.id]
    by_task = json.loads(queue("jobs", "--task", "tests.testapp.tasks.add", "--json"))
    assert [row["id"] for row in by_task["jobs"]] == [later.id, high.id, low.id]  # newest first
    first = json.loads(queue("jobs", "--state", "ready", "--limit", "2", "--json"))
    assert [row["id"] for row in first["jobs"]] == [high.id, other.id]
    rest = json.loads(queue("jobs", "--state", "ready", "--after", first["next"], "--json"))
    assert [row["id"] for row in rest["jobs"]] == [low.id]
    assert rest["next"] is None
    table = queue("jobs", "--state", "scheduled")
    assert later.id in table
    assert "1 shown of 1 matching." in table


def test_jobs_refuses_bad_input_with_a_clear_error():
    with pytest.raises(CommandError, match="invalid choice: 'lost'"):
        queue("jobs", "--state", "lost")
    with pytest.raises(CommandError, match="is not a page cursor"):
        queue("jobs", "--after", "garbage")
    with pytest.raises(CommandError, match="is not a date or time"):
        queue("jobs", "--since", "yesterday")
    with pytest.raises(CommandError, match="must be at most 1000"):
        queue("jobs", "--limit", "5000")
    assert queue("jobs", "--state", "failed") == "No jobs match.\n"


def test_show_prints_every_attempts_traceback_and_the_arguments():
    result = tasks.always_fails.enqueue()
    drain()
    shown = queue("show", result.id)
    assert "status:                failed" in shown
    assert shown.count(": failed: builtins.ConnectionError") == 3
    assert "ConnectionError: never works" in shown
    data = json.loads(queue("show", result.id, "--json"))
    assert [error["attempt"] for error in data["errors"]] == [1, 2, 3]
    assert "Traceback" in data["errors"][0]["traceback"]
    assert data["task_result_status"] == "FAILED"
    assert data["args"] == []
    assert "args" not in json.loads(queue("show", result.id, "--json", "--no-arguments"))


def test_show_says_why_each_attempt_ended_interrupted_failed_or_successful():
    store = JobStore("default")
    register_processes(71)
    result = tasks.add.enqueue(1, 2)
    (job,) = store.claim(owner=71, worker_name="w71", selector=QueueSelector.parse("*"), limit=1)
    store.release(owner=71, jobs=[(job.id, job.attempt)], cause="its worker stopped", process="w71")
    drain()
    shown = queue("show", result.id)
    assert "Attempt 1 (" in shown
    assert ", w71): interrupted: its worker stopped" in shown
    assert ": successful" in shown.split("Attempt 2 (")[1]
    data = json.loads(queue("show", result.id, "--json"))
    assert [(a["attempt"], a["ended"]) for a in data["attempts"]] == [
        (1, "interrupted"),
        (2, "successful"),
    ]
    assert (data["interruptions"], data["errors"]) == (1, [])


def test_show_refuses_a_missing_job_and_what_is_not_an_id():
    with pytest.raises(CommandError, match="No job has the id"):
        queue("show", "01939f2e-0000-7000-8000-000000000000")
    with pytest.raises(CommandError, match="'nope' is not a job id"):
        queue("show", "nope")


def test_cancel_counts_like_retry_and_discard():
    waiting = [tasks.add.enqueue(n, n) for n in range(3)]
    Job.objects.filter(pk=waiting[0].id).update(status="running", owner=1, attempt=1)
    dry = queue("cancel", "--task", "tests.testapp.tasks.add", "--dry-run")
    assert dry == (
        "Would cancel 2 jobs waiting, and ask 1 job running to stop (dry run: nothing changed).\n"
    )
    assert queue("cancel", "--all", "--batch-size", "1").startswith(
        "Cancelled 2 jobs waiting; asked 1 job running to stop"
    )
    assert Job.objects.filter(status="cancelled").count() == 2
    with pytest.raises(CommandError, match="Say which jobs"):
        queue("cancel")


def test_the_commands_exit_non_zero_on_bad_input_from_a_shell():
    missing = Child("queue", "show", "01939f2e-0000-7000-8000-000000000000", env=child_env())
    assert missing.wait(timeout=60) == 1
    assert "No job has the id" in missing.output
    wrong = Child("queue", "jobs", "--state", "lost", env=child_env())
    assert wrong.wait(timeout=60) == 2
    assert "invalid choice: 'lost'" in wrong.output
