"""The invariants every scenario checks, from the ledger and the job table.

- Lost: a job that is gone, or ended failed where the scenario expects success (or the
  reverse).
- Duplicated: a job whose body ran to its end more than once (unless the scenario's fault
  legitimately ended a claim, e.g. a process declared dead), or whose stored result is not
  that of its newest attempt (written by a stale claim).
- Overlapping: two executions of one job running at the same time (allowed only where the
  scenario paused a process or stalled a link; then the stored result must be the other
  attempt's, which the previous rule checks).
- Stuck: a job not finished when the scenario ends, or still claimed after a graceful stop.
- Left behind: process rows after every process stopped gracefully.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field

from stalwart.models import Job, Process
from tests.faults.fleet import alive
from tests.faults.ledger import Execution, Ledger, now
from tests.faults.target import ALIAS

FINAL = ("successful", "failed")


@dataclass
class Counts:
    lost: int = 0
    duplicated: int = 0
    overlapping: int = 0
    stuck: int = 0
    problems: list[str] = field(default_factory=list)

    def add(self, column: str, message: str) -> None:
        setattr(self, column, getattr(self, column) + 1)
        self.problems.append(message)


def finished(ids: list[str]) -> int:
    """How many of these jobs are in a final state."""
    return Job.objects.using(ALIAS).filter(pk__in=ids, status__in=FINAL).count()


def check_jobs(
    ledger: Ledger,
    expected: Mapping[str, str],
    *,
    reruns: bool = False,
    overlap: bool = False,
) -> Counts:
    """Check every job in ``expected`` (id -> the final status the scenario expects)."""
    counts = Counts()
    rows = {
        str(row[0]): row
        for row in Job.objects.using(ALIAS)
        .filter(pk__in=list(expected))
        .values_list("id", "status", "attempt", "return_value")
    }
    runs = ledger.executions()
    moment = now()
    for job, wanted in expected.items():
        row = rows.get(job)
        if row is None:
            counts.add("lost", f"job {job} is gone from the table")
            continue
        _, status, attempt, value = row
        if status not in FINAL:
            counts.add("stuck", f"job {job} is still {status} (attempt {attempt})")
            continue
        if status != wanted:
            counts.add("lost", f"job {job} ended {status}, expected {wanted} (attempt {attempt})")
            continue
        _check_runs(
            counts,
            job=job,
            job_runs=runs.get(job, []),
            status=status,
            attempt=attempt,
            value=value,
            moment=moment,
            reruns=reruns,
            overlap=overlap,
        )
    return counts


def _check_runs(
    counts: Counts,
    *,
    job: str,
    job_runs: list[Execution],
    status: str,
    attempt: int,
    value: object,
    moment: float,
    reruns: bool,
    overlap: bool,
) -> None:
    completed = [run for run in job_runs if run.ended is not None]
    if status == "successful":
        if not completed:
            counts.add("duplicated", f"job {job} is successful but no execution of it finished")
            return
        newest = max(completed, key=lambda run: (run.attempt, run.ended))
        # Ledger tasks return their pid; other tasks' results say nothing of who wrote them.
        if attempt != newest.attempt or (isinstance(value, int) and value != newest.pid):
            counts.add(
                "duplicated",
                f"job {job} holds the result of attempt {attempt} (pid {value}) but its newest "
                f"finished execution is attempt {newest.attempt} in pid {newest.pid}: "
                "a stale claim's result was written",
            )
            return
    attempts = [run.attempt for run in completed]
    if len(set(attempts)) != len(attempts):
        counts.add("duplicated", f"job {job}: one attempt ran to its end twice: {attempts}")
    elif len(completed) > 1 and not reruns:
        counts.add("duplicated", f"job {job} ran to its end {len(completed)} times: {attempts}")
    # A run with no end whose process lives is still running (until now); one whose process
    # is gone ran until its last tick.
    open_until = {run.pid: moment for run in job_runs if run.ended is None and alive(run.pid)}
    for index, first in enumerate(job_runs):
        for second in job_runs[index + 1 :]:
            if first.overlaps(second, open_until=open_until) and not overlap:
                counts.add(
                    "overlapping",
                    f"job {job}: attempt {first.attempt} (pid {first.pid}) and attempt "
                    f"{second.attempt} (pid {second.pid}) ran at the same time",
                )


def check_left_behind(counts: Counts, *, known: Mapping[str, str]) -> None:
    """After every process stopped gracefully: no process row, no claim (``known`` jobs
    were counted already)."""
    rows = list(Process.objects.using(ALIAS).values_list("kind", "pid"))
    if rows:
        counts.problems.append(f"process rows left behind after a graceful stop: {rows}")
    for job, attempt in (
        Job.objects.using(ALIAS).filter(status="running").values_list("id", "attempt")
    ):
        if str(job) in known:
            continue
        counts.add("stuck", f"job {job} is still claimed (attempt {attempt}) after every stop")
