"""One scenario's bookkeeping: its database, processes, ledger, problems and report row.

A scenario never stops at its first broken promise: bounded waits that time out, and checks
that fail, are noted as problems; ``conclude()`` then checks the ledger invariants, records
the report row and fails the test with every problem at once.
"""

import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.faults import report
from tests.faults.fleet import Fleet, quietly
from tests.faults.invariants import Counts, check_jobs, check_left_behind
from tests.faults.ledger import Ledger
from tests.faults.proxy import Proxy
from tests.faults.target import Target
from tests.helpers import Child

OUTPUT_LINES = 60  # of each process, in a failure message
# The soak (scripts/soak) drains STALWART_FAULTS_SCALE times more jobs, in as many times the
# time.
SCALE = max(int(os.environ.get("STALWART_FAULTS_SCALE", "1")), 1)


class Scenario:
    def __init__(self, name: str, workdir: Path, rows: list) -> None:
        self.name = name
        self.rows = rows  # where the report row goes (the test's user_properties)
        self.workdir = workdir
        self.target: Target | None = None
        self.fleet: Fleet | None = None
        self.ledger: Ledger | None = None
        self.proxy: Proxy | None = None
        self.problems: list[str] = []
        self.recovery: float | None = None
        self.bound: float | None = None
        self.counts: Counts | None = None
        self.concluded = False

    def open(self, target: Target) -> "Scenario":
        """Use ``target`` for this scenario: watch it, and start processes against it."""
        self.target = target
        target.attach()
        path = self.workdir / f"{target.vendor}-{target.name.rsplit('/', 1)[-1]}.ledger"
        self.ledger = Ledger(path)
        self.fleet = Fleet(target, path)
        return self

    # -- waiting and checking -----------------------------------------------------------------

    def wait(self, condition: Callable[[], Any], *, timeout: float, what: str) -> bool:
        """Poll ``condition`` (database errors count as not yet) for up to ``timeout`` s;
        note a problem and return False if it never holds."""
        probe = quietly(condition)
        deadline = time.monotonic() + timeout
        delay = 0.01
        while True:
            if probe():
                return True
            if time.monotonic() >= deadline:
                self.problems.append(f"timed out after {timeout:g} s waiting for {what}")
                return False
            time.sleep(delay)  # polling a condition with a deadline
            delay = min(delay * 2, 0.1)

    def recover(
        self, condition: Callable[[], Any], *, since: float, bound: float, what: str
    ) -> bool:
        """Wait for ``condition``; the time from ``since`` (monotonic) is the recovery time,
        and must stay within ``bound`` seconds (times the soak's scale: more jobs)."""
        bound *= SCALE
        self.bound = bound
        remaining = max(bound - (time.monotonic() - since), 0.1)
        ok = self.wait(condition, timeout=remaining, what=f"{what} (bound {bound:g} s)")
        self.recovery = time.monotonic() - since if ok else None
        return ok

    def expect(self, ok: object, message: str) -> bool:
        if not ok:
            self.problems.append(message)
        return bool(ok)

    def stop(
        self,
        child: Child,
        signum: int = signal.SIGTERM,
        *,
        timeout: float = 30,
        status: int | None = 0,
    ) -> int | None:
        """Stop ``child`` with ``signum``; note a problem unless it exits in time, with
        ``status`` (None: any status)."""
        child.signal(signum)
        try:
            code = child.wait(timeout=timeout)
        except AssertionError:
            self.problems.append(f"{' '.join(child.args)} did not exit within {timeout:g} s")
            return None
        self.expect(
            status is None or code == status,
            f"{' '.join(child.args)} exited {code} after {signal.Signals(signum).name}, "
            f"expected {status}",
        )
        return code

    # -- the end ------------------------------------------------------------------------------

    def conclude(
        self,
        expected: Mapping[str, str],
        *,
        reruns: bool = False,
        overlap: bool = False,
        stopped: bool = True,
    ) -> None:
        """Check the invariants, record the report row, fail with every problem found.

        ``expected``: job id -> final status. ``reruns``: the fault may legitimately end a
        claim (a job body may then finish twice, one result discarded). ``overlap``: the
        fault froze a process or a link (two runs may overlap; the stale one discarded).
        ``stopped``: every process was stopped gracefully (nothing may be left behind).
        """
        assert self.ledger is not None
        counts = check_jobs(self.ledger, expected, reruns=reruns, overlap=overlap)
        if stopped:
            check_left_behind(counts, known=expected)
        self.counts = counts
        self.concluded = True
        problems = self.problems + counts.problems
        self.record("PASS" if not problems else "FAIL")
        if os.environ.get("STALWART_FAULTS_SHOW"):  # the processes' output, even on success
            print(self.output_tail())  # noqa: T201 - asked for
        if problems:
            raise AssertionError(
                f"{len(problems)} broken promise(s) in scenario {self.name}:\n- "
                + "\n- ".join(problems)
                + "\n\n"
                + self.output_tail()
            )

    def record(self, result: str) -> None:
        counts = self.counts
        self.rows.append(
            report.as_property(
                report.Row(
                    scenario=self.name,
                    lost=counts.lost if counts else None,
                    duplicated=counts.duplicated if counts else None,
                    overlapping=counts.overlapping if counts else None,
                    stuck=counts.stuck if counts else None,
                    recovery=self.recovery,
                    bound=self.bound,
                    result=result,
                )
            )
        )

    def output_tail(self) -> str:
        if self.fleet is None:
            return ""
        parts = []
        for child in self.fleet.children:
            lines = child.output.splitlines()
            parts.append(
                f"--- {' '.join(child.args)} (pid {child.pid}), last {OUTPUT_LINES} lines ---\n"
                + "\n".join(lines[-OUTPUT_LINES:])
            )
        return "\n".join(parts)

    def close(self) -> None:
        if self.fleet is not None:
            self.fleet.close()
        if self.proxy is not None:
            self.proxy.close()
        if self.target is not None:
            self.target.detach()
