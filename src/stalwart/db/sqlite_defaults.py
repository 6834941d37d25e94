"""SQLite with no set-up: the connections to a queue's SQLite database are made fit for
several processes, unless ``DATABASES`` says otherwise.

Workers are processes of their own that write to the file the site writes to. With
SQLite's defaults (a rollback journal, transactions that ask for the write lock only at
their first write, Python's 5 second busy timeout) a project as ``startproject`` makes it
loses enqueues to "database is locked" as soon as two workers run: a transaction that
reads, then enqueues, cannot take the write lock a worker holds, and fails at once, without
waiting. So every connection Django opens to the database of a Stalwart backend (the
site's and the workers' alike) gets, unless its ``OPTIONS`` set them:

- ``transaction_mode = "IMMEDIATE"``: a transaction takes the write lock when it begins,
  waiting for it, instead of failing when it first writes;
- a busy timeout of ``BUSY_TIMEOUT`` seconds (``OPTIONS["timeout"]``): how long a write
  waits for the lock;
- ``journal_mode=WAL`` and ``synchronous=NORMAL`` (unless ``OPTIONS["init_command"]``
  sets a journal mode): readers and the writer never wait for each other.

A value in ``OPTIONS`` always wins: these are defaults, not overrides.
"""

import contextlib
import sqlite3
from typing import Any

from django.conf import settings
from django.db.backends.signals import connection_created
from django.utils.module_loading import import_string

from stalwart.aliases import is_stalwart_class

BUSY_TIMEOUT = 20  # seconds


def queue_databases() -> set[str]:
    """The aliases of the databases Stalwart backends keep their jobs in."""
    aliases = set()
    for params in getattr(settings, "TASKS", {}).values():
        try:
            backend_class = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue
        if is_stalwart_class(backend_class):
            options = params.get("OPTIONS") or {}
            database = options.get("database", "default") if isinstance(options, dict) else None
            if isinstance(database, str):
                aliases.add(database)
    return aliases


def missing_defaults(connection: Any) -> list[str]:
    """What this connection would be given, as the ``OPTIONS`` keys it lacks."""
    options = connection.settings_dict.get("OPTIONS") or {}
    missing = [key for key in ("transaction_mode", "timeout") if key not in options]
    if "journal_mode" not in str(options.get("init_command", "")).lower():
        missing.append("init_command")
    return missing


def configure(sender: Any, connection: Any, **kwargs: Any) -> None:
    """``connection_created`` receiver: apply the defaults to a queue's SQLite database."""
    if connection.vendor != "sqlite" or connection.alias not in queue_databases():
        return
    missing = missing_defaults(connection)
    raw = connection.connection
    if "transaction_mode" in missing:
        connection.transaction_mode = "IMMEDIATE"  # read when each transaction begins
    if "timeout" in missing:
        raw.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT * 1000}")
    if "init_command" in missing and not connection.is_in_memory_db():
        # Persistent: in effect for the file once any connection has set it. If another
        # process holds the lock just now, a later connection sets it.
        with contextlib.suppress(sqlite3.OperationalError):
            raw.execute("PRAGMA journal_mode = WAL")
        raw.execute("PRAGMA synchronous = NORMAL")


def install() -> None:
    connection_created.connect(configure, dispatch_uid="stalwart.sqlite_defaults")
