"""``python manage.py queue <subcommand>``: the command-line interface.

The management command is a thin shell over this module. Each subcommand registers its
arguments and its handler here; handlers return an exit status.
"""

import argparse
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.management.base import CommandError
from django.db import DatabaseError
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, task_backends

from stalwart.exceptions import ConfigurationError, InvalidQueueName
from stalwart.queues import QueueSelector

# Django's own flags, accepted after the subcommand too (``queue work -v 2``).
_DJANGO_FLAGS: list[tuple[tuple[str, ...], dict[str, Any]]] = [
    (("-v", "--verbosity"), {"type": int, "choices": [0, 1, 2, 3]}),
    (("--settings",), {}),
    (("--pythonpath",), {}),
    (("--traceback",), {"action": "store_true"}),
    (("--no-color",), {"action": "store_true"}),
    (("--force-color",), {"action": "store_true"}),
    (("--skip-checks",), {"action": "store_true"}),
]


@dataclass(frozen=True)
class Subcommand:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    handle: Callable[[Any, dict[str, Any]], int]


SUBCOMMANDS: dict[str, Subcommand] = {}


def subcommand(name: str, help: str, arguments: Callable[[argparse.ArgumentParser], None]):
    def register(handle: Callable[[Any, dict[str, Any]], int]) -> Callable:
        SUBCOMMANDS[name] = Subcommand(name, help, arguments, handle)
        return handle

    return register


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subparsers = parser.add_subparsers(dest="subcommand", metavar="SUBCOMMAND", required=True)
    for command in SUBCOMMANDS.values():
        sub = subparsers.add_parser(command.name, help=command.help, description=command.help)
        sub.add_argument(
            "--backend",
            default=DEFAULT_TASK_BACKEND_ALIAS,
            help="The TASKS alias of the Stalwart backend (default: %(default)s).",
        )
        command.add_arguments(sub)
        for flags, kwargs in _DJANGO_FLAGS:
            sub.add_argument(*flags, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)


def run(command: Any, options: dict[str, Any]) -> int:
    try:
        return SUBCOMMANDS[options["subcommand"]].handle(command, options)
    except DatabaseError as error:
        if options.get("traceback"):
            raise
        hint = ""
        text = str(error).lower()
        if "no such table" in text or "does not exist" in text:
            hint = " Are Stalwart's tables there? Run 'python manage.py migrate'."
        raise CommandError(f"The database said: {str(error).strip()}.{hint}") from None


def get_backend(alias: str) -> Any:
    from stalwart.backend import StalwartBackend

    try:
        backend = task_backends[alias]
    except Exception as error:  # noqa: BLE001 - InvalidTaskBackend, ConfigurationError, ...
        raise CommandError(f"TASKS[{alias!r}] cannot be loaded: {error}") from None
    if not isinstance(backend, StalwartBackend):
        raise CommandError(
            f"TASKS[{alias!r}] uses {type(backend).__qualname__}, not "
            "stalwart.backend.StalwartBackend."
        )
    return backend


def _queues(value: str) -> QueueSelector:
    try:
        return QueueSelector.parse(value)
    except InvalidQueueName as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _whole(minimum: int, maximum: int) -> Callable[[str], int]:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"{value!r} must be at least {minimum}")
        if number > maximum:
            raise argparse.ArgumentTypeError(f"{value!r} must be at most {maximum}")
        return number

    return parse


def _seconds_between(minimum: float, maximum: float) -> Callable[[str], float]:
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
        if not minimum <= number <= maximum:
            raise argparse.ArgumentTypeError(
                f"{value!r} must be between {minimum:g} and {maximum:g} seconds"
            )
        return number

    return parse


_positive_int = _whole(1, 1000)
_poll_seconds = _seconds_between(0.01, 3600)
_seconds = _seconds_between(0, 86400)


