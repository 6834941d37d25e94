"""Every code sample of the tutorial and the how-to guides runs, so that the docs cannot
drift from the code: each page's samples run in order in a Django project of their own
(``project.py``), by ``runner.py``; ``samples.py`` says how a page marks what cannot run.

The samples that do not run are each listed as a skipped test, with the page's reason.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs import project
from tests.docs.samples import DOCS, PAGES, RUN, parse, skipped, unchecked

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.any_database

PAGE_TIMEOUT = 300  # seconds, for all of a page's samples


def _server_up(vendor: str) -> str | None:
    """None if this machine's server for ``vendor`` answers, else why not."""
    try:
        if vendor == "postgresql":
            import psycopg

            psycopg.connect(
                host=os.environ.get("PGHOST", "127.0.0.1"),
                port=os.environ.get("PGPORT", "5432"),
                user=os.environ.get("PGUSER", "postgres"),
                password=os.environ.get("PGPASSWORD", ""),
                dbname="postgres",
                connect_timeout=3,
            ).close()
        else:
            import MySQLdb

            MySQLdb.connect(
                host=os.environ.get("MYSQL_HOST", "127.0.0.1"),
                port=int(os.environ.get("MYSQL_PORT", "3306")),
                user=os.environ.get("MYSQL_USER", "root"),
                password=os.environ.get("MYSQL_PASSWORD", ""),
                connect_timeout=3,
            ).close()
    except Exception as error:  # noqa: BLE001 - any failure to connect: the reason
        return f"{type(error).__name__}: {error}"
    return None


def _drop_databases(vendor: str, prefix: str) -> None:
    if vendor == "postgresql":
        import psycopg

        with psycopg.connect(
            host=os.environ.get("PGHOST", "127.0.0.1"),
            port=os.environ.get("PGPORT", "5432"),
            user=os.environ.get("PGUSER", "postgres"),
            password=os.environ.get("PGPASSWORD", ""),
            dbname="postgres",
            autocommit=True,
        ) as server:
            names = server.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", [f"{prefix}%"]
            ).fetchall()
            for (name,) in names:
                server.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
    else:
        import MySQLdb

        server = MySQLdb.connect(
            host=os.environ.get("MYSQL_HOST", "127.0.0.1"),
            port=int(os.environ.get("MYSQL_PORT", "3306")),
            user=os.environ.get("MYSQL_USER", "root"),
            password=os.environ.get("MYSQL_PASSWORD", ""),
        )
        try:
            cursor = server.cursor()
            cursor.execute("SHOW DATABASES LIKE %s", [f"{prefix}%"])
            for (name,) in cursor.fetchall():
                cursor.execute(f"DROP DATABASE `{name}`")
        finally:
            server.close()


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database with every migration applied, copied into each page's project
    (migrating once, not once per page)."""
    directory = tmp_path_factory.mktemp("docs-template")
    project.build([], directory)
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--verbosity", "0"],
        cwd=directory,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(directory), str(ROOT)]),
            "DJANGO_SETTINGS_MODULE": "mysite.settings",
        },
        capture_output=True,
        text=True,
        timeout=PAGE_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return directory / "db.sqlite3"


@pytest.mark.parametrize("page", PAGES)
def test_the_samples_of_a_page_run_as_shown(page, tmp_path, migrated_sqlite):
    blocks = parse(page)
    runnable = [block for block in blocks if block.lang in RUN and not block.skip_reason]
    if not runnable:
        pytest.skip(f"docs/{page} has no sample that runs (each skip is listed on its own)")
    for vendor in sorted(project.servers_needed(blocks)):
        reason = _server_up(vendor)
        if reason is not None:
            if os.environ.get("CI") == "true":
                pytest.fail(f"docs/{page} needs {vendor}, which does not answer: {reason}")
            pytest.skip(f"docs/{page} needs {vendor}, which does not answer: {reason}")
    directory = tmp_path / "project"
    project.build(blocks, directory)
    shutil.copyfile(migrated_sqlite, directory / "db.sqlite3")
    plan = tmp_path / "plan.json"
    report_path = tmp_path / "report.json"
    plan.write_text(project.plan(blocks))
    slug = re.sub(r"\W", "_", page.removesuffix(".md"))
    prefix = f"docs_{os.getpid()}_{slug}"[:50]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(directory), str(ROOT)]),
        "DJANGO_SETTINGS_MODULE": "mysite.settings",
        "DOCS_SAMPLES_DATABASE_PREFIX": prefix,
    }
    try:
        done = subprocess.run(
            [sys.executable, "-m", "tests.docs.runner", str(plan), str(report_path)],
            cwd=directory,
            env=env,
            capture_output=True,
            text=True,
            timeout=PAGE_TIMEOUT,
            check=False,
        )
    finally:
        for vendor in project.servers_needed(blocks):
            _drop_databases(vendor, prefix)
    if not report_path.exists():
        pytest.fail(f"the runner ended without a report:\n{done.stdout}{done.stderr}")
    report = json.loads(report_path.read_text())
    failure = report["failure"]
    if failure is not None:
        pytest.fail(
            f"{failure['where']}: the sample does not do what the page says "
            f"({report['ran']} step(s) before it ran):\n{failure['error']}",
            pytrace=False,
        )


@pytest.mark.parametrize("block", skipped(), ids=lambda block: block.where)
def test_a_sample_that_cannot_run_says_why(block):
    pytest.skip(f"{block.where}: {block.skip_reason}")


@pytest.mark.parametrize("block", unchecked(), ids=lambda block: block.where)
def test_a_sample_whose_output_is_not_compared_says_why(block):
    directive = block.directive("output-unchecked")
    assert directive is not None
    pytest.skip(f"{block.where}: runs, output not compared: {directive.argument}")


def test_every_page_with_samples_is_read():
    """The tutorial and the how-to guides are all there, and their comments parse."""
    assert "tutorial/quickstart.md" in PAGES
    assert len([page for page in PAGES if page.startswith("how-to/")]) >= 20
    for page in PAGES:
        parse(page)  # raises SampleError naming the line of a malformed comment
    assert DOCS.is_dir()
