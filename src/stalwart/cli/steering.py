"""Steering the queue: ``pause``, ``resume``, ``retry``, ``discard``, ``run-now``, ``cancel``,
``prune``."""

import argparse
from collections.abc import Callable
from typing import Any

from django.core.management.base import CommandError

from stalwart.cli import get_backend, subcommand
from stalwart.cli.types import job_id, parse_duration, queue_name, whole

# -- queue control: pause, resume ------------------------------------------------------------


def _queue_name_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue_name", metavar="QUEUE", type=queue_name, help="The queue.")


@subcommand(
    "pause", "Stop every worker, on every host, claiming from a queue.", _queue_name_argument
)
def pause(command: Any, options: dict[str, Any]) -> int:
    from stalwart import control

    get_backend(options["backend"])
    name = options["queue_name"]
    if control.pause(name, backend=options["backend"]):
        command.stdout.write(f"Paused {name!r}; running jobs will finish.")
    else:
        command.stdout.write(f"{name!r} was already paused.")
    if not control.queue_users(name, backend=options["backend"]):
        known = ", ".join(control.named_queues(backend=options["backend"])) or "none"
        command.stderr.write(
            f"warning: no task, worker, recurring entry or job uses the queue {name!r} "
            f"(the project's tasks name: {known}). Misspelt? It is paused all the same; "
            f"'queue resume {name}' undoes it."
        )
    return 0


@subcommand("resume", "Let workers claim from a paused queue again.", _queue_name_argument)
def resume(command: Any, options: dict[str, Any]) -> int:
    from stalwart import control

    get_backend(options["backend"])
    if control.resume(options["queue_name"], backend=options["backend"]):
        command.stdout.write(f"Resumed {options['queue_name']!r}.")
    else:
        command.stdout.write(f"{options['queue_name']!r} was not paused.")
    return 0


# -- failed and scheduled jobs: retry, discard, run-now --------------------------------------


def _selection_arguments(everything: str) -> Callable[[argparse.ArgumentParser], None]:
    """The arguments that select jobs; ``everything`` says what ``--all`` selects."""

    def add(parser: argparse.ArgumentParser) -> None:
        _add_selection_arguments(parser, everything)

    return add


def _add_selection_arguments(parser: argparse.ArgumentParser, everything: str) -> None:
    parser.add_argument(
        "ids", metavar="JOB_ID", nargs="*", type=job_id, help="Jobs by id (the TaskResult id)."
    )
    parser.add_argument("--task", metavar="PATH", help="Jobs of this task (dotted path).")
    parser.add_argument("--queue", metavar="QUEUE", type=queue_name, help="Jobs of this queue.")
    parser.add_argument("--all", action="store_true", help=everything)
    parser.add_argument(
        "--dry-run", action="store_true", help="Count what would be done; change nothing."
    )
    parser.add_argument(
        "--batch-size",
        type=whole(1, 100_000),
        default=1000,
        help="Jobs per statement (default: %(default)s).",
    )


def _selection(options: dict[str, Any]) -> Any:
    from stalwart.control import Selection

    if not (options["ids"] or options["task"] or options["queue"] or options["all"]):
        raise CommandError("Say which jobs: JOB_ID ..., --task PATH, --queue QUEUE or --all.")
    return Selection(
        ids=options["ids"],
        task_path=options["task"],
        queue_name=options["queue"],
        everything=options["all"],
    )


_REPORTS = {
    # verb: (dry run, done); {n} jobs, {s} plural ending
    "retry": ("Would retry {n} failed job{s}", "Retried {n} failed job{s}"),
    "discard": ("Would discard {n} failed job{s}", "Discarded {n} failed job{s}"),
    "run now": (
        "Would make {n} scheduled job{s} claimable now",
        "Made {n} scheduled job{s} claimable now",
    ),
}
_WAITING_NOTE = " (jobs with a concurrency key wait for a free slot)"


def _report_count(command: Any, options: dict[str, Any], done: int, verb: str, noun: str) -> None:
    dry, wet = _REPORTS[verb]
    text = (dry if options["dry_run"] else wet).format(n=done, s="" if done == 1 else "s")
    if options["dry_run"]:
        text += " (dry run: nothing changed)"
    elif verb != "discard" and done:
        text += _WAITING_NOTE
    command.stdout.write(text + ".")


