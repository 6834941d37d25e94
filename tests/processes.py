"""Starting ``queue supervise`` and ``queue work`` as real processes, for tests: one way, that
never leaves a process behind.

A child is reaped (SIGKILL to its whole tree, then ``waitpid``) on every failure path:

- it fails to start (exits early, or is not ready in time): reaped before the failure is
  raised, by ``started``;
- the test fails, or forgets it, after it started: reaped when the test ends, by the
  ``reap_children`` fixture (``tests/conftest.py``), whatever the test did with it;
- pytest itself is killed: the kernel kills it (``setpriv --pdeathsig``, ``tests.helpers``).

A supervisor left running would go on claiming from the test database in later tests.
"""

from collections.abc import Callable

from django.db import connections

from stalwart.models import Process
from tests.helpers import Child, child_env, wait_for


def started(
    child: Child,
    ready: Callable[[], bool],
    *,
    what: str,
    timeout: float = 30,
    may_exit: bool = False,
) -> Child:
    """Wait until ``ready()``; if ``child`` exits first (unless ``may_exit``), or is not ready
    in time, reap it (whole tree) and fail, with what it printed."""

    def check() -> bool:
        if child.process.poll() is not None:
            if may_exit:
                return True
            raise AssertionError(
                f"{what}: it exited early (status {child.process.returncode}):\n{child.output}"
            )
        return ready()

    try:
        wait_for(check, timeout=timeout, message=what)
    except BaseException:
        child.__exit__()  # killed and reaped, whole tree, before the failure propagates
        raise
    return child


def start_supervisor(
    *args: str, children: int | None = None, workers: int | None = None, **env: str
) -> Child:
    """``queue supervise ARGS`` with settings from ``env``, once it has registered with
    ``children`` children (of every kind) or ``workers`` workers under it."""
    assert (children is None) != (workers is None), "count children or workers, not both"
    connections.close_all()  # a fork-safe state for the child, and no session to share
    supervisor = Child("queue", "supervise", *args, env=child_env(**env))

    def registered() -> bool:
        row = Process.objects.filter(pid=supervisor.pid, kind="supervisor").first()
        if row is None:
            return False
        under = Process.objects.filter(supervisor=row.id)
        if workers is not None:
            return under.filter(kind="worker").count() == workers
        return under.count() == children

    count = f"{children} children" if workers is None else f"{workers} workers"
    return started(supervisor, registered, what=f"a supervisor with {count}")


def start_worker(*args: str, may_exit: bool = False, **env: str) -> Child:
    """``queue work ARGS`` with settings from ``env``, once it has registered. ``may_exit``:
    it may also be done already (``--stop-when-empty``, ``--max-jobs``), which is no
    failure: the test reads its exit status."""
    connections.close_all()
    worker = Child("queue", "work", *args, env=child_env(**env))
    return started(
        worker,
        lambda: Process.objects.filter(pid=worker.pid).exists(),
        what="the worker to register",
        may_exit=may_exit,
    )
