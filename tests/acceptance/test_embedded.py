"""Embedded mode, for real: Gunicorn and uvicorn start the supervisor in their own process
tree (tests/servers), the web server serves and the supervisor's workers run jobs, and a
``TERM`` to the server stops everything: no process of the tree is left, no process row,
no job running.

The supervisor and its release of jobs are the same on every database (their own tests
run on each); what is tested here is the web server's hold on it: the SQLite leg runs it.
"""

import signal
import socket
import urllib.error
import urllib.request

import psutil
import pytest
from django.db import connections

from stalwart.models import Job, Process
from tests.acceptance.supervision import gone
from tests.helpers import Child, child_env, wait_for
from tests.testapp import tasks
from tests.testapp.models import Execution

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.any_database]

BAD_CRON = '{"nightly": {"task": "tests.testapp.tasks.noop", "schedule": "61 * * * *"}}'


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def gunicorn(port: int, **env: str) -> Child:
    connections.close_all()
    return Child(
        "--config",
        "python:tests.servers.gunicorn_conf",
        "--bind",
        f"127.0.0.1:{port}",
        "tests.servers.wsgi:application",
        module="gunicorn",
        env=child_env(**env),
    )


def uvicorn(port: int) -> Child:
    connections.close_all()
    return Child(
        "tests.servers.asgi:application",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--lifespan",
        "on",
        module="uvicorn",
        env=child_env(),
    )


def embedded_supervisor(server: Child) -> psutil.Process:
    """The supervisor the server started, once it and its three children (a worker, the
    dispatcher, the scheduler) have registered."""

    def registered() -> psutil.Process | None:
        if server.process.poll() is not None:
            raise AssertionError(f"the server ended:\n{server.output}")
        row = Process.objects.filter(kind="supervisor").first()
        if row is None or Process.objects.filter(supervisor=row.id).count() < 3:
            return None
        return psutil.Process(row.pid)

    return wait_for(registered, timeout=60, message="the embedded supervisor and its children")


def answers(port: int, path: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=60) as response:
        return response.status


def tree_of(server: Child) -> list[int]:
    root = psutil.Process(server.pid)
    return [root.pid, *(process.pid for process in root.children(recursive=True))]


def serve_jobs_then_stop(server: Child, port: int, *, statuses: tuple[int, ...] = (0,)) -> None:
    """What both servers must do: run the supervisor as their own child, serve, run jobs,
    and leave nothing behind when stopped with TERM, a job running at that moment
    included (it finishes within the shutdown timeout). ``statuses``: the server's exit
    statuses after a TERM."""
    supervisor = embedded_supervisor(server)
    assert supervisor.ppid() == server.pid, "the supervisor is the server's own child"
    assert answers(port, "/favicon.ico") == 204
    quick = [tasks.add.enqueue(number, number) for number in range(10)]
    wait_for(
        lambda: (
            Job.objects.filter(pk__in=[r.id for r in quick], status="successful").count()
            == len(quick)
        ),
        timeout=60,
        message="the quick jobs to run",
    )
    assert [Job.objects.get(pk=r.id).return_value for r in quick] == [n * 2 for n in range(10)]
    slow = tasks.record.enqueue("slow", sleep=4)
    wait_for(
        lambda: Job.objects.filter(pk=slow.id, status="running").exists(),
        timeout=30,
        message="the slow job to start",
    )
    tree = tree_of(server)
    server.signal(signal.SIGTERM)
    assert server.wait(timeout=90) in statuses, server.output
    wait_for(lambda: all(gone(pid) for pid in tree), timeout=30, message="the whole tree to end")
    assert list(Process.objects.values_list("kind", "pid")) == []
    assert not Job.objects.filter(status="running").exists()
    assert Job.objects.get(pk=slow.id).status == "successful"
    assert Execution.objects.filter(job_id=slow.id).count() == 1
    assert "Traceback" not in server.output, server.output


def test_gunicorn_runs_one_supervisor_from_its_master_and_stops_it_on_term(reaped):
    port = free_port()
    server = gunicorn(port)
    reaped.append(server)
    supervisor = embedded_supervisor(server)

    def web_workers() -> list[psutil.Process]:
        return [p for p in psutil.Process(server.pid).children() if p.pid != supervisor.pid]

    # Gunicorn forks its two workers one after the other: on a loaded machine the second
    # may come after the supervisor has registered.
    wait_for(lambda: len(web_workers()) == 2, timeout=30, message="Gunicorn's two workers")
    assert not any(worker.children() for worker in web_workers()), "no supervisor per worker"
    assert Process.objects.filter(kind="supervisor").count() == 1
    serve_jobs_then_stop(server, port)
    assert "Stalwart: supervisor of TASKS['default'] started" in server.output


def test_uvicorn_runs_the_supervisor_for_the_lifespan_and_stops_it_on_term(reaped):
    port = free_port()
    server = uvicorn(port)
    reaped.append(server)
    # Once shut down, uvicorn ends by the signal it was stopped with, as its caller expects.
    serve_jobs_then_stop(server, port, statuses=(0, -signal.SIGTERM))
    assert "action=embedded_supervisor_stopped" in server.output


def test_a_reload_replaces_the_supervisor_and_a_kill_takes_it_along(reaped):
    """``HUP``: Gunicorn starts workers with the new code; the hooks start a supervisor
    with it too, and stop the old one (TERM: it drains), as Gunicorn does its workers.
    Then SIGKILL, which gives Gunicorn no hook to run: the supervisor notices that its
    parent is gone (``--parent-pid``) and drains by itself."""
    port = free_port()
    server = gunicorn(port)
    reaped.append(server)
    old = embedded_supervisor(server)
    server.signal(signal.SIGHUP)

    def replaced() -> psutil.Process | None:
        rows = Process.objects.filter(kind="supervisor").exclude(pid=old.pid)
        row = rows.first()
        return psutil.Process(row.pid) if row is not None and gone(old.pid) else None

    new = wait_for(replaced, timeout=60, message="a new supervisor, and the old one gone")
    assert new.ppid() == server.pid
    assert "Stalwart: supervisor restarted" in server.output
    done = tasks.add.enqueue(2, 3)
    wait_for(
        lambda: Job.objects.filter(pk=done.id, status="successful").exists(),
        timeout=60,
        message="a job run by the new tree",
    )
    tree = tree_of(server)
    server.process.send_signal(signal.SIGKILL)
    server.wait(timeout=10)
    wait_for(lambda: all(gone(pid) for pid in tree), timeout=60, message="the whole tree to end")
    assert list(Process.objects.values_list("kind", "pid")) == []


def test_a_supervisor_that_cannot_start_stops_gunicorn_with_its_reason(reaped):
    port = free_port()
    server = gunicorn(port, STALWART_RECURRING=BAD_CRON)
    reaped.append(server)
    assert server.wait(timeout=90) == 1
    assert "The scheduler cannot start: TASKS['default']['OPTIONS']['recurring']" in (server.output)
    assert "exited with status 1 before it was ready" in server.output
    with pytest.raises(urllib.error.URLError, match="Connection refused"):
        answers(port, "/favicon.ico")  # nothing serves
    assert not Process.objects.exists()
