"""Operations: check, status (and its health probe), processes, enqueue, memory recycling,
help and errors for every subcommand, and what the logs say."""

import json
import re
import signal
import socket
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, connections
from django.db.models import Count, F
from django.db.models.functions import Now
from django.utils import timezone

from stalwart import Call, enqueue_many
from stalwart.cli import SUBCOMMANDS
from stalwart.models import Job, Process
from stalwart.processes.registry import Registration
from tests.helpers import Child, child_env, wait_for
from tests.processes import start_supervisor
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = pytest.mark.django_db(transaction=True)


def run(*args: str, **env: str) -> Child:
    connections.close_all()
    child = Child("queue", *args, env=child_env(**env))
    child.wait(timeout=60)
    return child


# -- check ---------------------------------------------------------------------------------


def test_check_passes_on_a_healthy_setup():
    child = run("check")
    assert child.process.returncode == 0, child.output
    assert "OK: TASKS['default'] on DATABASES['default']" in child.output


def test_check_names_missing_migrations_or_an_unreachable_database(tmp_path: Path):
    if connection.vendor == "sqlite":
        empty = tmp_path / "empty.sqlite3"
        empty.touch()
        child = run("check", STALWART_DB_NAME=str(empty))
        expected = "DATABASES['default'] lacks migrations: stalwart.0001_initial"
    else:
        child = run("check", STALWART_DB_NAME="stalwart_no_such_database")
        expected = (
            "DATABASES['default'] names the database 'stalwart_no_such_database', which does "
            "not exist on the server"
        )
    assert child.process.returncode == 1
    assert f"error: {expected}" in child.output
    assert "Traceback" not in child.output


def test_check_names_each_broken_recurring_entry():
    recurring = json.dumps(
        {
            "gone": {"task": "tests.testapp.tasks.nope", "schedule": "@daily"},
            "fine": {"task": "tests.testapp.tasks.noop", "schedule": "@daily"},
        }
    )
    child = run("check", STALWART_RECURRING=recurring)
    assert child.process.returncode == 1
    assert "error: stalwart.W004: TASKS['default']['OPTIONS']['recurring']['gone']:" in (
        child.output
    )
    assert child.output.count("['gone']") == 1, child.output  # as an error, not twice
    assert "'fine'" not in child.output


# -- status --------------------------------------------------------------------------------


def test_status_check_fails_for_a_queue_with_ready_jobs_and_no_worker():
    tasks.add.using(queue_name="orphans").enqueue(1, 2)
    child = run("status", "--check")
    assert child.process.returncode == 1
    assert "unhealthy: queue 'orphans' has 1 ready job(s) and no live worker serves it" in (
        child.output
    )


def test_status_check_fails_for_a_dead_process_row():
    dead = Registration("default", kind="worker", name="worker-ghost-1", supervisor=None)
    dead.register({"queues": "*", "threads": 2, "busy": 0})
    Process.objects.filter(pk=dead.id).update(
        last_heartbeat_at=F("last_heartbeat_at") - timedelta(minutes=10)
    )
    child = run("status", "--check")
    assert child.process.returncode == 1
    assert "worker worker-ghost-1" in child.output
    assert "sent no heartbeat for" in child.output
    # Pruned, it is gone and the probe passes again.
    pruned = run("processes", "--prune")
    assert pruned.process.returncode == 0
    assert "Pruned worker worker-ghost-1" in pruned.output
    assert run("status", "--check").process.returncode == 0


def test_status_check_passes_with_live_workers():
    with start_supervisor("--no-scheduler", "--processes", "1", workers=1) as supervisor:
        tasks.add.enqueue(1, 1)
        wait_for(lambda: Job.objects.filter(status="successful").exists(), message="a job")
        healthy = run("status", "--check")
        assert healthy.process.returncode == 0, healthy.output
        assert "alive" in healthy.output
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=40) == 0


def test_status_check_this_host_judges_only_the_hosts_own_processes():
    """A container's liveness probe: this host's supervisor alive passes, whatever other
    hosts and the queues look like; the silent rows of an earlier life of the host (a
    container restarted under its name) do not fail it."""
    here = socket.gethostname()
    elsewhere = Registration("default", kind="worker", name="worker-elsewhere-1", supervisor=None)
    elsewhere.register({"queues": "*", "threads": 1, "busy": 0})
    earlier = Registration(
        "default", kind="supervisor", name="supervisor-earlier-1", supervisor=None
    )
    earlier.register({})
    Process.objects.filter(pk__in=[elsewhere.id, earlier.id]).update(
        last_heartbeat_at=F("last_heartbeat_at") - timedelta(minutes=10)
    )
    Process.objects.filter(pk=elsewhere.id).update(hostname="another-host")
    tasks.add.using(queue_name="orphans").enqueue(1, 2)
    alone = run("status", "--check", "--this-host")
    assert alone.process.returncode == 1
    assert f"unhealthy: no live supervisor or worker of host {here!r} is registered" in (
        alone.output
    )
    with start_supervisor(
        "--no-scheduler", "--processes", "1", "--queues", "default", workers=1
    ) as supervisor:
        cluster = run("status", "--check")
        assert cluster.process.returncode == 1  # the orphans, the silent rows
        local = run("status", "--check", "--this-host")
        assert local.process.returncode == 0, local.output
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=40) == 0
    refused = run("status", "--check", "--this-host", "--max-age", "60")
    assert refused.process.returncode == 1
    assert "--max-age judges queues, which --this-host leaves out" in refused.output