def _bulk(command: Any, options: dict[str, Any], verb: str, noun: str) -> int:
    from stalwart import control

    operation = {
        "retry": control.retry_failed,
        "discard": control.discard_failed,
        "run now": control.run_now,
    }[verb]
    get_backend(options["backend"])
    done = operation(
        _selection(options),
        backend=options["backend"],
        dry_run=options["dry_run"],
        batch_size=options["batch_size"],
    )
    if not done and options["task"]:
        _refuse_unknown_task(options["task"])
    _report_count(command, options, done, verb, noun)
    return 0


def _refuse_unknown_task(path: str) -> None:
    """``--task`` selected nothing: say so if the path is no task either (a typo), rather
    than report 0 jobs as if all were well. (The jobs of a task since removed are still
    selected by its path.)"""
    from stalwart.exceptions import TaskNotFound
    from stalwart.resolution import resolve_task

    try:
        resolve_task(path)
    except TaskNotFound as error:
        raise CommandError(
            f"--task {path!r} matches no job, and no task of the project: {path!r} {error.reason}."
        ) from None


@subcommand(
    "retry",
    "Give failed jobs another attempt (their errors are kept).",
    _selection_arguments("Every failed job."),
)
def retry(command: Any, options: dict[str, Any]) -> int:
    return _bulk(command, options, "retry", "failed")


@subcommand("discard", "Delete failed jobs.", _selection_arguments("Every failed job."))
def discard(command: Any, options: dict[str, Any]) -> int:
    return _bulk(command, options, "discard", "failed")


@subcommand(
    "run-now",
    "Make scheduled jobs claimable now instead of at their time.",
    _selection_arguments("Every scheduled job."),
)
def run_now(command: Any, options: dict[str, Any]) -> int:
    return _bulk(command, options, "run now", "scheduled")


# -- cancel ----------------------------------------------------------------------------------


@subcommand(
    "cancel",
    "Cancel waiting jobs (scheduled, blocked, ready) at once, and ask running ones to stop "
    "(their task sees it in its context; nothing is killed). Finished jobs are left alone.",
    _selection_arguments("Every job not finished: scheduled, blocked, ready and running."),
)
def cancel(command: Any, options: dict[str, Any]) -> int:
    from stalwart import control

    get_backend(options["backend"])
    done = control.cancel_jobs(
        _selection(options),
        backend=options["backend"],
        dry_run=options["dry_run"],
        batch_size=options["batch_size"],
    )

    def jobs(n: int) -> str:
        return f"{n} {'job' if n == 1 else 'jobs'}"

    if options["dry_run"]:
        command.stdout.write(
            f"Would cancel {jobs(done.cancelled)} waiting, and ask {jobs(done.requested)} "
            "running to stop (dry run: nothing changed)."
        )
    else:
        command.stdout.write(
            f"Cancelled {jobs(done.cancelled)} waiting; asked {jobs(done.requested)} running "
            "to stop (each stops when its task checks context.cancel_requested)."
        )
    return 0


# -- prune -----------------------------------------------------------------------------------


def _prune_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--older-than",
        type=parse_duration,
        required=True,
        metavar="DURATION",
        help="Delete jobs finished longer ago than this (90s, 15m, 12h, 7d).",
    )
    parser.add_argument(
        "--status",
        choices=["successful", "failed", "cancelled", "all"],
        default="all",
        help="Which finished jobs (default: %(default)s).",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
    )
    parser.add_argument(
        "--batch-size",
        type=whole(1, 100_000),
        default=1000,
        help="Jobs (or batches) per statement (default: %(default)s).",
    )


@subcommand(
    "prune",
    "Delete finished jobs older than a given age, and the batches they leave empty, in batches.",
    _prune_arguments,
)
def prune(command: Any, options: dict[str, Any]) -> int:
    from stalwart import control

    get_backend(options["backend"])
    statuses = (
        ["successful", "failed", "cancelled"] if options["status"] == "all" else [options["status"]]
    )
    chosen = {
        "older_than": options["older_than"],
        "statuses": statuses,
        "backend": options["backend"],
        "dry_run": options["dry_run"],
        "batch_size": options["batch_size"],
    }
    # The jobs first: a batch goes once no job of it is left.
    done = control.prune_finished(**chosen)
    batches = control.prune_batches(**chosen)
    deleted = (
        f"{done} finished {'job' if done == 1 else 'jobs'} and "
        f"{batches} {'batch' if batches == 1 else 'batches'}"
    )
    if options["dry_run"]:
        command.stdout.write(f"Would delete {deleted} (dry run: nothing changed).")
    else:
        command.stdout.write(f"Deleted {deleted}.")
    return 0
