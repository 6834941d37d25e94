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
    return SUBCOMMANDS[options["subcommand"]].handle(command, options)


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


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} must be at least 1")
    return number


def _seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if number < 0:
        raise argparse.ArgumentTypeError(f"{value!r} must not be negative")
    return number


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
    parser.add_argument("--threads", type=_positive_int, help="Jobs run at once (default: 5).")
    parser.add_argument(
        "--poll-interval",
        type=_seconds,
        help="Seconds between polls when idle (default: 1 with PostgreSQL LISTEN/NOTIFY, "
        "0.2 otherwise).",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=_seconds,
        help="Seconds running jobs get to finish after TERM/INT before they are released.",
    )
    parser.add_argument(
        "--stop-when-empty",
        action="store_true",
        help="Exit once no job is ready, scheduled or running in these queues.",
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
        stop_when_empty=options.get("stop_when_empty", False),
    )
    status = worker.run()
    return end_process(status, abandon_threads=worker.abandoned_threads)
