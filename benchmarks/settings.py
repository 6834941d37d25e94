"""Settings for the benchmark: PostgreSQL by default (``STALWART_BENCH_DATABASE=sqlite`` or
``mysql`` too: MariaDB/MySQL at MYSQL_HOST, MYSQL_PORT as MYSQL_USER, default 127.0.0.1:3306,
root)."""

import os
import tempfile
from pathlib import Path

SECRET_KEY = "stalwart-benchmark-not-secret"  # noqa: S105
USE_TZ = True
# "benchmarks": its models, the tables of the one-insert task and of the reference rows.
INSTALLED_APPS = ["stalwart", "benchmarks"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

if os.environ.get("STALWART_BENCH_DATABASE", "postgresql") == "postgresql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": os.environ.get("STALWART_BENCH_DB_NAME", "stalwart_bench"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "USER": os.environ.get("PGUSER", "postgres"),
            "PASSWORD": os.environ.get("PGPASSWORD", ""),
            # Workers keep their connections from job to job, as the docs advise (with
            # Django's default of 0, each job would open its own).
            "CONN_MAX_AGE": None,
            "CONN_HEALTH_CHECKS": True,
        }
    }
elif os.environ["STALWART_BENCH_DATABASE"] == "mysql":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": os.environ.get("STALWART_BENCH_DB_NAME", "stalwart_bench"),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "OPTIONS": {"charset": "utf8mb4", "isolation_level": "read committed"},
            "CONN_MAX_AGE": None,
            "CONN_HEALTH_CHECKS": True,
        }
    }
    SILENCED_SYSTEM_CHECKS = ["models.W036", "models.W037"]  # see docs/how-to/use-mysql.md
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": str(Path(tempfile.gettempdir()) / "stalwart-bench.sqlite3"),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }

TASKS = {
    "default": {
        "BACKEND": "stalwart.backend.StalwartBackend",
        "QUEUES": [],
        "OPTIONS": {
            # The idle-cost step measures the defaults (10 and 60); the rest, shorter ones, so
            # that the rows of a benchmark that was killed are pruned soon.
            "heartbeat_interval": float(os.environ.get("STALWART_BENCH_HEARTBEAT", "5")),
            "process_alive_threshold": 6 * float(os.environ.get("STALWART_BENCH_HEARTBEAT", "5")),
            # Not an installed app's tasks module: workers load it only because it is listed.
            "task_modules": ["benchmarks.tasks"],
            # For the idle-cost step: a scheduler with something to schedule, not due soon.
            "recurring": {"bench-yearly": {"task": "benchmarks.tasks.noop", "schedule": "@yearly"}},
        },
    }
}
if os.environ.get("STALWART_PGBOUNCER_PORT"):
    # Through PgBouncer in transaction mode on this port (python -m tests.pgbouncer sets it),
    # with LISTEN on a direct connection; STALWART_BENCH_LISTEN=poll: without one, polling.
    DATABASES["direct"] = dict(DATABASES["default"])
    DATABASES["default"].update(
        PORT=os.environ["STALWART_PGBOUNCER_PORT"], DISABLE_SERVER_SIDE_CURSORS=True
    )
    TASKS["default"]["OPTIONS"]["transaction_pooler"] = True
    TASKS["default"]["OPTIONS"]["listen_database"] = (
        None if os.environ.get("STALWART_BENCH_LISTEN") == "poll" else "direct"
    )
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {
        "stalwart": {"handlers": ["stderr"], "level": "WARNING"},
        # Django logs every task start and finish at INFO; at WARNING, as a busy production
        # site would keep it, those records are not even created.
        "django.tasks": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
    },
}
