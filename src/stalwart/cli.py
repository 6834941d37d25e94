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
        help="Dispatcher processes to fork (default: one per OPTIONS['dispatchers'] entry, "
        "else 1). With 0, workers make due jobs ready themselves.",
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
