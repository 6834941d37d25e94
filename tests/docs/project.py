"""The Django project a page's samples run in: what ``django-admin startproject mysite``
writes, with Stalwart added as the quickstart adds it, then the page's own settings.

``build(page, directory)`` writes it. The settings module it writes calls back into this
module (``installed_apps``, ``databases``), so that a page's settings stay as the page shows
them while the project stays runnable here: ``INSTALLED_APPS = [# ..., "stalwart"]`` keeps
the apps it elides, ``"default": {...}`` is the project's database as it was, and a
PostgreSQL or MySQL database of the page is one of this machine's servers (PGHOST...,
MYSQL_HOST...), under a name of the test's own.
"""

import json
import os
from pathlib import Path
from typing import Any

from tests.docs.samples import DEFAULT_MODULE, Block

PROJECT = "mysite"
BASE_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "stalwart",
]

MANAGE = '''#!/usr/bin/env python
"""Django's command-line utility for administrative tasks."""
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
'''

BASE_SETTINGS = '''"""The docs' sample project (tests/docs/project.py): startproject's
settings, Stalwart added as the quickstart adds it, then the page's settings."""

from pathlib import Path

from tests.docs import project as _samples

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "django-insecure-docs-samples"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost"]
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "stalwart",
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]
ROOT_URLCONF = "mysite.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": BASE_DIR / "db.sqlite3",
    }
}
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast logins

TASKS = {
    "default": {
        "BACKEND": "stalwart.backend.StalwartBackend",
        "QUEUES": [],
    }
}
'''

URLS = """from django.contrib import admin
from django.urls import path

urlpatterns = [path("admin/", admin.site.urls)]
"""

FOOTER = """
# -- the sample runner's (tests/docs/project.py): elided apps and databases filled in --------
INSTALLED_APPS = _samples.installed_apps(INSTALLED_APPS, {apps!r})
DATABASES = _samples.databases(DATABASES, BASE_DIR)
"""


def file_target(path: str) -> str:
    """Where a page's ``# PATH.py`` goes in the project (``urls.py`` is the project's)."""
    return f"{PROJECT}/{path}" if path in ("urls.py", "settings.py") else path


def build(page_blocks: list[Block], directory: Path) -> list[str]:
    """Write the project for a page's blocks into ``directory``; return its apps."""
    (directory / PROJECT).mkdir(parents=True)
    (directory / "manage.py").write_text(MANAGE)
    (directory / PROJECT / "__init__.py").write_text("")
    (directory / PROJECT / "urls.py").write_text(URLS)
    settings = [BASE_SETTINGS]
    files: dict[str, list[str]] = {}
    modules = {DEFAULT_MODULE}
    for block in page_blocks:
        if block.skip_reason:
            continue
        for directive in block.directives:
            if directive.kind == "file":
                files.setdefault(file_target(directive.argument), []).append(directive.text)
        kind = block.kind
        if kind == "settings":
            settings.append(
                f"\n# -- docs/{block.page}:{block.line}\n_before = _samples.snapshot(globals())\n"
                f"{block.text}\n_samples.fill_elided(globals(), _before)\n"
            )
        elif kind == "options":
            settings.append(
                f"\n# -- docs/{block.page}:{block.line}\n"
                f"_samples.add_options(TASKS, {{\n{block.text}\n}})\n"
            )
        elif kind == "file":
            files.setdefault(file_target(block.file_path or ""), []).append(block.text)
        elif kind == "code":
            modules.add(block.module)
    for path, parts in files.items():
        target = directory / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("\n\n".join(parts) + "\n")
    apps = []
    for path in sorted({*files, *modules}):
        parts = Path(path).parts
        for depth in range(1, len(parts)):
            package = directory.joinpath(*parts[:depth])
            package.mkdir(parents=True, exist_ok=True)
            (package / "__init__.py").touch()
        app = parts[0]
        if len(parts) > 1 and app != PROJECT and Path(path).name in ("tasks.py", "apps.py"):
            apps.append(app)
    apps = sorted(set(apps))
    settings.append(FOOTER.format(apps=apps))
    (directory / PROJECT / "settings.py").write_text("".join(settings))
    return apps


# -- called by the settings module it writes -------------------------------------------------


