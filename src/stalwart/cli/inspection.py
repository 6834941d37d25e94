"""Looking at the queue: ``check``, ``status``, ``processes``, ``recurring``, ``metrics``."""

import argparse
import socket
from typing import Any

from django.core.management.base import CommandError
from django.db import DatabaseError

from stalwart.cli import format_table, get_backend, subcommand
from stalwart.cli.types import seconds
from stalwart.db.hints import explain

# -- check -----------------------------------------------------------------------------------


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    return None


@subcommand(
    "check",
    "Check the configuration and the database without starting anything; non-zero exit "
    "status if anything is wrong.",
    _no_arguments,
)
def check(command: Any, options: dict[str, Any]) -> int:
    from stalwart import diagnostics

    backend = get_backend(options["backend"])
    try:
        messages = diagnostics.system_check_messages([backend.config.database])
    except DatabaseError as error:
        # MySQL's own checks ask the server for its version: one out of reach is the problem.
        command.stderr.write(f"error: {explain(error, backend.config.database)}")
        return 1
    problems = diagnostics.all_problems(backend, messages)
    for warning in diagnostics.system_check_warnings(messages):
        command.stderr.write(f"warning: {warning}")
    if problems:
        for problem in problems:
            command.stderr.write(f"error: {problem}")
        return 1
    config = backend.config
    command.stdout.write(
        f"OK: TASKS[{backend.alias!r}] on DATABASES[{config.database!r}] "
        f"({diagnostics.server_version(config.database)}; {len(config.workers)} worker "
        f"kind(s), {len(config.recurring)} recurring task(s))."
    )
    return 0


# -- status ----------------------------------------------------------------------------------


def _status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="Print JSON instead of tables.")
    parser.add_argument(
        "--check",
        action="store_true",
        help="Exit with status 1 if a queue with ready jobs has no live worker, a ready job "
        "has waited longer than --max-age, or a process stopped heartbeating.",
    )
    parser.add_argument(
        "--max-age",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="With --check: the longest a ready job may wait (default: no limit).",
    )
    parser.add_argument(
        "--this-host",
        action="store_true",
        help="With --check: judge only this host's own processes (a container's liveness "
        "probe): fail if none of its supervisors or workers is alive, or a live one cannot "
        "do its work. Queues and other hosts are not judged.",
    )


def _megabytes(value: int | None) -> str:
    return "-" if value is None else f"{value / 1024 / 1024:.0f} MB"


def _state_text(process: Any) -> str:
    """DEAD (silent too long), leaving (ended with jobs running), failing (its loop cannot
    do its work), or alive."""
    if not process.alive:
        return "DEAD"
    if process.leaving:
        return "leaving"
    if process.failing_for is not None:
        return f"failing for {_seconds_text(process.failing_for)}"
    return "alive"


def _seconds_text(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 120:
        return f"{value:.0f}s"
    if value < 7200:
        return f"{value / 60:.0f}m"
    return f"{value / 3600:.1f}h"


@subcommand(
    "status", "Show processes and queues; with --check, act as a health probe.", _status_arguments
)
def status(command: Any, options: dict[str, Any]) -> int:
    import json

    from stalwart.status import collect_status

    backend = get_backend(options["backend"])
    if options.get("this_host") and options.get("max_age") is not None:
        raise CommandError("--max-age judges queues, which --this-host leaves out: give one.")
    current = collect_status(backend.config)
    if options.get("this_host"):
        problems = current.host_problems(socket.gethostname())
    else:
        problems = current.problems(max_ready_age=options.get("max_age"))
    if options.get("json"):
        data = current.as_dict()
        data["problems"] = problems
        command.stdout.write(json.dumps(data, indent=2))
    else:
        command.stdout.write("Processes")
        command.stdout.write(
            format_table(
                ["KIND", "NAME", "HOST", "PID", "AGE", "HEARTBEAT", "BUSY", "MEMORY", "STATE"],
                [
                    [
                        p.kind,
                        p.name,
                        p.hostname,
                        str(p.pid),
                        _seconds_text(p.age_seconds),
                        _seconds_text(p.heartbeat_age_seconds) + " ago",
                        "-" if p.busy is None else f"{p.busy}/{p.threads}",
                        _megabytes(p.rss_bytes),
                        _state_text(p),
                    ]
                    for p in current.processes
                ],
            )
            if current.processes
            else "  (none)"
        )
        command.stdout.write("\nQueues")
        command.stdout.write(
            format_table(
                [
                    "QUEUE",
                    "READY",
                    "SCHEDULED",
                    "BLOCKED",
                    "RUNNING",
                    "FAILED",
                    "OLDEST READY",
                    "WORKERS",
                    "PAUSED",
                ],
                [
                    [
                        q.name,
                        str(q.ready),
                        str(q.scheduled),
                        str(q.blocked),
                        str(q.running),
                        str(q.failed),
                        _seconds_text(q.oldest_ready_age_seconds),
                        str(q.served_by),
                        "yes" if q.paused else "no",
                    ]
                    for q in current.queues
                ],
            )
            if current.queues
            else "  (no jobs waiting, running or failed)"
        )
        if problems:
            command.stdout.write("\nProblems")
            for problem in problems:
                command.stdout.write(f"  {problem}")
    if options.get("check") and problems:
        for problem in problems:
            command.stderr.write(f"unhealthy: {problem}")
        return 1
    return 0


# -- processes -------------------------------------------------------------------------------


def _processes_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--prune",
        action="store_true",
        help="Prune processes that stopped heartbeating now, releasing their jobs.",
    )


