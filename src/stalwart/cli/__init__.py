"""``python manage.py queue <subcommand>``: the command-line interface.

The management command is a thin shell over this module. Each subcommand registers its
arguments and its handler here; handlers return an exit status.
"""

import argparse
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.db import DatabaseError
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, task_backends

from stalwart.aliases import BACKEND_PATH, is_stalwart

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


class SubcommandParser(CommandParser):
    """A subcommand's parser: it refuses arguments it does not know itself, so the error
    comes with the subcommand's usage (argparse leaves them to the top-level parser, whose
    usage says nothing about the subcommand)."""

    # Says what to do with arguments left over (those given), or None.
    leftover_hint: Callable[[list[str]], str | None] | None = None

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:
            hint = self.leftover_hint(extras) if self.leftover_hint else None
            self.error(
                f"unrecognized arguments: {' '.join(extras)}" + (f" ({hint})" if hint else "")
            )
        return parsed, extras


def add_arguments(parser: argparse.ArgumentParser) -> None:
    subparsers = parser.add_subparsers(
        dest="subcommand", metavar="SUBCOMMAND", required=True, parser_class=SubcommandParser
    )
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
        from stalwart.db.hints import explain

        raise CommandError(explain(error, _database_of(options))) from None


def _database_of(options: dict[str, Any]) -> str:
    """The database alias of the backend a subcommand was given (``default`` if unknown)."""
    from stalwart.backend import StalwartBackend

    try:
        backend = task_backends[options.get("backend") or DEFAULT_TASK_BACKEND_ALIAS]
    except Exception:  # noqa: BLE001 - the error being explained matters more
        return "default"
    return backend.config.database if isinstance(backend, StalwartBackend) else "default"


def get_backend(alias: str) -> Any:
    try:
        backend = task_backends[alias]
    except Exception as error:  # noqa: BLE001 - InvalidTaskBackend, ConfigurationError, ...
        raise CommandError(f"TASKS[{alias!r}] cannot be loaded: {error}") from None
    if not is_stalwart(backend):
        raise CommandError(
            f"TASKS[{alias!r}] uses {type(backend).__qualname__}, not {BACKEND_PATH}."
        )
    return backend


def configure_logging(verbosity: int) -> None:
    """Show Stalwart's log lines on stderr unless the project configured them already."""
    logger = logging.getLogger("stalwart")
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    logger.addHandler(handler)
    logger.setLevel({0: logging.ERROR, 1: logging.INFO}.get(verbosity, logging.DEBUG))


def end_process(status: int, *, abandon_threads: bool, at_once: bool = False) -> int:
    """End what the jobs started; return ``status``, but if job threads are still running,
    end the process right now (they must not run on, nor write anything more). ``at_once``:
    end it right now anyway, its log lines written: the interpreter's own finalization (a
    collection of the whole heap, seconds on a busy host) must not push a stop past its
    bound."""
    from stalwart.processes.forking import end_descendants, flush_logs

    end_descendants()
    if abandon_threads or at_once:
        flush_logs()
        os._exit(status)
    return status


def format_table(header: list[str], rows: list[list[str]]) -> str:
    """A plain text table: columns padded to their widest cell."""
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *rows, strict=True)]
    lines = [header, *rows]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in lines
    )


# The subcommands register themselves on import, in the order --help lists them.
from stalwart.cli import running, inspection, jobs, batches, steering, enqueueing  # noqa: E402, F401, I001
