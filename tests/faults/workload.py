"""What the scenarios enqueue and watch: ledger jobs, and the state of a process tree."""

import json
import re
import time

from django.db.models import Count
from prometheus_client.parser import text_string_to_metric_families

from stalwart import Call
from stalwart.backend import StalwartBackend
from stalwart.models import Counter, Job, Process, RecurringRun
from tests.faults.invariants import finished
from tests.faults.scenario import SCALE, Scenario
from tests.faults.target import ALIAS, ALIVE
from tests.helpers import Child
from tests.testapp import tasks
from tests.testapp.models import Execution


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


# -- environment interruptions (test_environment_interruptions.py) ----------------------------


def insert_jobs(scenario: Scenario, count: int) -> list[str]:
    """Enqueue ``count`` jobs that each INSERT one row through the ORM (ledgered)."""
    assert scenario.target is not None
    return scenario.target.enqueue_many(tasks.ledger_insert, [Call()] * count)


def backend_with(**options: object) -> StalwartBackend:
    """A backend that enqueues into the scenario's database with these options (say, a
    ``max_attempts`` of its own for tasks that set none)."""
    return StalwartBackend("default", {"QUEUES": [], "OPTIONS": {"database": ALIAS, **options}})


def jobs_by_id(ids: list[str]) -> dict[str, dict]:
    """Each job's status, attempt, errors, interruptions and budgets, by id."""
    columns = ("id", "status", "attempt", "errors", "interruptions", "max_attempts")
    rows = Job.objects.using(ALIAS).filter(pk__in=ids).values(*columns, "max_interruptions")
    return {str(row["id"]): row for row in rows}


def inserted_rows(ids: list[str]) -> dict[str, int]:
    """How many rows each job's body has committed (``tasks.ledger_insert``)."""
    rows = (
        Execution.objects.using(ALIAS)
        .filter(job_id__in=ids)
        .values("job_id")
        .annotate(rows=Count("id"))
        .values_list("job_id", "rows")
    )
    return dict(rows)


# The events at either end of an outage, by loop: a role's main loop, its heartbeat, its
# LISTEN connection.
OUTAGE_ENDS = {
    "database_unavailable": "database_recovered",
    "heartbeat_failed": "heartbeat_recovered",
    "listener_failed": "listener_recovered",
}
LOG_LINE = re.compile(r"^\S+ \S+ (\d+) \w+ stalwart action=(\w+)")


def back_from_outage(child: Child, pid: int) -> bool:
    """Whether process ``pid`` (its lines in ``child``'s output: the test settings' log lines
    carry the pid where the event happened) logged an outage, and the end of every outage it
    logged."""
    last: dict[str, str] = {}  # the outage event, by loop: the last of its start and end
    for line in child.output.splitlines():
        found = LOG_LINE.match(line)
        if found is None or int(found[1]) != pid:
            continue
        action = found[2]
        for start, end in OUTAGE_ENDS.items():
            if action in (start, end):
                last[start] = action
    return bool(last) and all(action == OUTAGE_ENDS[start] for start, action in last.items())


Counters = dict[tuple[str, str, str], float]  # (sample, queue, task) -> value


def stored_counters() -> Counters:
    """The counters in ``stalwart_counter`` now, by name (``failed``), queue and task."""
    rows = Counter.objects.using(ALIAS).filter(le="")
    return {
        (name, queue, task): value
        for name, queue, task, value in rows.values_list("name", "queue_name", "task_path", "value")
    }


def exposed_counters(scenario: Scenario) -> Counters:
    """The job counters as ``queue metrics`` prints them (what the metrics view serves), by
    sample name (``stalwart_jobs_failed_total``), queue and task."""
    assert scenario.fleet is not None
    child = scenario.fleet.start("queue", "metrics")
    code = child.wait(timeout=60)
    scenario.expect(code == 0, f"queue metrics exited {code}:\n{child.output}")
    text = "\n".join(
        line for line in child.output.splitlines() if line.startswith(("# ", "stalwart_"))
    )
    found: Counters = {}
    for family in text_string_to_metric_families(text + "\n"):
        for sample in family.samples:
            if sample.name.startswith("stalwart_jobs_") and sample.name.endswith("_total"):
                labels = sample.labels
                found[(sample.name, labels.get("queue", ""), labels.get("task", ""))] = sample.value
    return found
