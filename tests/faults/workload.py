"""What the scenarios enqueue and watch: ledger jobs, and the state of a process tree."""

import time

from stalwart import Call
from tests.faults.invariants import finished
from tests.faults.scenario import Scenario
from tests.faults.target import ALIVE
from tests.helpers import Child
from tests.testapp import tasks


def ledger_jobs(scenario: Scenario, count: int, seconds: float) -> list[str]:
    """Enqueue ``count`` ledger jobs of ``seconds`` each; return their ids."""
    assert scenario.target is not None
    return scenario.target.enqueue_many(tasks.ledger, [Call(seconds=seconds)] * count)


def all_finished(ids: list[str]):
    return lambda: finished(ids) == len(ids)


def some_ended(scenario: Scenario, count: int):
    """True once ``count`` executions have ended (the drain is under way)."""
    assert scenario.ledger is not None
    ledger = scenario.ledger
    return lambda: ledger.ended_count() >= count


def successful(ids: list[str]) -> dict[str, str]:
    return dict.fromkeys(ids, "successful")


# How long a tree is watched after a fault: twice the alive threshold.
WATCH = 2 * ALIVE


def watch_tree(
    scenario: Scenario, supervisor: Child, *, before: set[int], seconds: float = WATCH
) -> None:
    """Keep watching for ``seconds`` that the supervisor lives and keeps the children it had
    ``before`` the fault: a healthy tree is never stopped by a fault of the database."""
    assert scenario.fleet is not None
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if supervisor.process.poll() is not None:
            scenario.problems.append(
                f"the supervisor exited {supervisor.process.returncode} after the fault"
            )
            return
        time.sleep(0.2)  # sampling the tree for a stated time, not synchronising
    after = scenario.fleet.os_children(supervisor)
    scenario.expect(
        before == after,
        f"the supervisor's children changed: {sorted(before)} before, {sorted(after)} after "
        f"(a healthy child must not be stopped or replaced because of the fault)",
    )
