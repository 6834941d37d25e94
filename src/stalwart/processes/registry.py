"""The process table: registering, heartbeating (database clock), deregistering."""

import os
import secrets
import socket
from typing import Any

from django.db.models.functions import Now

from stalwart.db.retry import retry_transient
from stalwart.models import Process


def process_name(kind: str) -> str:
    """A name unique across hosts and restarts, e.g. ``worker-web1-4242-9f3a``."""
    host = socket.gethostname().split(".")[0][:40]
    return f"{kind}-{host}-{os.getpid()}-{secrets.token_hex(2)}"


class Registration:
    """One process's row. ``heartbeat`` returns False once the row is gone (we were pruned)."""

    def __init__(self, database: str, *, kind: str, name: str, supervisor: int | None) -> None:
        self.database = database
        self.kind = kind
        self.name = name
        self.supervisor = supervisor
        self.id: int | None = None

    def register(self, metadata: dict[str, Any]) -> int:
        def create() -> int:
            row = Process.objects.using(self.database).create(
                kind=self.kind,
                name=self.name,
                pid=os.getpid(),
                hostname=socket.gethostname(),
                supervisor=self.supervisor,
                created_at=Now(),
                last_heartbeat_at=Now(),
                metadata=metadata,
            )
            return row.id

        self.id = retry_transient(self.database, create, what="register")
        return self.id

    def heartbeat(self, metadata: dict[str, Any]) -> bool:
        updated = (
            Process.objects.using(self.database)
            .filter(id=self.id)
            .update(last_heartbeat_at=Now(), metadata=metadata)
        )
        return updated == 1

    def deregister(self) -> None:
        if self.id is None:
            return
        retry_transient(
            self.database,
            lambda: Process.objects.using(self.database).filter(id=self.id).delete(),
            what="deregister",
        )
