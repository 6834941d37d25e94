"""What the cluster looks like now: processes and queues, and what is wrong with them.

Counts use the partial indexes the claim already maintains (one statement per state), so a
status check stays cheap however many finished jobs the table holds.
"""

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import Count, F, Min

from stalwart.conf import Options
from stalwart.control import paused_queues
from stalwart.models import Job, Process
from stalwart.processes.registry import LEAVING
from stalwart.queues import QueueSelector
from stalwart.ticks import database_now

COUNTED_STATES = ("ready", "scheduled", "blocked", "running", "failed")


@dataclass(slots=True)
class ProcessStatus:
    id: int
    kind: str
    name: str
    hostname: str
    pid: int
    supervisor: int | None
    age_seconds: float
    heartbeat_age_seconds: float
    alive: bool
    queues: str | None
    threads: int | None
    busy: int | None
    rss_bytes: int | None
    # Seconds its main loop has failed to do its work (the database refusing it), if it has.
    failing_for: float | None = None
    error: str | None = None
    leaving: bool = False  # ended with jobs still running; they go back once it is pruned


@dataclass(slots=True)
class QueueStatus:
    name: str
    ready: int = 0
    scheduled: int = 0
    blocked: int = 0
    running: int = 0
    failed: int = 0
    oldest_ready_age_seconds: float | None = None
    paused: bool = False
    served_by: int = 0  # live workers claiming from it


@dataclass(slots=True)
class Status:
    database_time: datetime
    processes: list[ProcessStatus] = field(default_factory=list)
    queues: list[QueueStatus] = field(default_factory=list)
    # A process whose loop has failed this long cannot do its work: a problem.
    failing_limit: float = 30.0

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["database_time"] = self.database_time.isoformat()
        return data

    def problems(self, *, max_ready_age: float | None) -> list[str]:
        """Why a health probe should fail: unserved queues, stale jobs, dead processes."""
        found = []
        for queue in self.queues:
            if queue.ready and not queue.served_by and not queue.paused:
                found.append(
                    f"queue {queue.name!r} has {queue.ready} ready job(s) and no live worker "
                    "serves it"
                )
            if (
                max_ready_age is not None
                and queue.oldest_ready_age_seconds is not None
                and queue.oldest_ready_age_seconds > max_ready_age
                and not queue.paused
            ):
                found.append(
                    f"queue {queue.name!r}: the oldest ready job has waited "
                    f"{queue.oldest_ready_age_seconds:.0f} s (over {max_ready_age:g} s)"
                )
        for process in self.processes:
            where = f"{process.kind} {process.name} (pid {process.pid} on {process.hostname})"
            if not process.alive:
                found.append(f"{where} sent no heartbeat for {process.heartbeat_age_seconds:.0f} s")
            elif process.failing_for is not None and process.failing_for > self.failing_limit:
                found.append(
                    f"{where} has failed to do its work for {process.failing_for:.0f} s: "
                    f"{process.error}"
                )
        return found

    def host_problems(self, hostname: str) -> list[str]:
        """Why a probe of one host's own processes should fail (a container's liveness
        probe): no live supervisor (or ``queue work``) of that host is registered, or a live
        process of it has failed to do its work too long. Queues are not judged, and neither
        are the silent rows of the host: the pruner removes them, ``problems()`` reports
        them, and a container restarted under the same host name would otherwise fail for
        the rows of its previous life."""
        mine = [process for process in self.processes if process.hostname == hostname]
        found = []
        if not any(process.alive and process.supervisor is None for process in mine):
            found.append(f"no live supervisor or worker of host {hostname!r} is registered")
        for process in mine:
            where = f"{process.kind} {process.name} (pid {process.pid} on {process.hostname})"
            if (
                process.alive
                and process.failing_for is not None
                and process.failing_for > self.failing_limit
            ):
                found.append(
                    f"{where} has failed to do its work for {process.failing_for:.0f} s: "
                    f"{process.error}"
                )
        return found


def collect_status(config: Options) -> Status:
    database = config.database
    now = database_now(database)
    status = Status(database_time=now, failing_limit=config.process_alive_threshold / 2)
    rows = Process.objects.using(database).order_by(
        "hostname", F("supervisor").asc(nulls_first=True), "id"
    )
    for row in rows:
        heartbeat_age = (now - row.last_heartbeat_at).total_seconds()
        status.processes.append(
            ProcessStatus(
                id=row.id,
                kind=row.kind,
                name=row.name,
                hostname=row.hostname,
                pid=row.pid,
                supervisor=row.supervisor,
                age_seconds=(now - row.created_at).total_seconds(),
                heartbeat_age_seconds=heartbeat_age,
                alive=heartbeat_age <= config.process_alive_threshold,
                queues=row.metadata.get("queues"),
                threads=row.metadata.get("threads"),
                busy=row.metadata.get("busy"),
                rss_bytes=row.metadata.get("rss_bytes"),
                failing_for=(
                    None
                    if row.metadata.get("failing_for") is None
                    else row.metadata["failing_for"] + heartbeat_age
                ),
                error=row.metadata.get("error"),
                leaving=bool(row.metadata.get(LEAVING)),
            )
        )
    queues: dict[str, QueueStatus] = {}
    jobs = Job.objects.using(database)
    for state in COUNTED_STATES:
        for name, count in (
            jobs.filter(status=state)
            .values("queue_name")
            .annotate(n=Count("id"))
            .values_list("queue_name", "n")
        ):
            setattr(queues.setdefault(name, QueueStatus(name)), state, count)
    for name, oldest in (
        jobs.filter(status="ready")
        .values("queue_name")
        .annotate(oldest=Min("available_at"))
        .values_list("queue_name", "oldest")
    ):
        queues[name].oldest_ready_age_seconds = max((now - oldest).total_seconds(), 0.0)
    paused = set(paused_queues(database=database))
    for name in paused:
        queues.setdefault(name, QueueStatus(name))
    live_workers = [
        QueueSelector.parse(process.queues)
        for process in status.processes
        if process.kind == "worker" and process.alive and process.queues
    ]
    for queue in queues.values():
        queue.paused = queue.name in paused
        queue.served_by = sum(1 for selector in live_workers if selector.serves(queue.name))
    status.queues = [queues[name] for name in sorted(queues)]
    return status
