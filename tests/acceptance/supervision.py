"""Helpers for tests that run supervisors as real processes: start, stop, look at them."""

import signal

import psutil
from django.db import connections
from django.db.models import Count

from stalwart.models import Job, Process
from tests.helpers import Child, child_env, wait_for
from tests.testapp.models import Execution


def start_supervisor(*args: str, children: int, **env: str) -> Child:
    """Start a supervisor and wait until it and its ``children`` have registered."""
    connections.close_all()
    supervisor = Child("queue", "supervise", *args, env=child_env(**env))

    def registered() -> bool:
        if supervisor.process.poll() is not None:
            raise AssertionError(f"the supervisor exited early:\n{supervisor.output}")
        row = Process.objects.filter(pid=supervisor.pid, kind="supervisor").first()
        return row is not None and Process.objects.filter(supervisor=row.id).count() == children

    try:
        wait_for(registered, timeout=30, message=f"a supervisor with {children} children")
    except BaseException:
        supervisor.__exit__()  # killed and reaped, whole tree, before the failure propagates
        raise
    return supervisor


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
