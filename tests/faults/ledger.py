"""The ledger: an append-only file in which fault tasks record every execution.

One line per start and per end: ``start|end <job id> <attempt> <pid> <monotonic>``; while
it runs, a ``tick`` line every ``TICK`` seconds (so a run that never ends, its process killed,
is known to have run at least until its last tick); and ``spawned <job id> <attempt> <pid>
<child pid>`` for processes a task starts. The file is
named by ``STALWART_LEDGER``. Each line is one ``write()`` on an ``O_APPEND`` descriptor,
so lines from many processes and threads never interleave. ``CLOCK_MONOTONIC`` is shared
by every process on the host (``FAKETIME_DONT_FAKE_MONOTONIC=1`` keeps it so under
``faketime``), which makes times from different processes comparable.
"""

import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

ENV = "STALWART_LEDGER"
TICK = 0.1


def now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def append(kind: str, job: str, attempt: int, *extra: object) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    fields = " ".join(str(value) for value in (kind, job, attempt, os.getpid(), *extra))
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(descriptor, f"{fields}\n".encode())
    finally:
        os.close(descriptor)


@dataclass
class Execution:
    """One run of a job's body: from its start line to its end line (None: never ended)."""

    job: str
    attempt: int
    pid: int
    started: float
    ended: float | None = None
    last_seen: float = 0.0  # the last sign of life: start, tick or end

    def overlaps(self, other: "Execution", *, open_until: dict[int, float]) -> bool:
        """Whether the two ran at the same time. A run that never ended ran until
        ``open_until[pid]`` (now, for a live process), else until its last tick."""
        return self.started < other.until(open_until) and other.started < self.until(open_until)

    def until(self, open_until: dict[int, float]) -> float:
        if self.ended is not None:
            return self.ended
        return open_until.get(self.pid, self.last_seen)


@dataclass
class Ledger:
    path: Path

    def lines(self) -> list[list[str]]:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return []
        return [line.split() for line in text.splitlines() if line.strip()]

    def executions(self) -> dict[str, list[Execution]]:
        """Every execution, per job id, in order of start."""
        runs: dict[str, list[Execution]] = defaultdict(list)
        open_runs: dict[tuple[str, int, int], Execution] = {}
        for fields in self.lines():
            kind, job, attempt, pid = fields[0], fields[1], int(fields[2]), int(fields[3])
            if kind == "start":
                run = Execution(job, attempt, pid, float(fields[4]), last_seen=float(fields[4]))
                runs[job].append(run)
                open_runs[(job, attempt, pid)] = run
            elif kind in ("tick", "end"):
                run = open_runs.get((job, attempt, pid))
                if run is not None:
                    run.last_seen = float(fields[4])
                    if kind == "end":
                        run.ended = run.last_seen
                        del open_runs[(job, attempt, pid)]
        for job_runs in runs.values():
            job_runs.sort(key=lambda run: run.started)
        return dict(runs)

    def spawned(self) -> list[int]:
        """Pids of the processes that tasks started."""
        return [int(fields[4]) for fields in self.lines() if fields[0] == "spawned"]

    def started_count(self) -> int:
        return sum(1 for fields in self.lines() if fields[0] == "start")

    def ended_count(self) -> int:
        return sum(1 for fields in self.lines() if fields[0] == "end")
