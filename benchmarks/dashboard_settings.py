"""Settings for the dashboard's benchmark: the benchmark's, with the admin, in a database of
its own (``stalwart_bench_dashboard``), since it holds a million jobs between runs."""

import os

os.environ.setdefault("STALWART_BENCH_DB_NAME", "stalwart_bench_dashboard")

from benchmarks.settings import *  # noqa: F403

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "stalwart",
]
ROOT_URLCONF = "benchmarks.dashboard_urls"
ALLOWED_HOSTS = ["testserver"]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
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
TASKS["default"]["OPTIONS"]["recurring"] = {  # noqa: F405
    "nightly": {"task": "benchmarks.tasks.noop", "schedule": "30 2 * * *"},
    "hourly": {"task": "benchmarks.tasks.stamp", "schedule": "@hourly"},
}
