"""The example project run as a user runs it: migrate, check, queue status, the demo, and
every page of the dashboard, each in a process of its own.

In scripts/test's wheel leg these run against the wheel installed in a fresh virtualenv,
with the source tree not importable (``STALWART_INSTALLED_FROM`` names that virtualenv): a
template, a static file or a migration left out of the wheel fails here.
"""

import json
import os
import textwrap
from pathlib import Path

import pytest

import stalwart
from tests.helpers import ROOT, Child, child_env

# The dashboard's own pages: the admin's changelist, the overview, the jobs of each state,
# one job, the processes and the recurring tasks (tests/dashboard tests what they show).
FETCH_EVERY_PAGE = textwrap.dedent(
    """
    import json
    from django.contrib.auth import get_user_model
    from django.contrib.staticfiles import finders
    from django.test import Client
    from django.urls import reverse
    from stalwart.browsing import STATES
    from stalwart.models import Job

    user = get_user_model().objects.create_superuser("operator", "op@example.com", "pw")
    client = Client()
    client.force_login(user)
    urls = [reverse("admin:stalwart_dashboard_changelist"),
            reverse("admin:stalwart_overview", args=["default"]),
            reverse("admin:stalwart_processes", args=["default"]),
            reverse("admin:stalwart_recurring", args=["default"])]
    urls += [reverse("admin:stalwart_jobs", args=["default", state]) for state in STATES]
    urls += [reverse("admin:stalwart_job", args=["default", job.id]) for job in Job.objects.all()]
    statuses = {url: client.get(url, follow=True).status_code for url in urls}
    script = finders.find("stalwart/dashboard/refresh.js")
    print(json.dumps({"statuses": statuses, "refresh.js": script}))
    """
)

SETTINGS = textwrap.dedent(
    """
    # The demo project with the admin, for the dashboard.
    from demo_project.settings import *  # noqa: F403

    INSTALLED_APPS = [
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django.contrib.staticfiles",
        *INSTALLED_APPS,
    ]
    ROOT_URLCONF = "dashboard_urls"
    ALLOWED_HOSTS = ["testserver"]
    STATIC_URL = "/static/"
    MIDDLEWARE = [
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
    ]
    TEMPLATES = [
        {
            "BACKEND": "django.template.backends.django.DjangoTemplates",
            "APP_DIRS": True,
            "OPTIONS": {
                "context_processors": [
                    "django.template.context_processors.request",
                    "django.contrib.auth.context_processors.auth",
                    "django.contrib.messages.context_processors.messages",
                ]
            },
        }
    ]
    """
)

URLS = textwrap.dedent(
    """
    from django.contrib import admin
    from django.urls import path

    urlpatterns = [path("admin/", admin.site.urls)]
    """
)


def installed_from() -> Path | None:
    """The virtualenv the wheel leg installed the wheel into, or None in the other legs."""
    where = os.environ.get("STALWART_INSTALLED_FROM")
    return Path(where).resolve() if where else None


@pytest.mark.skipif(installed_from() is None, reason="only in scripts/test's wheel leg")
def test_stalwart_is_the_installed_wheel_not_the_source_tree():
    venv = installed_from()
    assert venv is not None
    package = Path(stalwart.__file__).resolve()
    assert package.is_relative_to(venv), f"stalwart imported from {package}, not from {venv}"
    assert "site-packages" in package.parts
    assert not (ROOT / "src").exists(), "the run's copy of the tree must hold no src/"


def run(*args: str, env: dict[str, str], timeout: float = 120) -> str:
    with Child(*args, env=env) as child:
        assert child.wait(timeout=timeout) == 0, child.output
        assert "Traceback" not in child.output, child.output
        return child.output


@pytest.mark.any_database
def test_the_example_project_migrates_checks_works_and_serves_every_dashboard_page(tmp_path):
    """On SQLite, as the demo runs (one host): the package's migrations, commands,
    templates and static files, from wherever stalwart is installed."""
    (tmp_path / "dashboard_settings.py").write_text(SETTINGS)
    (tmp_path / "dashboard_urls.py").write_text(URLS)
    env = child_env(
        DJANGO_SETTINGS_MODULE="dashboard_settings",
        PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT / "example")]),
        STALWART_DEMO_DB=str(tmp_path / "demo.sqlite3"),
    )
    env.pop("DATABASE_URL", None)
    migrated = run("migrate", env=env)
    assert "Applying stalwart.0001_initial... OK" in migrated
    assert "Applying stalwart.0011_interruptions... OK" in migrated
    assert "System check identified no issues" in run("check", env=env)
    assert "no jobs waiting, running or failed" in run("queue", "status", env=env)
    run("demo", env=env)  # enqueues and works jobs: successful ones and one failed
    fetched = json.loads(run("shell", "-c", FETCH_EVERY_PAGE, env=env).splitlines()[-1])
    assert len(fetched["statuses"]) >= 10, fetched
    assert set(fetched["statuses"].values()) == {200}, fetched
    script = Path(fetched["refresh.js"])
    assert script.is_file()
    assert script.is_relative_to(Path(stalwart.__file__).resolve().parent), script
