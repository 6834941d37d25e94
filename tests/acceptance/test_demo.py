"""The demo project (``scripts/demo``): it runs, and its one failure says it is on purpose."""

import pytest

from tests.helpers import ROOT, Child, child_env


@pytest.mark.any_database
def test_the_demo_shows_its_failure_as_on_purpose_without_a_traceback(tmp_path, vendor):
    if vendor != "sqlite":
        pytest.skip("the demo runs on SQLite, whatever the suite runs on")
    env = child_env(
        DJANGO_SETTINGS_MODULE="demo_project.settings",
        PYTHONPATH=str(ROOT / "example"),
        STALWART_DEMO_DB=str(tmp_path / "demo.sqlite3"),
    )
    with Child("migrate", "--verbosity", "0", env=env) as migrate:
        assert migrate.wait(timeout=120) == 0, migrate.output
    with Child("demo", env=env) as demo:
        assert demo.wait(timeout=120) == 0, demo.output
    output = demo.output
    assert "Traceback" not in output, output
    failure = [line for line in output.splitlines() if "FAILED" in line]
    expected = (
        "  charge_card          FAILED     RuntimeError: card declined for order 1002  "
        "(this job fails on purpose)"
    )
    assert failure == [expected]
    [logged] = [line for line in output.splitlines() if "action=job_failed" in line]
    assert logged.endswith("error=builtins.RuntimeError  (this job fails on purpose)")
    assert output.count("SUCCESSFUL") == 8