def test_status_check_flags_a_ready_job_older_than_max_age_unless_its_queue_is_paused():
    # A live worker serves every queue (its row says so), yet one job has waited an hour.
    Registration("default", kind="worker", name="worker-busy-1", supervisor=None).register(
        {"queues": "*", "threads": 1, "busy": 1}
    )
    tasks.add.using(queue_name="slow").enqueue(1, 1)
    Job.objects.update(available_at=F("available_at") - timedelta(hours=1))

    def check(*args: str) -> Child:
        # The worker stays alive: it beats before each look, and the command judges it with
        # a threshold no loaded machine's start-up of a command reaches.
        Process.objects.update(last_heartbeat_at=Now())
        child = run("status", "--check", *args, STALWART_ALIVE="120")
        assert "no live worker" not in child.output, child.output
        return child

    no_limit = check()
    assert no_limit.process.returncode == 0, no_limit.output  # no age limit given
    stale = check("--max-age", "60")
    assert stale.process.returncode == 1
    assert "queue 'slow': the oldest ready job has waited 36" in stale.output
    run("pause", "slow")
    assert check("--max-age", "60").process.returncode == 0


def test_status_json_has_the_figures_the_table_shows():
    enqueue_many(tasks.add.using(queue_name="mail"), [Call(1, 2)] * 3)
    tasks.fail.using(queue_name="mail").enqueue()
    Job.objects.filter(task_path="tests.testapp.tasks.fail").update(status="failed")
    tasks.add.using(queue_name="mail", run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    as_json = json.loads(run("status", "--json").output)
    table = run("status").output
    (mail,) = [queue for queue in as_json["queues"] if queue["name"] == "mail"]
    assert (mail["ready"], mail["scheduled"], mail["failed"], mail["served_by"]) == (3, 1, 1, 0)
    row = next(line.split() for line in table.splitlines() if line.startswith("mail "))
    assert row[:6] == ["mail", "3", "1", "0", "0", "1"]
    assert as_json["problems"] == ["queue 'mail' has 3 ready job(s) and no live worker serves it"]
    assert "database_time" in as_json


# -- enqueue -------------------------------------------------------------------------------


def test_enqueue_from_the_command_line():
    child = run(
        "enqueue",
        "tests.testapp.tasks.add",
        "--args",
        "[20, 22]",
        "--queue",
        "cli",
        "--priority",
        "5",
    )
    assert child.process.returncode == 0, child.output
    job_id = child.output.strip().splitlines()[-1]
    job = Job.objects.get(pk=job_id)
    assert (job.args, job.queue_name, job.priority, job.status) == ([20, 22], "cli", 5, "ready")
    later = run("enqueue", "tests.testapp.tasks.echo", "--kwargs", '{"a": 1}', "--in", "1h")
    assert Job.objects.get(pk=later.output.strip().splitlines()[-1]).status == "scheduled"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("tests.testapp.tasks.nope",), "does not exist"),
        (("os.getcwd",), "not a django.tasks task"),
        (("tests.testapp.tasks.add", "--args", "{1"), "is not JSON"),
        (("tests.testapp.tasks.add", "--args", "{}"), "must be a JSON array"),
        (("tests.testapp.tasks.echo", "--kwargs", '{"x": NaN}'), "kwargs['x'] is nan"),
        (("tests.testapp.tasks.add", "--priority", "500"), "'500' must be at most 100"),
    ],
)
def test_enqueue_refuses_bad_input_clearly(args, message):
    child = run("enqueue", *args)
    assert child.process.returncode != 0
    assert message in child.output
    assert "Traceback" not in child.output
    assert not Job.objects.exists()


# -- every subcommand: help and bad arguments ----------------------------------------------


@pytest.mark.any_database
@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_has_help(name):
    child = run(name, "--help")
    assert child.process.returncode == 0, child.output
    assert f"queue {name}" in child.output
    assert "--backend" in child.output


@pytest.mark.any_database
@pytest.mark.parametrize(
    ("name", "everything"),
    [
        ("retry", "Every failed job."),
        ("discard", "Every failed job."),
        ("run-now", "Every scheduled job."),
        ("cancel", "Every job not finished: scheduled, blocked, ready and running."),
    ],
)
def test_the_help_of_all_says_what_each_command_selects(name, everything):
    child = run(name, "--help")
    assert child.process.returncode == 0, child.output
    # argparse wraps the help to the terminal's width: compare the words.
    assert " ".join(everything.split()) in " ".join(child.output.split())


