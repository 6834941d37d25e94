"""``queue work --reload`` and ``queue supervise --reload``: a real edit of a task module,
and the command starting again with the new code."""

import json
import os
import signal
import time
import uuid
from pathlib import Path

import pytest
from django.db import connections

from stalwart.models import Job, Process
from tests.helpers import Child, child_env, wait_for

# Watching files and starting a command again is the same whatever the database.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.any_database]

PROBE = """from django.tasks import task


@task
def version() -> str:
    return {version!r}
"""


def write_probe(path: Path, version: str) -> None:
    path.write_text(PROBE.format(version=version))
    # Later than any modification time the watcher has seen, whatever the clock's grain.
    later = time.time() + 5
    os.utime(path, (later, later))


def run_probe(env: dict[str, str], module: str) -> str:
    """Enqueue the probe task from another process; wait for its result."""
    connections.close_all()
    with Child("queue", "enqueue", f"{module}.version", env=env) as enqueue:
        assert enqueue.wait(timeout=60) == 0, enqueue.output
    job_id = enqueue.output.strip().splitlines()[-1]
    wait_for(
        lambda: Job.objects.filter(pk=job_id, status="successful").exists(),
        timeout=30,
        message="the probe job to run",
    )
    return Job.objects.get(pk=job_id).return_value


def pids(kind: str) -> set[int]:
    return set(Process.objects.filter(kind=kind).values_list("pid", flat=True))


@pytest.mark.parametrize(
    ("command", "kind"),
    [
        (("work", "--poll-interval", "0.05"), "worker"),
        (("supervise", "--processes", "1", "--no-scheduler"), "supervisor"),
    ],
)
def test_an_edited_task_module_starts_the_command_again_with_the_new_code(tmp_path, command, kind):
    module = f"reload_probe_{uuid.uuid4().hex[:8]}"
    probe = tmp_path / f"{module}.py"
    write_probe(probe, "first")
    env = child_env(
        PYTHONPATH=os.pathsep.join([str(tmp_path), child_env()["PYTHONPATH"]]),
        STALWART_TASK_MODULES=json.dumps([module]),
    )
    connections.close_all()
    with Child("queue", *command, "--reload", env=env) as parent:

        def started() -> set[int]:
            if parent.process.poll() is not None:
                raise AssertionError(f"the command ended:\n{parent.output}")
            return pids(kind)

        first = wait_for(started, timeout=30, message=f"the {kind} to start")
        assert run_probe(env, module) == "first"
        write_probe(probe, "second")
        wait_for(
            lambda: "action=code_changed" in parent.output and pids(kind) - first,
            timeout=30,
            message=f"the {kind} to start again",
        )
        assert f"file={probe}" in parent.output
        assert run_probe(env, module) == "second"
        parent.signal(signal.SIGTERM)  # forwarded to the running command
        assert parent.wait(timeout=30) == 0, parent.output
    assert "Traceback" not in parent.output, parent.output
    assert not Process.objects.exists()


def test_a_task_module_that_failed_to_import_is_watched_and_its_fix_starts_the_worker_again(
    tmp_path,
):
    module = f"reload_broken_{uuid.uuid4().hex[:8]}"
    probe = tmp_path / f"{module}.py"
    probe.write_text("raise RuntimeError('not written yet')\n")
    env = child_env(
        PYTHONPATH=os.pathsep.join([str(tmp_path), child_env()["PYTHONPATH"]]),
        STALWART_TASK_MODULES=json.dumps([module]),
    )
    connections.close_all()
    with Child("queue", "work", "--poll-interval", "0.05", "--reload", env=env) as parent:

        def started() -> set[int]:
            if parent.process.poll() is not None:
                raise AssertionError(f"the command ended:\n{parent.output}")
            return pids("worker")

        first = wait_for(started, timeout=30, message="the worker to start")
        assert "action=task_module_failed" in parent.output, parent.output

        def fixed_and_noticed() -> bool:
            # Written again until noticed: the watcher's first look at the file may come
            # after the first write, which it then takes as the file's first state.
            write_probe(probe, "fixed")
            return "action=code_changed" in parent.output

        wait_for(fixed_and_noticed, timeout=30, message="the fix to be noticed")
        wait_for(
            lambda: pids("worker") - first,
            timeout=30,
            message="the worker to start again once the module is fixed",
        )
        assert f"file={probe}" in parent.output
        assert run_probe(env, module) == "fixed"
        parent.signal(signal.SIGTERM)
        assert parent.wait(timeout=30) == 0, parent.output
    assert not Process.objects.exists()
