"""Helpers for tests that run supervisors as real processes: start, stop, look at them."""

import signal

import psutil
from django.db.models import Count

from stalwart.models import Job, Process
from tests.helpers import Child
from tests.processes import start_supervisor
from tests.testapp.models import Execution

__all__ = [
    "assert_nothing_left_behind",
    "executions_per_job",
    "gone",
    "owner_pid",
    "running",
    "start_supervisor",
    "stop",
]


def stop(supervisor: Child, signum: int = signal.SIGTERM, timeout: float = 40) -> int:
    supervisor.signal(signum)
    return supervisor.wait(timeout=timeout)


def owner_pid(job_id: str) -> int:
    owner = Job.objects.get(pk=job_id).owner
    return Process.objects.get(pk=owner).pid


def running(job_id: str) -> bool:
    return Job.objects.filter(pk=job_id, status="running").exists()


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def assert_nothing_left_behind() -> None:
    assert list(Process.objects.values_list("kind", "pid")) == []
    assert not Job.objects.filter(status__in=["running", "ready", "scheduled"]).exists()


def executions_per_job() -> dict[str, int]:
    return dict(
        Execution.objects.values("job_id").annotate(n=Count("id")).values_list("job_id", "n")
    )
