"""A process manager for a standalone ``queue work``: a thread of the test starts it again
whenever it dies, as systemd's ``Restart=always`` or a container's restart policy would.

Bounded: past ``restarts`` restarts it gives up, and says so in the scenario's problems (a
job that kills every worker that takes it must not keep a scenario running for ever).

The thread outlives the block until the last worker it started has exited: a child is
started under ``setpriv --pdeathsig KILL`` (``tests.helpers.Child``), which the kernel sends
when the *thread* that started it ends.
"""

import threading

from tests.faults.scenario import Scenario
from tests.helpers import Child

POLL = 0.05  # seconds between looks at the worker: how soon a death is seen


class KeptRunning:
    """``with KeptRunning(scenario, "--threads", "3") as manager:`` runs ``queue work`` with
    these arguments, restarted whenever it exits, until the block ends; the worker then
    running is ``manager.current`` (the test stops it)."""

    def __init__(self, scenario: Scenario, *args: str, restarts: int = 10, **extra: str) -> None:
        assert scenario.fleet is not None
        self.scenario = scenario
        self.args = args
        self.extra = extra
        self.restarts = restarts
        self.deaths: list[tuple[int, int]] = []  # (pid, exit status) of each worker that died
        self._lock = threading.Lock()
        self._current: Child | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="process-manager", daemon=True)

    @property
    def current(self) -> Child:
        with self._lock:
            assert self._current is not None
            return self._current

    def _start(self) -> None:
        assert self.scenario.fleet is not None
        child = self.scenario.fleet.start("queue", "work", *self.args, **self.extra)
        with self._lock:
            self._current = child

    def __enter__(self) -> "KeptRunning":
        self._start()
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()  # no more restarts; the test stops the worker then running

    def _watch(self) -> None:
        while not self._done.wait(POLL):
            child = self.current
            status = child.process.poll()
            if status is None:
                continue
            self.deaths.append((child.pid, status))
            if len(self.deaths) > self.restarts:
                self.scenario.problems.append(
                    f"the standalone worker died {len(self.deaths)} times (exit statuses "
                    f"{[code for _, code in self.deaths]}); the process manager gave up"
                )
                return
            self._start()
        # Until the last worker exits (stopped by the test, or killed with the scenario).
        self.current.process.wait()