def configure_logging(verbosity: int) -> None:
    """Show Stalwart's log lines on stderr unless the project configured them already."""
    logger = logging.getLogger("stalwart")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel({0: logging.ERROR, 1: logging.INFO}.get(verbosity, logging.DEBUG))


def end_process(status: int, *, abandon_threads: bool) -> int:
    """Return ``status``; but if job threads are still running, end the process right now."""
    if abandon_threads:
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


# -- work ------------------------------------------------------------------------------------


def _work_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queues",
        type=_queues,
        help="Queues to claim from, in order: names, 'prefix*', '*' for all, '!name' to "
        "exclude (default: the first worker entry of OPTIONS['workers'], else '*').",
    )
    parser.add_argument(
        "--threads",
        type=_positive_int,
        help="Jobs run at once, 1 to 1000 (default: OPTIONS['workers'][0]['threads'], else 5).",
    )
    parser.add_argument(
        "--poll-interval",
        type=_poll_seconds,
        help="Seconds between polls when idle (default: OPTIONS['workers'][0]['poll_interval'], "
        "else 1 with PostgreSQL LISTEN/NOTIFY and 0.2 otherwise).",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        help="Seconds running jobs get to finish after TERM/INT before they are released "
        "(default: OPTIONS['shutdown_timeout'], else 30).",
    )
    parser.add_argument(
        "--stop-when-empty",
        action="store_true",
        help="Exit once no job is ready or scheduled in these queues and this worker runs none.",
    )


@subcommand(
    "work", "Run one worker process: claim and run jobs until TERM or INT.", _work_arguments
)
def work(command: Any, options: dict[str, Any]) -> int:
    from dataclasses import replace

    from stalwart.processes.worker import Worker

    backend = get_backend(options["backend"])
    configure_logging(options.get("verbosity", 1))
    config = backend.config
    if options.get("shutdown_timeout") is not None:
        config = replace(config, shutdown_timeout=options["shutdown_timeout"])
    try:
        worker_options = config.worker(
            queues=options.get("queues"),
            threads=options.get("threads"),
            poll_interval=options.get("poll_interval"),
        )
    except ConfigurationError as error:
        raise CommandError(str(error)) from None
    worker = Worker(
        config=config,
        worker=worker_options,
        promote_scheduled=True,
        prune_dead=True,
        stop_when_empty=options.get("stop_when_empty", False),
    )
    try:
        status = worker.run()
    except BaseException:
        if worker.abandoned_threads:
            # Jobs were released while their threads still run: end now, not at interpreter
            # shutdown, so they never run here and elsewhere at once.
            import traceback

            traceback.print_exc()
            end_process(1, abandon_threads=True)
        raise
    return end_process(status, abandon_threads=worker.abandoned_threads)


# -- supervise -------------------------------------------------------------------------------


_non_negative_int = _whole(0, 1000)


def _supervise_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--queues",
        type=_queues,
        help="Run one kind of worker, claiming from these queues (overrides OPTIONS['workers']).",
    )
    parser.add_argument("--threads", type=_positive_int, help="Threads per worker process.")
    parser.add_argument("--processes", type=_positive_int, help="Worker processes to fork.")
    parser.add_argument(
        "--dispatchers",
        type=_non_negative_int,
        help="Dispatcher processes to fork (default: one per OPTIONS['dispatchers'] entry; "
        "that setting defaults to one entry). With 0, workers make due jobs ready themselves.",
    )
    parser.add_argument(
        "--no-scheduler", action="store_true", help="Do not fork the scheduler process."
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        help="Seconds running jobs get to finish after TERM/INT before they are released "
        "(default: OPTIONS['shutdown_timeout'], else 30).",
    )


