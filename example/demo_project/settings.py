"""A small Django project using Stalwart: on SQLite (the zero-setup default), or on the
PostgreSQL that ``DATABASE_URL`` names (as Heroku's add-on and most platforms set it)."""

import os
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "demo-only-not-secret"  # noqa: S105 - a demo project
DEBUG = True
USE_TZ = True
INSTALLED_APPS = ["stalwart", "shop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def postgresql_from_url(url: str) -> dict:
    """``postgresql://USER:PASSWORD@HOST:PORT/NAME?sslmode=require`` as a DATABASES entry."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ValueError(f"DATABASE_URL must start with postgresql://, not {parts.scheme}://")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.lstrip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
        "OPTIONS": dict(parse_qsl(parts.query)),
        # Persistent connections, checked before reuse: each job of a worker is a request.
        "CONN_MAX_AGE": 600,
        "CONN_HEALTH_CHECKS": True,
    }


if os.environ.get("DATABASE_URL"):
    # Several hosts (dynos, containers) sharing one queue: PostgreSQL.
    DATABASES = {"default": postgresql_from_url(os.environ["DATABASE_URL"])}
else:
    # One host only: web and workers must share the file (no two dynos or containers can).
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("STALWART_DEMO_DB", BASE_DIR / "db.sqlite3"),
            # No OPTIONS: Stalwart gives the queue's SQLite connections what several
            # processes need (WAL, IMMEDIATE transactions, a 20 s busy timeout).
        }
    }

TASKS = {
    "default": {
        "BACKEND": "stalwart.backend.StalwartBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {
            "workers": [{"queues": "emails,default", "threads": 4}],
            # Running jobs get 20 s to finish after TERM: within the 30 s that Heroku (and
            # Kubernetes, by default) wait before they kill, with time to release the rest.
            "shutdown_timeout": 20,
        },
    }
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"short": {"format": "  worker: %(message)s"}},
    "filters": {"on_purpose": {"()": "shop.logs.OnPurpose"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": "short",
            "filters": ["on_purpose"],
        }
    },
    "loggers": {
        "stalwart": {"handlers": ["console"], "level": "INFO"},
        # Django logs every task start and finish, and each failure with its traceback;
        # Stalwart's own lines say as much.
        "django.tasks": {"handlers": ["console"], "level": "CRITICAL", "propagate": False},
    },
}
