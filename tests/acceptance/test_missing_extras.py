"""An optional dependency that is not installed: one line naming the extra to install,
never a traceback. Each command runs in a process where the module cannot be imported
(tests/without.py sets it to None in sys.modules, as Python does for a missing module)."""

import pytest

from tests.helpers import Child, child_env

pytestmark = pytest.mark.any_database


def run_without(modules: str, *args: str, **env: str) -> Child:
    with Child(modules, *args, env=child_env(**env), module="tests.without") as child:
        child.wait(timeout=60)
    return child


def test_queue_metrics_without_prometheus_client_names_the_extra():
    metrics = run_without("prometheus_client", "queue", "metrics")
    assert metrics.process.returncode == 1, metrics.output
    assert metrics.output.strip() == (
        "CommandError: prometheus_client is not installed: "
        "pip install 'django-stalwart[prometheus]'."
    )


def test_the_metrics_view_without_prometheus_client_answers_501_naming_the_extra():
    shell = run_without(
        "prometheus_client",
        "shell",
        "--no-imports",
        "-c",
        "from django.test import RequestFactory\n"
        "from stalwart.metrics.views import metrics\n"
        "response = metrics(RequestFactory().get('/metrics'))\n"
        "print(response.status_code, response.content.decode(), end='')\n",
    )
    assert shell.process.returncode == 0, shell.output
    assert shell.output == (
        "501 prometheus_client is not installed: pip install 'django-stalwart[prometheus]'\n"
    )


@pytest.mark.parametrize(
    ("database", "modules", "line"),
    [
        (
            "mysql",
            "MySQLdb",
            (
                "error: DATABASES['default'] uses django.db.backends.mysql, whose driver "
                '(mysqlclient) is not installed: pip install "django-stalwart[mysql]"'
            ),
        ),
        (
            "postgresql",
            "psycopg,psycopg2",
            (
                "error: DATABASES['default'] uses django.db.backends.postgresql, whose driver "
                '(psycopg) is not installed: pip install "django-stalwart[postgresql]"'
            ),
        ),
    ],
)
@pytest.mark.parametrize("command", [("check",), ("migrate",), ("queue", "work")])
def test_a_database_without_its_driver_names_the_extra(database, modules, line, command):
    """Django would load the driver while the apps' models are imported, and end in a
    traceback; Stalwart's app config speaks first (no server is needed to see it)."""
    missing = run_without(modules, *command, STALWART_TEST_DATABASE=database)
    assert missing.process.returncode == 1, missing.output
    assert missing.output.strip() == line
