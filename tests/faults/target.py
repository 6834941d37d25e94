"""The database a scenario runs against, fresh for each scenario, and how to reach it.

PostgreSQL: a database copied from a migrated template in the private cluster; the Stalwart
processes log in as ``stalwart_app``, through the proxy when the scenario has one. SQLite: a
copy of a migrated file. Either way the test process watches through a Django connection
alias of its own (``faults``, as the superuser, never through the proxy), and enqueues
through a ``StalwartBackend`` bound to that alias, so rows say backend ``default`` as they
would had the application enqueued them.
"""

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from django.db import connections
from django.tasks import Task, TaskResult

from stalwart.backend import StalwartBackend
from tests.faults.cluster import APP_ROLE, PrivateCluster
from tests.helpers import ROOT

ALIAS = "faults"

# Short settings: every scenario is over in seconds.
HEARTBEAT = 0.5
ALIVE = 4.0
SHUTDOWN_TIMEOUT = 3.0


def migrate(env: Mapping[str, str]) -> None:
    """``python -m django migrate`` into the database ``env`` names."""
    completed = subprocess.run(
        [sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if completed.returncode != 0:
        raise RuntimeError(f"migrate failed:\n{completed.stdout}{completed.stderr}")


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["STALWART_HEARTBEAT"] = str(HEARTBEAT)
    env["STALWART_ALIVE"] = str(ALIVE)
    env["STALWART_SHUTDOWN_TIMEOUT"] = str(SHUTDOWN_TIMEOUT)
    for name in ("FAKETIME", "LD_PRELOAD", "STALWART_RECURRING"):
        env.pop(name, None)
    env.update(extra)
    return env


@dataclass
class Target:
    """One scenario's database."""

    vendor: str
    name: str  # the database name, or the SQLite file
    cluster: PrivateCluster | None = None
    port: int | None = None  # where the Stalwart processes connect (the proxy's, if any)
    backend: StalwartBackend = field(init=False)

    def __post_init__(self) -> None:
        if self.cluster is not None and self.port is None:
            self.port = self.cluster.port
        self.backend = StalwartBackend(
            "default",
            {"QUEUES": [], "OPTIONS": {"database": ALIAS, "max_attempts": 5}},
        )

    # -- the processes' side ------------------------------------------------------------------

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a Stalwart process against this database."""
        if self.vendor == "postgresql":
            assert self.cluster is not None
            db = {
                "STALWART_TEST_DATABASE": "postgresql",
                "PGHOST": self.cluster.host,
                "PGPORT": str(self.port),
                "PGUSER": APP_ROLE,
                "PGPASSWORD": "",
            }
        else:
            db = {"STALWART_TEST_DATABASE": "sqlite"}
        return base_env(**{**db, "STALWART_DB_NAME": self.name, **extra})

    # -- the test's side ----------------------------------------------------------------------

    def settings_dict(self) -> dict[str, Any]:
        if self.vendor == "postgresql":
            assert self.cluster is not None
            raw = {
                "ENGINE": "django.db.backends.postgresql",
                "NAME": self.name,
                "HOST": self.cluster.host,
                "PORT": str(self.cluster.port),
                "USER": "postgres",
                "PASSWORD": "",
                "CONN_HEALTH_CHECKS": True,
            }
        else:
            raw = {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": self.name,
                "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 30},
            }
        # configure_settings() fills in Django's defaults; it insists on a 'default' entry.
        return connections.configure_settings({"default": raw})["default"]

    def attach(self) -> None:
        """Point the ``faults`` alias of this process at this database."""
        self.detach()
        connections.settings[ALIAS] = self.settings_dict()

    def detach(self) -> None:
        if ALIAS in connections.settings:
            with contextlib.suppress(Exception):
                connections[ALIAS].close()
            with contextlib.suppress(AttributeError):
                del connections[ALIAS]
            del connections.settings[ALIAS]

    def reconnect(self) -> None:
        """Drop the test's own connection (after a restart it is dead)."""
        with contextlib.suppress(Exception):
            connections[ALIAS].close()

    def enqueue(self, task: Task, *args: Any, **kwargs: Any) -> TaskResult:
        return self.backend.enqueue(task, args, kwargs)

    def enqueue_many(self, task: Task, calls: Sequence[tuple[Sequence, Mapping]]) -> list[str]:
        return [result.id for result in self.backend.enqueue_many(task, calls)]

    def now(self) -> datetime:
        """The database's clock (PostgreSQL), or this host's (SQLite: one host)."""
        from stalwart.ticks import database_now

        return database_now(ALIAS)


class Databases:
    """Makes a fresh database per scenario, from a template migrated once per session."""

    def __init__(self, workdir: Path, cluster: PrivateCluster | None) -> None:
        self.workdir = workdir
        self.cluster = cluster
        self.count = 0
        self._pg_template: str | None = None
        self._sqlite_template: Path | None = None

    def postgresql(self, port: int | None = None) -> Target:
        assert self.cluster is not None
        if self._pg_template is None:
            self.cluster.execute(f"CREATE DATABASE stalwart_template OWNER {APP_ROLE}")
            template = Target("postgresql", "stalwart_template", self.cluster)
            migrate(template.env())
            self._pg_template = "stalwart_template"
        self.count += 1
        name = f"scenario_{self.count}"
        self.cluster.execute(
            f"CREATE DATABASE {name} TEMPLATE {self._pg_template} OWNER {APP_ROLE}"
        )
        return Target("postgresql", name, self.cluster, port)

    def sqlite(self) -> Target:
        if self._sqlite_template is None:
            path = self.workdir / "template.sqlite3"
            migrate(Target("sqlite", str(path)).env())
            self._sqlite_template = path
        self.count += 1
        path = self.workdir / f"scenario_{self.count}.sqlite3"
        shutil.copyfile(self._sqlite_template, path)
        return Target("sqlite", str(path))