REQUIRED = {
    "pause": ["q"],
    "resume": ["q"],
    "enqueue": ["tests.testapp.tasks.add"],
    "retry": ["--all"],
    "discard": ["--all"],
    "run-now": ["--all"],
    "cancel": ["--all"],
    "show": ["01939f2e-0000-7000-8000-000000000000"],
    "prune": ["--older-than", "1d"],
}


@pytest.mark.any_database
@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_refuses_an_unknown_option(name):
    child = run(name, *REQUIRED.get(name, []), "--no-such-option")
    assert child.process.returncode != 0
    assert "unrecognized arguments: --no-such-option" in child.output
    assert "Traceback" not in child.output


@pytest.mark.any_database
@pytest.mark.parametrize("name", sorted(SUBCOMMANDS))
def test_every_subcommand_refuses_an_unknown_backend(name):
    args = {
        "pause": ["q"],
        "resume": ["q"],
        "enqueue": ["tests.testapp.tasks.add"],
        "retry": ["--all"],
        "discard": ["--all"],
        "run-now": ["--all"],
        "cancel": ["--all"],
        "show": ["01939f2e-0000-7000-8000-000000000000"],
        "prune": ["--older-than", "1d"],
    }.get(name, [])
    child = run(name, *args, "--backend", "nope")
    assert child.process.returncode != 0
    assert "TASKS['nope'] cannot be loaded" in child.output
    assert "Traceback" not in child.output


def test_django_flags_work_after_the_subcommand():
    child = run("status", "-v", "2", "--no-color", "--settings", "tests.settings")
    assert child.process.returncode == 0, child.output


# -- memory recycling ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_worker_past_its_memory_limit_is_replaced_without_losing_or_repeating_a_job():
    total = 16
    with start_supervisor(
        "--no-scheduler", "--processes", "1", "--threads", "2", "--max-memory-mb", "110", workers=1
    ) as supervisor:
        enqueue_many(tasks.hog, [Call(megabytes=15, sleep=0.25)] * total)
        wait_for(
            lambda: Job.objects.filter(status="successful").count() == total,
            timeout=120,
            message="every hog job to run",
        )
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=40) == 0, supervisor.output
    assert "reason=max_memory_mb" in supervisor.output
    assert "exited with status 4" in supervisor.output
    per_job = dict(
        Execution.objects.values("job_id").annotate(n=Count("id")).values_list("job_id", "n")
    )
    assert len(per_job) == total
    assert set(per_job.values()) == {1}
    assert len(set(Execution.objects.values_list("pid", flat=True))) >= 2  # it was replaced
    assert set(Job.objects.values_list("attempt", flat=True)) == {1}


# -- logs ----------------------------------------------------------------------------------


def test_logs_carry_a_failures_traceback_once_and_no_argument_values():
    tasks.shout_secret.enqueue("hunter2-do-not-log")
    tasks.add.enqueue(1, 2)
    child = run("work", "--stop-when-empty", "--threads", "1")
    assert child.process.returncode == 0, child.output
    # Once by Stalwart's job_failed line, and once by Django's own task_finished receiver
    # (on the django.tasks logger, which the test settings show too), in either order: each
    # record is its first line and the lines up to the next record.
    records = re.split(r"\n(?=\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ )", child.output)
    with_traceback = [record for record in records if "Traceback (most recent call last)" in record]
    assert len(with_traceback) == 2, child.output
    (stalwart,) = [record for record in with_traceback if " stalwart " in record.split("\n")[0]]
    (django,) = [record for record in with_traceback if " django.tasks " in record.split("\n")[0]]
    assert "action=job_failed" in stalwart
    assert stalwart.count("Traceback (most recent call last)") == 1
    assert "state=FAILED" in django
    assert django.count("Traceback (most recent call last)") == 1
    assert "RuntimeError: the task failed" in child.output
    assert "hunter2-do-not-log" not in child.output
    assert "action=job_failed" in child.output
    assert "action=job_succeeded" in child.output


def test_an_idle_worker_is_quiet_at_info():
    with start_supervisor(
        "--no-scheduler", "--processes", "1", "--dispatchers", "1", workers=1
    ) as supervisor:
        # Start-up is logged, once: the supervisor's, the worker's and the dispatcher's lines.
        wait_for(
            lambda: supervisor.output.count("action=process_started") == 3,
            timeout=30,
            message="the three processes' start-up lines",
        )
        before = len(supervisor.output.splitlines())
        # Several poll intervals and heartbeats pass with nothing to do.
        wait_for(
            lambda: Process.objects.filter(
                kind="worker", last_heartbeat_at__gt=F("created_at") + timedelta(seconds=2)
            ).exists(),
            timeout=30,
            message="a few idle heartbeats",
        )
        after = len(supervisor.output.splitlines())
        supervisor.signal(signal.SIGTERM)
        assert supervisor.wait(timeout=40) == 0
    assert after == before, supervisor.output
