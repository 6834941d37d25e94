"""A small Django project using Stalwart on SQLite (the zero-setup default)."""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent
SECRET_KEY = "demo-only-not-secret"  # noqa: S105 - a demo project
DEBUG = True
USE_TZ = True
INSTALLED_APPS = ["stalwart", "shop"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.environ.get("STALWART_DEMO_DB", BASE_DIR / "db.sqlite3"),
        # No OPTIONS: Stalwart gives the queue's SQLite connections what several processes
        # need (WAL, IMMEDIATE transactions, a 20 s busy timeout).
    }
}

TASKS = {
    "default": {
        "BACKEND": "stalwart.backend.StalwartBackend",
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"workers": [{"queues": "emails,default", "threads": 4}]},
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
