"""Settings for the test suite. ``STALWART_TEST_DATABASE`` picks the database under test.

- ``sqlite`` (default): a file in the temporary directory, shared with forked workers.
- ``postgresql``: the server named by the usual libpq variables (PGHOST, PGPORT, PGUSER,
  PGPASSWORD), default 127.0.0.1:5432 as ``postgres``.
- ``postgresql-pgbouncer``: the same server through PgBouncer in transaction mode, on
  127.0.0.1:``STALWART_PGBOUNCER_PORT`` (``python -m tests.pgbouncer COMMAND`` starts one and
  sets it), with ``transaction_pooler`` and LISTEN on the alias ``direct`` (PostgreSQL itself);
  ``STALWART_LISTEN_DATABASE=""``: no ``listen_database``, so workers poll.
- ``mysql``: MySQL 8.0+ or MariaDB 10.6+ named by MYSQL_HOST, MYSQL_PORT, MYSQL_USER,
  MYSQL_PASSWORD, default 127.0.0.1:3306 as ``root`` (docs/how-to/use-mysql.md).

Processes the tests start get ``STALWART_DB_NAME``: the test database itself.
``STALWART_QUEUE_DATABASE`` (a path) puts the queue in a SQLite database of its own.
"""

import json
import os
import tempfile
from pathlib import Path
from typing import Any

VENDOR = os.environ.get("STALWART_TEST_DATABASE", "sqlite")
DB_NAME_OVERRIDE = os.environ.get("STALWART_DB_NAME")
# Each test run gets its own test database, so runs side by side do not trample each other.
RUN = os.environ.setdefault("STALWART_TEST_RUN", str(os.getpid()))

SECRET_KEY = "stalwart-tests-not-secret"  # noqa: S105 - test settings
DEBUG = False
# The web servers of tests/acceptance/test_embedded.py answer requests to these.
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]
# STALWART_USE_TZ=false: a project Stalwart must refuse to run (the check stalwart.E003).
USE_TZ = os.environ.get("STALWART_USE_TZ", "true") != "false"
TIME_ZONE = "UTC"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "stalwart",
    "tests.testapp",
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# The admin, for the dashboard (tests/dashboard), and the metrics view.
ROOT_URLCONF = "tests.urls"
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
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
STATIC_URL = "/static/"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast test logins

if VENDOR in ("postgresql", "postgresql-pgbouncer"):
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": DB_NAME_OVERRIDE or "stalwart",
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            # STALWART_CONN_MAX_AGE ("none": for good) and STALWART_CONN_HEALTH_CHECKS=false:
            # connections a job thread keeps between jobs, never checked by Django (the
            # fault suite's database restarts).
            "CONN_HEALTH_CHECKS": os.environ.get("STALWART_CONN_HEALTH_CHECKS") != "false",
            "CONN_MAX_AGE": (
                None
                if os.environ.get("STALWART_CONN_MAX_AGE") == "none"
                else int(os.environ.get("STALWART_CONN_MAX_AGE", "0"))
            ),
            "TEST": {"NAME": f"test_stalwart_{RUN}"},
        }
    }
    if os.environ.get("STALWART_TEST_POOL") == "true":
        # Django's connection pool (psycopg_pool): each process must build its own.
        DATABASES["default"]["OPTIONS"] = {"pool": {"min_size": 2, "max_size": 12, "timeout": 10}}
    if VENDOR == "postgresql-pgbouncer":
        # The test database is created and dropped through PgBouncer too (its wildcard entry).
        DATABASES["direct"] = {**DATABASES["default"], "TEST": {"MIRROR": "default"}}
        DATABASES["default"].update(
            PORT=os.environ["STALWART_PGBOUNCER_PORT"], DISABLE_SERVER_SIDE_CURSORS=True
        )
elif VENDOR == "sqlite":
    _sqlite_file = str(Path(tempfile.gettempdir()) / f"stalwart-tests-{RUN}.sqlite3")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DB_NAME_OVERRIDE or _sqlite_file,
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
            "TEST": {"NAME": _sqlite_file},
        }
    }
elif VENDOR == "mysql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": DB_NAME_OVERRIDE or "stalwart",
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "CONN_HEALTH_CHECKS": True,
            # READ COMMITTED on purpose (Django's default too): under REPEATABLE READ a
            # locking read takes gap locks, so claims and enqueues would block one another
            # on the claim index's gaps. utf8mb4: all of Unicode.
            "OPTIONS": {"charset": "utf8mb4", "isolation_level": "read committed"},
            # A binary collation: queue names and keys compare as on PostgreSQL and SQLite.
            "TEST": {
                "NAME": f"test_stalwart_{RUN}",
                "CHARSET": "utf8mb4",
                "COLLATION": "utf8mb4_bin",
            },
        }
    }
    # Django cannot build partial indexes on MySQL; migration 0010 gives it the equivalents.
    SILENCED_SYSTEM_CHECKS = ["models.W036", "models.W037"]
else:
    raise RuntimeError(
        "STALWART_TEST_DATABASE must be sqlite, postgresql, postgresql-pgbouncer or mysql, "
        f"not {VENDOR!r}"
    )

TASKS: dict[str, dict[str, Any]] = {
    "default": {
        "BACKEND": "stalwart.backend.StalwartBackend",
        "QUEUES": [],
        "OPTIONS": {
            "heartbeat_interval": float(os.environ.get("STALWART_HEARTBEAT", "0.5")),
            "process_alive_threshold": float(os.environ.get("STALWART_ALIVE", "5")),
            "shutdown_timeout": float(os.environ.get("STALWART_SHUTDOWN_TIMEOUT", "10")),
            "max_attempts": int(os.environ.get("STALWART_MAX_ATTEMPTS", "5")),
            "max_interruptions": int(os.environ.get("STALWART_MAX_INTERRUPTIONS", "10")),
            "task_not_found_grace": float(os.environ.get("STALWART_TASK_NOT_FOUND_GRACE", "900")),
            "dispatchers": [{"polling_interval": 0.1}],
            "scheduler": {"polling_interval": 0.2},
            "recurring": json.loads(os.environ.get("STALWART_RECURRING", "{}")),
            "task_modules": json.loads(os.environ.get("STALWART_TASK_MODULES", "[]")),
            "metrics": os.environ.get("STALWART_METRICS") == "true",
        },
    },
    "limited": {
        "BACKEND": "stalwart.backend.StalwartBackend",
        "QUEUES": ["default", "other"],
        "OPTIONS": {"max_arguments_size": 1024},
    },
    "immediate": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend", "QUEUES": []},
}

if VENDOR == "postgresql-pgbouncer":
    TASKS["default"]["OPTIONS"]["transaction_pooler"] = True
    TASKS["default"]["OPTIONS"]["listen_database"] = (
        os.environ.get("STALWART_LISTEN_DATABASE", "direct") or None
    )

if os.environ.get("STALWART_QUEUE_DATABASE"):
    # The queue in a database of its own (a SQLite file at this path), as OPTIONS["database"]
    # allows.
    DATABASES["queue"] = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ["STALWART_QUEUE_DATABASE"],
    }
    TASKS["default"]["OPTIONS"]["database"] = "queue"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(process)d %(levelname)s %(name)s %(message)s"}
    },
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "stalwart": {"handlers": ["stderr"], "level": os.environ.get("STALWART_LOG_LEVEL", "INFO")},
        "django.tasks": {"handlers": ["stderr"], "level": "WARNING"},
    },
}