@subcommand(
    "processes",
    "List registered processes; --prune removes the dead ones now.",
    _processes_arguments,
)
def processes(command: Any, options: dict[str, Any]) -> int:
    from stalwart.processes.registry import prune_dead_processes, report_pruned
    from stalwart.status import collect_status

    backend = get_backend(options["backend"])
    config = backend.config
    if options.get("prune"):
        pruned = prune_dead_processes(
            config.database, threshold=config.process_alive_threshold, exclude=None
        )
        for gone in pruned:
            report_pruned(gone)
            failed = sum(1 for job in gone.released if job.failed)
            released = len(gone.released) - failed
            command.stdout.write(
                f"Pruned {gone.kind} {gone.name} (pid {gone.pid} on {gone.hostname}): "
                f"{released} job(s) released, {failed} failed."
            )
        if not pruned:
            command.stdout.write("No dead processes.")
        return 0
    current = collect_status(config)
    if not current.processes:
        command.stdout.write("No processes registered.")
        return 0
    command.stdout.write(
        format_table(
            ["ID", "KIND", "NAME", "HOST", "PID", "SUPERVISOR", "HEARTBEAT", "STATE"],
            [
                [
                    str(p.id),
                    p.kind,
                    p.name,
                    p.hostname,
                    str(p.pid),
                    "-" if p.supervisor is None else str(p.supervisor),
                    _seconds_text(p.heartbeat_age_seconds) + " ago",
                    _state_text(p),
                ]
                for p in current.processes
            ],
        )
    )
    return 0


# -- recurring -------------------------------------------------------------------------------


def _recurring_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")


@subcommand(
    "recurring",
    "List the recurring tasks of OPTIONS['recurring'] with their last and next run.",
    _recurring_arguments,
)
def recurring(command: Any, options: dict[str, Any]) -> int:
    import json

    from stalwart.ticks import database_now, last_runs

    backend = get_backend(options["backend"])
    config = backend.config
    for error in config.recurring_errors:
        command.stderr.write(f"error: {error} (left out until it is fixed)")
    now = database_now(config.database)
    latest = last_runs(config.database)
    rows = []
    for entry in config.recurring:
        last = latest.get(entry.key)
        following = entry.next_after(max(now, last) if last else now)
        rows.append(
            {
                "key": entry.key,
                "task": entry.task_path,
                "schedule": entry.schedule,
                "timezone": str(entry.timezone),
                "catch_up": entry.catch_up,
                "last_run": last.isoformat() if last else None,
                "next_run": following.isoformat() if following else None,
            }
        )
    if options.get("json"):
        command.stdout.write(json.dumps(rows, indent=2))
        return 0
    if not rows:
        command.stdout.write("No recurring tasks (OPTIONS['recurring'] is empty).")
        return 0
    command.stdout.write(
        format_table(
            ["KEY", "TASK", "SCHEDULE", "TIMEZONE", "LAST RUN", "NEXT RUN"],
            [
                [
                    row["key"],
                    row["task"],
                    row["schedule"],
                    row["timezone"],
                    row["last_run"] or "never",
                    row["next_run"] or "never",
                ]
                for row in rows
            ],
        )
    )
    return 0


# -- metrics ---------------------------------------------------------------------------------


@subcommand(
    "metrics",
    "Print the metrics in Prometheus's text format (what the metrics view serves).",
    _no_arguments,
)
def metrics(command: Any, options: dict[str, Any]) -> int:
    backend = get_backend(options["backend"])
    try:
        from stalwart.metrics.collector import exposition
    except ImportError:  # pragma: no cover - the collector imports lazily
        raise CommandError("stalwart.metrics cannot be imported.") from None
    try:
        body, _ = exposition(backend.config)
    except ImportError:
        raise CommandError(
            "prometheus_client is not installed: pip install 'django-stalwart[prometheus]'."
        ) from None
    command.stdout.write(body.decode().rstrip("\n"))
    return 0
