"""Configuration mistakes a newcomer makes, seen from the commands they run: each gets a
message that names the fix, at the right moment, and the rest of the site keeps working."""

import json
import uuid

import pytest
from django.db import connection, connections

from stalwart.models import Job, Process
from tests.helpers import Child, child_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

BAD_CRON = json.dumps(
    {
        "nightly": {"task": "tests.testapp.tasks.noop", "schedule": "61 * * * *"},
        "hourly": {"task": "tests.testapp.tasks.noop", "schedule": "@hourly"},
    }
)


def run(*args: str, **env: str) -> Child:
    connections.close_all()
    with Child(*args, env=child_env(**env)) as child:
        child.wait(timeout=60)
    return child


@pytest.mark.any_database
def test_without_the_app_in_installed_apps_check_and_enqueue_name_the_fix():
    # A project whose tasks are imported as its apps load (its signal receivers use them).
    without_app = {
        "DJANGO_SETTINGS_MODULE": "tests.settings_without_app",
        "STALWART_TEST_TASKS_AT_READY": "true",
    }
    check = run("check", **without_app)
    assert check.process.returncode == 1, check.output
    assert "(stalwart.E004) 'stalwart' is not in INSTALLED_APPS" in check.output
    assert 'HINT: Add "stalwart" to INSTALLED_APPS' in check.output
    assert "Traceback" not in check.output
    shell = run(
        "shell",
        "--no-imports",
        "-c",
        "from tests.testapp import tasks\n"
        "try:\n"
        "    tasks.add.enqueue(1, 2)\n"
        "except Exception as error:\n"
        "    print(type(error).__name__, error)\n",
        **without_app,
    )
    assert shell.process.returncode == 0, shell.output
    assert "ImproperlyConfigured 'stalwart' is not in INSTALLED_APPS" in shell.output
    assert not Job.objects.exists()


@pytest.mark.any_database
def test_without_the_app_and_without_tasks_imported_at_load_check_cannot_tell():
    """What Django allows Stalwart to say, pinned so that a change in Django shows here.

    Django registers its task backends' system checks (Stalwart's stalwart.E004 among them)
    when ``django.tasks`` is first imported, and ``check`` takes its list of checks before it
    imports the URLconf. A project that imports no task module while its apps load gives
    Stalwart's code no moment to run: ``check`` passes. The docs say so
    (docs/tutorial/quickstart.md), and what shows the mistake: ``help`` lists no
    ``[stalwart]`` section, and ``queue`` is an unknown command."""
    without_app = {"DJANGO_SETTINGS_MODULE": "tests.settings_without_app"}
    check = run("check", **without_app)
    assert check.process.returncode == 0, check.output
    assert "System check identified no issues" in check.output
    helped = run("help", **without_app)
    assert helped.process.returncode == 0, helped.output
    assert "[stalwart]" not in helped.output
    queue = run("queue", "status", **without_app)
    assert queue.process.returncode == 1
    assert "Unknown command: 'queue'" in queue.output
    installed = run("help")
    assert "[stalwart]\n    queue" in installed.output, installed.output


@pytest.mark.any_database  # a setting read at start-up, whatever the database
def test_a_bad_cron_expression_is_reported_and_stops_only_the_scheduler():
    check = run("check", STALWART_RECURRING=BAD_CRON)
    assert check.process.returncode == 1, check.output
    assert "(stalwart.E006) TASKS['default']['OPTIONS']['recurring']['nightly']" in check.output
    assert "Traceback" not in check.output

    queue_check = run("queue", "check", STALWART_RECURRING=BAD_CRON)
    assert queue_check.process.returncode == 1
    assert queue_check.output.count("['nightly']") == 1, queue_check.output  # once

    supervise = run("queue", "supervise", STALWART_RECURRING=BAD_CRON)
    assert supervise.process.returncode == 1
    assert "The scheduler cannot start: TASKS['default']['OPTIONS']['recurring']['nightly']" in (
        supervise.output
    )
    assert "--no-scheduler" in supervise.output
    assert "Traceback" not in supervise.output
    assert not Process.objects.exists()

    enqueued = run(
        "queue",
        "enqueue",
        "tests.testapp.tasks.add",
        "--args",
        "[1, 2]",
        STALWART_RECURRING=BAD_CRON,
    )
    assert enqueued.process.returncode == 0, enqueued.output
    work = run("queue", "work", "--stop-when-empty", STALWART_RECURRING=BAD_CRON)
    assert work.process.returncode == 0, work.output
    assert Job.objects.get().status == "successful"

    connections.close_all()
    with Child(
        "queue",
        "supervise",
        "--no-scheduler",
        "--processes",
        "1",
        env=child_env(STALWART_RECURRING=BAD_CRON),
    ) as supervisor:
        wait_for(
            lambda: (
                supervisor.process.poll() is not None
                or Process.objects.filter(kind="worker").exists()
            ),
            timeout=30,
            message="the supervisor to start its worker",
        )
        supervisor.signal(15)
        assert supervisor.wait(timeout=30) == 0, supervisor.output


