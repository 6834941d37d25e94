"""Batches and dependants whose finishing process loses its connection (issue 20).

A batch's callbacks are enqueued by a dispatcher in one transaction with the write that marks
the batch finished; a dependant is released by its parent's worker just after the parent's
outcome is written (or, should that fail, by a dispatcher's look). Here the process doing it
is paused at that moment (``hooks.PAUSE_AT``) while its connection is cut for real:

- a dispatcher with a batch's callbacks enqueued, not yet committed: its backend is
  terminated (the transaction is undone: the callbacks must come from another), or its
  COMMIT goes through and the answer is lost at the proxy (the transaction stands: the
  callbacks must not come again);
- a parent's worker, its outcome written, its dependants not yet released: its backend is
  terminated.

Two trees run each scenario (two dispatchers, four worker processes). What must hold: each
callback job exists once and runs once, every member runs once, and the batch is finished;
every dependant runs once, after its parents, and none is left pending.
"""

import contextlib
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import transaction
from django.test import override_settings

import stalwart
from stalwart import Call
from stalwart.models import Batch, BatchJob, Dependency, Job
from tests.faults.hooks import PAUSE_AT, held_file
from tests.faults.invariants import FINAL
from tests.faults.scenario import SCALE, Scenario
from tests.faults.target import ALIAS
from tests.faults.workload import LOG_LINE, all_finished, successful
from tests.testapp import tasks

TREE = ("--processes", "2", "--threads", "2")
# What a process logs of a connection lost under it.
FAILED = ("database_unavailable", "database_retry", "dependants_not_released")
CHILDREN = 4  # two workers, a dispatcher, a scheduler


@contextlib.contextmanager
def enqueueing_into_the_scenario() -> Iterator[None]:
    """For the block, the test's ``default`` task backend writes to the scenario's database,
    so the public API (``stalwart.batch``, ``stalwart.enqueue_after``) enqueues there."""
    default = {
        "BACKEND": "stalwart.backend.StalwartBackend",
        "QUEUES": [],
        "OPTIONS": {"database": ALIAS, "max_attempts": 5},
    }
    with override_settings(TASKS={**settings.TASKS, "default": default}):
        yield


def start_trees(scenario: Scenario, flag: Path, event: str) -> None:
    """Two trees, each process of which pauses at ``event`` if it is the first (see
    ``hooks.PAUSE_AT``)."""
    assert scenario.fleet is not None
    flag.write_text("armed")
    for _ in range(2):
        scenario.fleet.supervise(*TREE, children=CHILDREN, **{PAUSE_AT: f"{event}:{flag}"})


def paused(scenario: Scenario, flag: Path, *, what: str) -> dict[str, Any] | None:
    """What the paused process says it holds, once one is paused (None: none ever was)."""
    held = held_file(flag)
    if not scenario.wait(held.exists, timeout=30 * SCALE, what=what):
        return None
    said = json.loads(held.read_text())
    scenario.expect(said["connections"], f"the paused process holds no connection: {said}")
    return said


def terminate(scenario: Scenario, said: dict[str, Any]) -> None:
    """``pg_terminate_backend`` the paused thread's backends, and wait until they are gone."""
    assert scenario.target is not None
    assert scenario.target.cluster is not None
    cluster = scenario.target.cluster
    backends = [held["backend"] for held in said["connections"]]
    terminated = cluster.terminate(backends)
    scenario.expect(
        terminated == len(backends), f"{terminated} of the backends {backends} were terminated"
    )
    scenario.wait(
        lambda: (
            not cluster.execute("SELECT pid FROM pg_stat_activity WHERE pid = ANY(%s)", [backends])
        ),
        timeout=10,
        what=f"the terminated backends {backends} to be gone",
    )


def callbacks(batch_id: str) -> Counter:
    """The batch's callback links, by role."""
    roles = BatchJob.objects.using(ALIAS).filter(batch=batch_id).exclude(role="member")
    return Counter(roles.values_list("role", flat=True))


def finished_batch(batch_id: str):
    batches = Batch.objects.using(ALIAS)
    return lambda: batches.filter(pk=batch_id, finished_at__isnull=False).exists()


def done(batch_id: str):
    """The batch is finished, its callbacks are enqueued, and every job has finished."""
    unfinished = Job.objects.using(ALIAS).exclude(status__in=FINAL)
    return lambda: (
        finished_batch(batch_id)() and bool(callbacks(batch_id)) and not unfinished.exists()
    )


def its_work_failed(scenario: Scenario, pid: int, what: str) -> None:
    """The paused process saw the cut: it logged the database unavailable, a transaction
    retried, or dependants it could not release."""
    assert scenario.fleet is not None
    children = scenario.fleet.children

    def said_so() -> bool:
        for child in children:
            for line in child.output.splitlines():
                found = LOG_LINE.match(line)
                if found and int(found[1]) == pid and found[2] in FAILED:
                    return True
        return False

    scenario.wait(said_so, timeout=5, what=f"the paused {what} (pid {pid}) to log the cut")


