"""Fixtures of the fault suite: the private cluster, a fresh database per scenario, the proxy,
and the report printed at the end of the run (and written to ``.faults-report.txt``).

Missing capabilities (no PostgreSQL binaries, not root for a tmpfs, no libfaketime) skip the
scenarios that need them, saying which; with ``CI=true`` they fail instead.
"""

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.faults import report as faults_report
from tests.faults.cluster import ClusterUnavailable, PrivateCluster, prepare
from tests.faults.fleet import faketime_library
from tests.faults.proxy import Proxy
from tests.faults.scenario import Scenario
from tests.faults.target import Databases

IN_CI = os.environ.get("CI") == "true"

# pytest-timeout, per scenario: a scenario restarts a cluster, waits out heartbeat deadlines
# and leases, and may run a minute or more; a hang still ends here, not at CI's limit.
SCENARIO_TIMEOUT = 900


def missing(reason: str) -> None:
    """A capability this machine lacks: a skip here, a failure in CI."""
    if IN_CI:
        pytest.fail(f"{reason} (with CI=true the fault suite must run whole)")
    pytest.skip(reason)


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.faults)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(SCENARIO_TIMEOUT))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    setattr(item, f"rep_{rep.when}", rep)
    return rep


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":  # by then the row is in, whatever happened
        faults_report.collect(report.user_properties)


def pytest_terminal_summary(terminalreporter) -> None:
    if hasattr(terminalreporter.config, "workerinput") or not faults_report.ROWS:
        return  # a pytest-xdist worker: the controller reports
    text = faults_report.write(sorted(faults_report.ROWS, key=lambda row: row.scenario))
    terminalreporter.section("fault suite")
    terminalreporter.write_line(text)
    terminalreporter.write_line(f"(also written to {faults_report.REPORT_FILE})")


@pytest.fixture(autouse=True)
def _database_access(django_db_blocker) -> Iterator[None]:
    """The scenarios use databases of their own, not pytest-django's test database."""
    with django_db_blocker.unblock():
        yield


@pytest.fixture(scope="session", autouse=True)
def busy_cpu() -> Iterator[None]:
    """With ``STALWART_FAULTS_BUSY=1``, a busy loop per core runs beside the scenarios: each
    must hold on a machine whose every core is taken (``scripts/soak --busy`` does this)."""
    if os.environ.get("STALWART_FAULTS_BUSY") != "1":
        yield
        return
    loops = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])  # a core kept busy
        for _ in range(os.cpu_count() or 1)
    ]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("faults")


@pytest.fixture(scope="session")
def cluster() -> Iterator[PrivateCluster]:
    try:
        private = PrivateCluster()
    except ClusterUnavailable as error:
        missing(f"no private PostgreSQL cluster: {error}")
    try:
        private.start()
        prepare(private)
    except BaseException:
        private.destroy()
        raise
    try:
        yield private
    finally:
        private.destroy()


@pytest.fixture(scope="session")
def pg_databases(workdir: Path, cluster: PrivateCluster) -> Databases:
    return Databases(workdir / "postgresql", cluster)


@pytest.fixture(scope="session")
def sqlite_databases(workdir: Path) -> Databases:
    path = workdir / "sqlite"
    path.mkdir()
    return Databases(path, None)


@pytest.fixture
def scenario(request: pytest.FixtureRequest, workdir: Path) -> Iterator[Scenario]:
    name = request.node.name.removeprefix("test_")
    current = Scenario(name, workdir, request.node.user_properties)
    try:
        yield current
    finally:
        current.close()
        if not current.concluded:
            phases = [getattr(request.node, f"rep_{when}", None) for when in ("setup", "call")]
            skipped = any(phase is not None and phase.skipped for phase in phases)
            current.record("SKIP" if skipped else "ERROR")


@pytest.fixture
def pg(scenario: Scenario, pg_databases: Databases) -> Scenario:
    """A scenario on a fresh PostgreSQL database of the private cluster, connected directly."""
    return scenario.open(pg_databases.postgresql())


@pytest.fixture
def proxied(scenario: Scenario, pg_databases: Databases, cluster: PrivateCluster) -> Scenario:
    """A scenario whose processes reach PostgreSQL through the proxy (``scenario.proxy``)."""
    scenario.proxy = Proxy(cluster.host, cluster.port)
    return scenario.open(pg_databases.postgresql(port=scenario.proxy.port))


@pytest.fixture(params=["postgresql", "sqlite"])
def any_db(request: pytest.FixtureRequest, scenario: Scenario) -> Scenario:
    """The scenario on PostgreSQL, then on SQLite."""
    if request.param == "postgresql":
        databases = request.getfixturevalue("pg_databases")
        return scenario.open(databases.postgresql())
    return scenario.open(request.getfixturevalue("sqlite_databases").sqlite())


@pytest.fixture
def faketime() -> str:
    library = faketime_library()
    if library is None:
        missing("libfaketime is not installed (Debian: apt-get install faketime)")
    return library


@pytest.fixture
def root() -> None:
    if os.geteuid() != 0:
        missing("not root: cannot mount a tmpfs")