def test_pausing_a_queue_nothing_uses_warns_that_it_may_be_misspelt():
    misspelt = run("queue", "pause", "defualt")
    assert misspelt.process.returncode == 0, misspelt.output
    assert "Paused 'defualt'" in misspelt.output
    assert "warning: no task, worker, recurring entry or job uses the queue 'defualt'" in (
        misspelt.output
    )
    assert "the project's tasks name: default" in misspelt.output
    for used in ("default", "other"):  # a task's queue; a name in TASKS['limited']['QUEUES']
        paused = run(
            "queue", "pause", used, "--backend", "limited" if used == "other" else "default"
        )
        assert paused.process.returncode == 0, paused.output
        assert "warning" not in paused.output, paused.output


# -- database errors: the right hint, on one line -------------------------------------------


def test_a_missing_database_is_named_as_such_and_not_retried(vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite creates a missing database file")
    child = run("queue", "retry", "--all", STALWART_DB_NAME="stalwart_no_such_database")
    assert child.process.returncode == 1
    server, create = {
        "postgresql": ("PostgreSQL at 127.0.0.1:5432", "createdb stalwart_no_such_database"),
        "mysql": (
            "MySQL/MariaDB at 127.0.0.1:3306",
            "CREATE DATABASE stalwart_no_such_database CHARACTER SET utf8mb4",
        ),
    }[vendor]
    assert (
        "DATABASES['default'] names the database 'stalwart_no_such_database', which does not "
        f"exist on the server ({server}, database 'stalwart_no_such_database')"
    ) in child.output
    assert f"Create it ({create})" in child.output
    assert "database_retry" not in child.output  # no retry can create it
    assert "Traceback" not in child.output


def test_a_database_that_cannot_be_reached_says_where_it_was_looked_for(vendor, tmp_path):
    if vendor == "postgresql":
        child = run("queue", "status", PGPORT="1")
        where = "PostgreSQL at 127.0.0.1:1, database"
    elif vendor == "mysql":
        child = run("queue", "status", MYSQL_PORT="1")
        where = "MySQL/MariaDB at 127.0.0.1:1, database"
    else:
        missing = tmp_path / "no-such-directory" / "db.sqlite3"
        child = run("queue", "status", STALWART_DB_NAME=str(missing))
        where = f"the SQLite file '{missing}'"
    assert child.process.returncode == 1
    assert f"Cannot connect to DATABASES['default'], {where}" in child.output
    assert "Traceback" not in child.output
    assert len(child.output.strip().splitlines()) == 1, child.output


def test_a_queue_in_another_database_says_migrate_database_alias(tmp_path):
    queue = str(tmp_path / "queue.sqlite3")
    check = run("queue", "check", STALWART_QUEUE_DATABASE=queue)
    assert check.process.returncode == 1
    assert "error: DATABASES['queue'] lacks migrations: stalwart.0001_initial" in check.output
    assert "Run 'python manage.py migrate --database queue'." in check.output
    status = run("queue", "status", STALWART_QUEUE_DATABASE=queue)
    assert status.process.returncode == 1
    assert (
        f"Stalwart's tables are missing from DATABASES['queue'] (the SQLite file '{queue}'): "
        "run 'python manage.py migrate --database queue'."
    ) in status.output


def test_an_outage_logs_one_line_when_it_starts_and_one_with_a_count_when_it_ends(tmp_path):
    # A worker started before its queue's tables exist: it waits, saying so once, on one
    # line (with the hint), and says when it is over, with how many tries failed. (Tables
    # missing for process_alive_threshold end it: 30 s leaves migrate time on a busy host.)
    queue = str(tmp_path / "queue.sqlite3")
    connections.close_all()
    env = child_env(STALWART_QUEUE_DATABASE=queue, STALWART_ALIVE="30")
    with Child("queue", "work", "--poll-interval", "0.05", env=env) as worker:
        wait_for(
            lambda: worker.output.count("action=database_unavailable") == 1,
            timeout=30,
            message="the worker to report the outage",
        )
        migrate = run("migrate", "--database", "queue", STALWART_QUEUE_DATABASE=queue)
        assert migrate.process.returncode == 0, migrate.output
        wait_for(
            lambda: "action=database_recovered" in worker.output,
            timeout=30,
            message="the worker to report the end of the outage",
        )
        worker.signal(15)
        assert worker.wait(timeout=30) == 0, worker.output
    lines = worker.output.splitlines()
    # One outage, or, if the worker looked while migrate was creating the tables one after
    # the other (a table there, the next one not yet), one per such look: each has its
    # line when it starts and its line when it ends, never more.
    unavailable = [line for line in lines if "action=database_unavailable" in line]
    recovered = [line for line in lines if "action=database_recovered" in line]
    assert len(unavailable) == len(recovered) >= 1, worker.output
    assert 'error="OperationalError: no such table: stalwart_' in unavailable[0]
    assert "hint=\"Stalwart's tables are missing from DATABASES['queue']" in unavailable[0]
    assert "run 'python manage.py migrate --database queue'." in unavailable[0]
    for line in recovered:
        assert " failures=" in line
        assert int(line.split(" failures=")[1].split()[0]) >= 1
    # Every line is an event (no continuation lines), and the outage made no others.
    assert all(" action=" in line for line in lines if line.strip()), worker.output
    assert sum("WARNING" in line for line in lines) == len(unavailable), worker.output


# -- the command line ------------------------------------------------------------------------


@pytest.mark.any_database
def test_enqueue_with_positional_values_shows_its_own_usage_and_where_they_go():
    child = run("queue", "enqueue", "tests.testapp.tasks.add", "5", "x")
    assert child.process.returncode == 2
    assert "queue enqueue [-h] [--backend BACKEND] [--args JSON]" in child.output
    assert (
        "queue enqueue: error: unrecognized arguments: 5 x (the task's arguments go in --args, "
        """as a JSON array: --args '[5, "x"]')"""
    ) in child.output
    assert not Job.objects.exists()


@pytest.mark.parametrize("verb", ["retry", "discard", "run-now"])
def test_a_task_path_that_matches_no_job_and_no_task_is_an_error(verb):
    typo = run("queue", verb, "--task", "tests.testapp.tasks.ad")
    assert typo.process.returncode == 1
    assert (
        "--task 'tests.testapp.tasks.ad' matches no job, and no task of the project: "
        "'tests.testapp.tasks.ad' does not exist: module 'tests.testapp.tasks' has no 'ad'."
    ) in typo.output
    real = run("queue", verb, "--task", "tests.testapp.tasks.add")
    assert real.process.returncode == 0, real.output
    assert " 0 " in real.output


def test_a_mysql_collation_that_ignores_case_is_a_warning_naming_the_fix(vendor):
    """MariaDB's default collation, utf8mb4_general_ci, makes 'Emails' and 'emails' one
    queue: ``check --database`` (and ``migrate``, and ``queue check``) say so, and how to
    change it. The test database itself is utf8mb4_bin, and passes."""
    if vendor != "mysql":
        pytest.skip("a collation of MySQL and MariaDB")
    name = f"stalwart_collation_{uuid.uuid4().hex[:8]}"
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
    try:
        loose = run("check", "--database", "default", STALWART_DB_NAME=name)
        queue_check = run("queue", "check", STALWART_DB_NAME=name)
    finally:
        with connection.cursor() as cursor:
            cursor.execute(f"DROP DATABASE {name}")
    assert loose.process.returncode == 0, loose.output  # a warning stops nothing
    assert (
        "(stalwart.W007) DATABASES['default'] compares Stalwart's text columns with the "
        "collation 'utf8mb4_general_ci', which ignores case or accents"
    ) in loose.output
    assert f"HINT: Use utf8mb4_bin: ALTER DATABASE `{name}` CHARACTER SET utf8mb4" in loose.output
    assert "warning: stalwart.W007: DATABASES['default']" in queue_check.output
    binary = run("check", "--database", "default")
    assert "stalwart.W007" not in binary.output, binary.output