def build_slots(config: Any) -> list:
    """The children a supervisor with this configuration forks."""
    from stalwart.processes.dispatcher import Dispatcher
    from stalwart.processes.scheduler import Scheduler
    from stalwart.processes.supervisor import ChildSlot
    from stalwart.processes.worker import Worker

    slots = []
    # Without a dispatcher, workers make due jobs ready themselves.
    workers_promote = not config.dispatchers
    for worker_options in config.workers:
        for _ in range(worker_options.processes):
            slots.append(
                ChildSlot(
                    "worker",
                    len(slots),
                    lambda supervisor, parent, w=worker_options: Worker(
                        config=config,
                        worker=w,
                        supervisor=supervisor,
                        parent_pid=parent,
                        promote_scheduled=workers_promote,
                    ),
                )
            )
    for dispatcher_options in config.dispatchers:
        slots.append(
            ChildSlot(
                "dispatcher",
                len(slots),
                lambda supervisor, parent, d=dispatcher_options: Dispatcher(
                    config=config, dispatcher=d, supervisor=supervisor, parent_pid=parent
                ),
            )
        )
    if config.scheduler is not None:
        slots.append(
            ChildSlot(
                "scheduler",
                len(slots),
                lambda supervisor, parent: Scheduler(
                    config=config,
                    scheduler=config.scheduler,
                    supervisor=supervisor,
                    parent_pid=parent,
                ),
            )
        )
    return slots


def supervised_config(config: Any, options: dict[str, Any]) -> Any:
    """The configuration with command-line overrides applied."""
    from dataclasses import replace

    from stalwart.conf import DispatcherOptions

    changes: dict[str, Any] = {}
    if options.get("shutdown_timeout") is not None:
        changes["shutdown_timeout"] = options["shutdown_timeout"]
    worker_overrides = {
        key: options.get(key)
        for key in ("queues", "threads", "processes")
        if options.get(key) is not None
    }
    if worker_overrides:
        changes["workers"] = (config.worker(**worker_overrides),)
    if options.get("dispatchers") is not None:
        base = config.dispatchers[0] if config.dispatchers else DispatcherOptions()
        changes["dispatchers"] = (base,) * options["dispatchers"]
    if options.get("no_scheduler"):
        changes["scheduler"] = None
    return replace(config, **changes)