def installed_apps(apps: list[str], extra: list[str]) -> list[str]:
    """The page's ``INSTALLED_APPS``, with the apps its ``# ...`` elides, and its own apps."""
    merged = list(BASE_APPS)
    for app in [*apps, *extra]:
        if app not in merged:
            merged.append(app)
    return merged


def add_options(tasks: dict[str, Any], options: dict[str, Any]) -> None:
    """Add a page's ``"key": value,`` entries to ``TASKS["default"]["OPTIONS"]``: a dict
    (``"recurring": {...}``) adds its entries to the one there, anything else replaces."""
    current = tasks["default"].setdefault("OPTIONS", {})
    for key, value in options.items():
        if isinstance(value, dict) and isinstance(current.get(key), dict):
            current[key] = {**current[key], **value}
        else:
            current[key] = value


def snapshot(settings: dict[str, Any]) -> dict[str, Any]:
    """The dict settings (``TASKS``, ``DATABASES``) as they are before a page's piece."""
    return {name: dict(value) for name, value in settings.items() if isinstance(value, dict)}


def fill_elided(settings: dict[str, Any], before: dict[str, Any]) -> None:
    """``"default": {...}`` in a page's ``TASKS`` or ``DATABASES``: the entry as it was."""
    for name, value in list(settings.items()):
        if name.isupper() and isinstance(value, dict):
            for key, entry in value.items():
                if entry == {...} and key in before.get(name, {}):
                    value[key] = before[name][key]


def databases(configured: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """The page's ``DATABASES``, runnable here: ``{...}`` is the project's database as it
    was; PostgreSQL and MySQL are this machine's servers, under names of the test's own."""
    prefix = os.environ.get("DOCS_SAMPLES_DATABASE_PREFIX", "docs_samples")
    result = {}
    for alias, given in configured.items():
        if given == {...}:  # "default": {...}: the database it already was
            settings = {"ENGINE": "django.db.backends.sqlite3", "NAME": base_dir / "db.sqlite3"}
        else:
            settings = dict(given)
        engine = settings.get("ENGINE", "")
        if engine.endswith("postgresql"):
            settings.update(
                HOST=os.environ.get("PGHOST", "127.0.0.1"),
                PORT=os.environ.get("PGPORT", "5432"),
                USER=os.environ.get("PGUSER", "postgres"),
                PASSWORD=os.environ.get("PGPASSWORD", ""),
                NAME=f"{prefix}_{alias}",
            )
        elif engine.endswith("mysql"):
            settings.update(
                HOST=os.environ.get("MYSQL_HOST", "127.0.0.1"),
                PORT=os.environ.get("MYSQL_PORT", "3306"),
                USER=os.environ.get("MYSQL_USER", "root"),
                PASSWORD=os.environ.get("MYSQL_PASSWORD", ""),
                NAME=f"{prefix}_{alias}",
            )
        result[alias] = settings
    return result


def servers_needed(page_blocks: list[Block]) -> set[str]:
    """The database servers a page's settings name: ``postgresql``, ``mysql``."""
    needed = set()
    for block in page_blocks:
        if block.kind == "settings" and not block.skip_reason:
            for vendor in ("postgresql", "mysql"):
                if f"django.db.backends.{vendor}" in block.text:
                    needed.add(vendor)
    return needed


def plan(page_blocks: list[Block]) -> str:
    """The steps the runner takes, as JSON."""
    steps: list[dict[str, Any]] = []
    for block in page_blocks:
        if block.lang not in ("python", "pycon", "console") or block.skip_reason:
            continue
        for directive in block.directives:
            if directive.kind == "setup":
                where = f"docs/{block.page}:{directive.line}"
                steps.append({"kind": "setup", "text": directive.text, "where": where})
        unchecked = block.directive("output-unchecked")
        steps.append(
            {
                "kind": block.kind,
                "text": block.text,
                "where": block.where,
                "module": block.module,
                "path": file_target(block.file_path) if block.file_path else None,
                "unchecked": unchecked.argument if unchecked else None,
            }
        )
        for directive in block.after:
            where = f"docs/{block.page}:{directive.line}"
            steps.append({"kind": "check", "text": directive.text, "where": where})
    return json.dumps(steps, indent=1)
