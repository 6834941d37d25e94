"""What the scenarios enqueue and watch: ledger jobs, and the state of a process tree."""

import json
import time

from stalwart import Call
from stalwart.models import Job, Process, RecurringRun
from tests.faults.invariants import finished
from tests.faults.scenario import SCALE, Scenario
from tests.faults.target import ALIAS, ALIVE
from tests.helpers import Child
from tests.testapp import tasks


def recurring_runs() -> int:
    """How many recurring ticks have been enqueued."""
    return RecurringRun.objects.using(ALIAS).count()


def ledger_jobs(
    scenario: Scenario, count: int, seconds: float, *, scaled: bool = True
) -> list[str]:
    """Enqueue ``count`` ledger jobs of ``seconds`` each (times ``SCALE`` if ``scaled``)."""
    assert scenario.target is not None
    total = count * SCALE if scaled else count
    return scenario.target.enqueue_many(tasks.ledger, [Call(seconds=seconds)] * total)


def all_finished(ids: list[str]):
    return lambda: finished(ids) == len(ids)


def running(ids: list[str], count: int):
    """True once ``count`` of these jobs are running."""
    return lambda: Job.objects.using(ALIAS).filter(pk__in=ids, status="running").count() >= count


def owner_pid(job_id: str) -> int | None:
    """The pid of the process that holds this job now, if any."""
    owner = Job.objects.using(ALIAS).filter(pk=job_id).values_list("owner", flat=True).first()
    return Process.objects.using(ALIAS).filter(pk=owner).values_list("pid", flat=True).first()


def some_ended(scenario: Scenario, count: int):
    """True once ``count`` executions have ended (the drain is under way)."""
    assert scenario.ledger is not None
    ledger = scenario.ledger
    return lambda: ledger.ended_count() >= count


EVERY_SECOND = json.dumps(
    {"every-second": {"task": "tests.testapp.tasks.noop", "schedule": "* * * * * *"}}
)


def successful(ids: list[str]) -> dict[str, str]:
    return dict.fromkeys(ids, "successful")


# How long a tree is watched after a fault: twice the alive threshold.
WATCH = 2 * ALIVE


def watch_tree(
    scenario: Scenario, supervisor: Child, *, before: set[int] | None, since: float
) -> None:
    """Until ``since + WATCH`` (monotonic), keep checking that the supervisor lives and keeps
    the children it had ``before`` the fault (None: children may have been replaced): a
    fault of the database never stops a healthy tree, not even a threshold later."""
    assert scenario.fleet is not None
    deadline = since + WATCH
    while time.monotonic() < deadline:
        if supervisor.process.poll() is not None:
            scenario.problems.append(
                f"the supervisor exited {supervisor.process.returncode} after the fault"
            )
            return
        time.sleep(0.2)  # sampling the tree for a stated time, not synchronising
    if before is None:
        return
    after = scenario.fleet.os_children(supervisor)
    scenario.expect(
        before == after,
        f"the supervisor's children changed: {sorted(before)} before, {sorted(after)} after "
        f"(a healthy child must not be stopped or replaced because of the fault)",
    )