@pytest.mark.parametrize("cut", ["terminated", "answer-lost"])
def test_a_batch_finishing_when_its_connection_is_cut_enqueues_its_callbacks_once(
    proxied, tmp_path, cut
):
    flag = tmp_path / "pause-finishing"
    start_trees(proxied, flag, "batch_finishing")
    with (
        enqueueing_into_the_scenario(),
        stalwart.batch(
            on_success=(tasks.ledger, Call()),
            on_failure=(tasks.ledger, Call()),
            on_finish=(tasks.ledger, Call()),
        ) as batch,
    ):
        calls = [Call(seconds=0.2)] * (24 * SCALE)
        members = [result.id for result in batch.enqueue_many(tasks.ledger, calls)]

    said = paused(proxied, flag, what="a dispatcher to pause in the batch's finishing transaction")
    ended = time.monotonic()
    try:
        if said is not None:
            proxied.expect(
                said["event"].get("batch") == batch.id, f"paused finishing another batch: {said}"
            )
            ended = cut_the_finishing_connection(proxied, said, batch.id, flag, cut)
    finally:
        held_file(flag).unlink(missing_ok=True)  # the paused dispatcher goes on

    proxied.recover(
        done(batch.id), since=ended, bound=10, what="the batch to finish, and its callbacks"
    )
    if said is not None:
        its_work_failed(proxied, said["pid"], "dispatcher")
    for tree in list(proxied.fleet.children):
        proxied.stop(tree)
    # Counted once every process has stopped: a second dispatcher's late enqueue is in.
    links = callbacks(batch.id)
    proxied.expect(
        links == Counter({"on_success": 1, "on_finish": 1}),
        f"the batch's callbacks were enqueued as {dict(links)}, not on_success and on_finish once",
    )
    jobs = Job.objects.using(ALIAS)
    enqueued = [str(job) for job in jobs.exclude(pk__in=members).values_list("pk", flat=True)]
    linked = BatchJob.objects.using(ALIAS).filter(batch=batch.id).exclude(role="member")
    proxied.expect(
        sorted(enqueued) == sorted(str(job) for job in linked.values_list("job", flat=True)),
        f"jobs other than the members, {enqueued}, are not the callbacks linked to the batch",
    )
    proxied.conclude(successful(members + enqueued))


def cut_the_finishing_connection(
    scenario: Scenario, said: dict[str, Any], batch_id: str, flag: Path, cut: str
) -> float:
    """Cut the paused dispatcher's connection as ``cut`` says; return when the fault ended."""
    if cut == "terminated":
        terminate(scenario, said)
        return time.monotonic()
    proxy = scenario.proxy
    assert proxy is not None
    ports = [held["port"] for held in said["connections"]]
    holding = sum(proxy.hold_answers(port) for port in ports)
    scenario.expect(holding == len(ports), f"{holding} of the links at {ports} were held")
    held_file(flag).unlink()  # the dispatcher sends its COMMIT, whose answer the proxy holds
    if scenario.wait(
        finished_batch(batch_id), timeout=10, what="the COMMIT whose answer is held to apply"
    ):
        links = callbacks(batch_id)
        scenario.expect(
            links == Counter({"on_success": 1, "on_finish": 1}),
            f"when its COMMIT applied, the batch's callbacks were {dict(links)}",
        )
    cuts = sum(proxy.cut(port=port) for port in ports)
    scenario.expect(cuts == len(ports), f"{cuts} of the links at {ports} were cut")
    return time.monotonic()


def test_a_parent_whose_worker_loses_its_connection_after_its_outcome_strands_no_dependant(
    proxied, tmp_path
):
    flag = tmp_path / "pause-succeeded"
    start_trees(proxied, flag, "job_succeeded")
    with enqueueing_into_the_scenario(), transaction.atomic(using=ALIAS):
        # One transaction: every parent is claimed knowing it has dependants.
        parents = stalwart.enqueue_many(tasks.ledger, [Call(seconds=0.3)] * (8 * SCALE))
        children = [stalwart.enqueue_after([parent], tasks.ledger) for parent in parents]
        gathered = stalwart.enqueue_after(parents, tasks.ledger)
    parent_ids = [parent.id for parent in parents]
    dependant_ids = [child.id for child in children] + [gathered.id]

    said = paused(proxied, flag, what="a worker to pause once a parent's outcome is written")
    ended = time.monotonic()
    try:
        if said is not None:
            proxied.expect(
                said["event"].get("job") in parent_ids, f"paused after another job: {said}"
            )
            terminate(proxied, said)
            ended = time.monotonic()
    finally:
        held_file(flag).unlink(missing_ok=True)  # the paused worker goes on

    every = parent_ids + dependant_ids
    proxied.recover(all_finished(every), since=ended, bound=10, what="every job to finish")
    if said is not None:
        its_work_failed(proxied, said["pid"], "worker")
    for tree in list(proxied.fleet.children):
        proxied.stop(tree)
    rows = {
        str(row["id"]): row
        for row in Job.objects.using(ALIAS)
        .filter(pk__in=every)
        .values("id", "started_at", "finished_at")
    }
    for child, parent in Dependency.objects.using(ALIAS).values_list("child", "parent"):
        child_row, parent_row = rows.get(str(child)), rows.get(str(parent))
        if child_row is None or parent_row is None or child_row["started_at"] is None:
            continue  # counted by the invariants
        proxied.expect(
            parent_row["finished_at"] is not None
            and child_row["started_at"] >= parent_row["finished_at"],
            f"dependant {child} started at {child_row['started_at']}, before its parent "
            f"{parent} finished (at {parent_row['finished_at']})",
        )
    pending = Job.objects.using(ALIAS).filter(status="pending").count()
    proxied.expect(not pending, f"{pending} jobs are left pending")
    proxied.conclude(successful(every))