@subcommand(
    "supervise",
    "Run the supervisor: fork workers, dispatchers and the scheduler, and keep them running.",
    _supervise_arguments,
)
def supervise(command: Any, options: dict[str, Any]) -> int:
    from stalwart.processes.supervisor import Supervisor

    backend = get_backend(options["backend"])
    configure_logging(options.get("verbosity", 1))
    config = supervised_config(backend.config, options)
    return Supervisor(config=config, slots=build_slots(config)).run()


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


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """A plain text table: columns padded to their widest cell."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [header, *rows]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


# -- queue control: pause, resume ------------------------------------------------------------


def _queue_name_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("queue_name", metavar="QUEUE", type=_queue_name, help="The queue.")


def _queue_name(value: str) -> str:
    from stalwart.queues import validate_queue_name

    try:
        return validate_queue_name(value)
    except InvalidQueueName as error:
        raise argparse.ArgumentTypeError(str(error)) from None


@subcommand(
    "pause", "Stop every worker, on every host, claiming from a queue.", _queue_name_argument
)
def pause(command: Any, options: dict[str, Any]) -> int:
    from stalwart import control

    get_backend(options["backend"])
    if control.pause(options["queue_name"], backend=options["backend"]):
        command.stdout.write(f"Paused {options['queue_name']!r}; running jobs will finish.")
    else:
        command.stdout.write(f"{options['queue_name']!r} was already paused.")
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


def _selection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "ids", metavar="JOB_ID", nargs="*", type=_job_id, help="Jobs by id (the TaskResult id)."
    )
    parser.add_argument("--task", metavar="PATH", help="Jobs of this task (dotted path).")
    parser.add_argument("--queue", metavar="QUEUE", type=_queue_name, help="Jobs of this queue.")
    parser.add_argument("--all", action="store_true", help="Every job in that state.")
    parser.add_argument(
        "--dry-run", action="store_true", help="Count what would be done; change nothing."
    )
    parser.add_argument(
        "--batch-size",
        type=_whole(1, 100_000),
        default=1000,
        help="Jobs per statement (default: %(default)s).",
    )


def _job_id(value: str) -> str:
    import uuid

    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a job id") from None


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


def _report_count(command: Any, options: dict[str, Any], done: int, verb: str, noun: str) -> None:
    jobs = "job" if done == 1 else "jobs"
    if options["dry_run"]:
        command.stdout.write(f"Would {verb} {done} {noun} {jobs} (dry run: nothing changed).")
    else:
        past = {"retry": "Retried", "discard": "Discarded", "run now": "Made ready"}[verb]
        command.stdout.write(f"{past} {done} {noun} {jobs}.")


@subcommand(
    "retry", "Give failed jobs another attempt (their errors are kept).", _selection_arguments
)
def retry(command: Any, options: dict[str, Any]) -> int:
    from stalwart import control

    get_backend(options["backend"])
    done = control.retry_failed(
        _selection(options),
        backend=options["backend"],
        dry_run=options["dry_run"],
        batch_size=options["batch_size"],
    )
    _report_count(command, options, done, "retry", "failed")
    return 0


@subcommand("discard", "Delete failed jobs.", _selection_arguments)
def discard(command: Any, options: dict[str, Any]) -> int:
    from stalwart import control

    get_backend(options["backend"])
    done = control.discard_failed(
        _selection(options),
        backend=options["backend"],
        dry_run=options["dry_run"],
        batch_size=options["batch_size"],
    )
    _report_count(command, options, done, "discard", "failed")
    return 0


@subcommand(
    "run-now", "Make scheduled jobs claimable now instead of at their time.", _selection_arguments
)
def run_now(command: Any, options: dict[str, Any]) -> int:
    from stalwart import control

    get_backend(options["backend"])
    done = control.run_now(
        _selection(options),
        backend=options["backend"],
        dry_run=options["dry_run"],
        batch_size=options["batch_size"],
    )
    _report_count(command, options, done, "run now", "scheduled")
    return 0


# -- prune -----------------------------------------------------------------------------------


_DURATION = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_duration(value: str) -> Any:
    """'90s', '15m', '12h', '7d', '2w' or plain seconds, as a timedelta."""
    from datetime import timedelta

    text = value.strip().lower()
    unit = text[-1:] if text[-1:] in _DURATION else "s"
    number = text[:-1] if text[-1:] in _DURATION else text
    try:
        amount = float(number)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a duration (examples: 90s, 15m, 12h, 7d, 2w)"
        ) from None
    if amount < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must not be negative")
    return timedelta(seconds=amount * _DURATION[unit])


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
        choices=["successful", "failed", "all"],
        default="all",
        help="Which finished jobs (default: %(default)s).",
    )
    parser.add_argument(
        "--dry-run", action="store_true", help="Count what would be deleted; delete nothing."
    )
    parser.add_argument(
        "--batch-size",
        type=_whole(1, 100_000),
        default=1000,
        help="Jobs per statement (default: %(default)s).",
    )


@subcommand("prune", "Delete finished jobs older than a given age, in batches.", _prune_arguments)
def prune(command: Any, options: dict[str, Any]) -> int:
    from stalwart import control

    get_backend(options["backend"])
    statuses = ["successful", "failed"] if options["status"] == "all" else [options["status"]]
    done = control.prune_finished(
        older_than=options["older_than"],
        statuses=statuses,
        backend=options["backend"],
        dry_run=options["dry_run"],
        batch_size=options["batch_size"],
    )
    jobs = "job" if done == 1 else "jobs"
    if options["dry_run"]:
        command.stdout.write(f"Would delete {done} finished {jobs} (dry run: nothing changed).")
    else:
        command.stdout.write(f"Deleted {done} finished {jobs}.")
    return 0
