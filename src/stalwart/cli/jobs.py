"""Looking at jobs: ``jobs`` (a list, newest or most urgent first) and ``show`` (one job).

They read what the dashboard reads (``stalwart.browsing``), in the same order, with the
same filters and cursors.
"""

import argparse
import json
from datetime import datetime
from typing import Any

from django.core.management.base import CommandError

from stalwart.cli import format_table, get_backend, subcommand
from stalwart.cli.types import job_id, queue_name, whole

STATE_CHOICES = (
    "ready",
    "scheduled",
    "running",
    "blocked",
    "pending",
    "failed",
    "successful",
    "cancelled",
)


def moment(value: str) -> datetime:
    """An ISO 8601 date or time; a time without a zone is taken as UTC."""
    from datetime import UTC

    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a date or time (ISO 8601, e.g. 2026-12-01T09:30)"
        ) from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# -- jobs ------------------------------------------------------------------------------------


def _jobs_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state",
        choices=STATE_CHOICES,
        help="Jobs in this state, in its order: ready ones most urgent first (as workers "
        "claim them), scheduled ones soonest first, finished ones newest first. Default: "
        "every state, newest first.",
    )
    parser.add_argument("--task", metavar="PATH", help="Jobs of this task (dotted path).")
    parser.add_argument("--queue", metavar="QUEUE", type=queue_name, help="Jobs of this queue.")
    parser.add_argument("--priority", type=whole(-100, 100), help="Jobs of this priority.")
    parser.add_argument(
        "--since",
        type=moment,
        metavar="TIME",
        help="From this time on (ISO 8601), by the state's time: available for waiting "
        "jobs, started for running ones, finished for finished ones, enqueued otherwise.",
    )
    parser.add_argument("--until", type=moment, metavar="TIME", help="Before this time.")
    parser.add_argument(
        "--limit", type=whole(1, 1000), default=50, help="Jobs to list (default: %(default)s)."
    )
    parser.add_argument(
        "--after",
        metavar="CURSOR",
        help="Continue after the last job of a previous list (its 'next' cursor).",
    )
    parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")


def _when(job: Any) -> datetime | None:
    return {
        "ready": job.available_at,
        "scheduled": job.available_at,
        "blocked": job.available_at,
        "running": job.last_attempted_at,
    }.get(job.status, job.finished_at or job.enqueued_at)


@subcommand(
    "jobs",
    "List jobs, by state, task, queue, priority and time; the same lists as the dashboard.",
    _jobs_arguments,
)
def jobs(command: Any, options: dict[str, Any]) -> int:
    from stalwart.browsing import (
        BRIEF_FIELDS,
        LIST_FIELDS,
        InvalidCursor,
        JobFilter,
        count_jobs,
        list_jobs,
    )

    backend = get_backend(options["backend"])
    database = backend.config.database
    where = JobFilter(
        state=options.get("state"),
        task=options.get("task"),
        queue=options.get("queue"),
        priority=options.get("priority"),
        since=options.get("since"),
        until=options.get("until"),
    )
    try:
        page = list_jobs(
            database,
            where,
            limit=options["limit"],
            after=options.get("after"),
            fields=BRIEF_FIELDS if options.get("json") else LIST_FIELDS,
        )
    except InvalidCursor as error:
        raise CommandError(str(error)) from None
    count = count_jobs(database, where)
    if options.get("json"):
        from stalwart.browsing import as_dict

        data = {
            "count": count.value,
            "count_capped": count.capped,
            "count_estimate": count.estimate,
            "next": page.next,
            "jobs": [as_dict(job, with_arguments=False, brief=True) for job in page.rows],
        }
        command.stdout.write(json.dumps(data, indent=2))
        return 0
    if not page.rows:
        command.stdout.write("No jobs match.")
        return 0
    command.stdout.write(
        format_table(
            ["ID", "STATE", "TASK", "QUEUE", "PRIORITY", "ATTEMPTS", "WHEN"],
            [
                [
                    str(job.id),
                    job.status,
                    job.task_path,
                    job.queue_name,
                    str(job.priority),
                    str(job.attempt),
                    (_when(job) or job.enqueued_at).isoformat(timespec="seconds"),
                ]
                for job in page.rows
            ],
        )
    )
    command.stdout.write(f"\n{len(page.rows)} shown of {count} matching.")
    if page.next:
        command.stdout.write(f"More: add --after {page.next}")
    return 0


# -- show ------------------------------------------------------------------------------------


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("job_id", metavar="JOB_ID", type=job_id, help="The job (TaskResult id).")
    parser.add_argument("--json", action="store_true", help="Print JSON.")
    parser.add_argument(
        "--no-arguments",
        action="store_true",
        help="Leave the arguments out (they may hold personal data).",
    )


@subcommand(
    "show",
    "Show one job: its task, queue, times, attempts, every attempt's traceback, arguments "
    "and return value.",
    _show_arguments,
)
def show(command: Any, options: dict[str, Any]) -> int:
    from stalwart.browsing import as_dict, find_job, graph, history

    backend = get_backend(options["backend"])
    job = find_job(backend.config.database, options["job_id"])
    if job is None:
        raise CommandError(
            f"No job has the id {options['job_id']} (finished jobs are deleted "
            "after their retention period)."
        )
    data = as_dict(job, with_arguments=not options.get("no_arguments"))
    data["runs_after"], data["dependants"] = graph(backend.config.database, job.id)
    if options.get("json"):
        command.stdout.write(json.dumps(data, indent=2))
        return 0
    data.pop("errors")
    for key in (
        "id",
        "status",
        "task_result_status",
        "task_path",
        "backend",
        "queue_name",
        "priority",
        "enqueued_at",
        "run_after",
        "available_at",
        "started_at",
        "last_attempted_at",
        "finished_at",
        "attempt",
        "max_attempts",
        "interruptions",
        "max_interruptions",
        "worker_ids",
        "owner",
        "concurrency_key",
        "concurrency_limit",
        "unique_key",
        "unique_while_running",
        "isolated",
        "cancel_requested_at",
        "runs_after",
        "dependants",
        "return_value",
        "args",
        "kwargs",
    ):
        if key == "backend":
            value = job.backend
        elif key in data:
            value = data[key]
        else:
            continue
        text = json.dumps(value) if isinstance(value, list | dict) else value
        command.stdout.write(f"{key + ':':22} {'-' if text is None else text}")
    ended = history(job)
    if not ended:
        command.stdout.write("\nNo attempt yet.")
    for attempt in ended:
        where = ", ".join(part for part in (attempt.at, attempt.process) if part)
        heading = f"\nAttempt {attempt.number}{f' ({where})' if where else ''}: {attempt.ended}"
        if attempt.ended == "failed":
            command.stdout.write(f"{heading}: {attempt.exception_class_path}")
            command.stdout.write(attempt.traceback.rstrip())
        elif attempt.cause:
            command.stdout.write(f"{heading}: {attempt.cause}")
        else:
            command.stdout.write(heading)
    return 0
