"""``enqueue``: one call of a task, from the command line."""

import argparse
import json
from typing import Any

from django.core.management.base import CommandError

from stalwart.cli import get_backend, subcommand
from stalwart.cli.types import json_value, parse_duration, queue_name, whole

# -- enqueue ---------------------------------------------------------------------------------


def _positional_values_hint(extras: list[str]) -> str | None:
    values = [value for value in extras if not value.startswith("-")]
    if not values:
        return None
    example = json.dumps([_as_json(value) for value in values])
    return f"the task's arguments go in --args, as a JSON array: --args '{example}'"


def _as_json(value: str) -> Any:
    try:
        return json.loads(value)
    except ValueError:
        return value


def _enqueue_arguments(parser: argparse.ArgumentParser) -> None:
    parser.leftover_hint = _positional_values_hint  # type: ignore[attr-defined]
    parser.add_argument(
        "task_path",
        metavar="TASK_PATH",
        help="The dotted path of a task, e.g. myapp.tasks.send_report.",
    )
    parser.add_argument(
        "--args",
        dest="call_args",
        type=json_value(list),
        default=[],
        metavar="JSON",
        help="Positional arguments as a JSON array (default: []).",
    )
    parser.add_argument(
        "--kwargs",
        dest="call_kwargs",
        type=json_value(dict),
        default={},
        metavar="JSON",
        help="Keyword arguments as a JSON object (default: {}).",
    )
    parser.add_argument("--queue", type=queue_name, help="Queue (default: the task's).")
    parser.add_argument(
        "--priority",
        type=whole(-100, 100),
        help="Priority from -100 to 100 (default: the task's).",
    )
    parser.add_argument(
        "--in",
        dest="delay",
        type=parse_duration,
        metavar="DURATION",
        help="Run no sooner than this from now (90s, 15m, 12h, 7d).",
    )


@subcommand("enqueue", "Enqueue one call of a task, and print its id.", _enqueue_arguments)
def enqueue(command: Any, options: dict[str, Any]) -> int:
    from django.tasks.exceptions import InvalidTask
    from django.utils import timezone

    from stalwart.exceptions import TaskNotFound
    from stalwart.resolution import resolve_task

    backend = get_backend(options["backend"])
    try:
        task = resolve_task(options["task_path"])
        changes: dict[str, Any] = {"backend": backend.alias}
        if options.get("queue"):
            changes["queue_name"] = options["queue"]
        if options.get("priority") is not None:
            changes["priority"] = options["priority"]
        if options.get("delay") is not None:
            changes["run_after"] = timezone.now() + options["delay"]
        result = task.using(**changes).enqueue(*options["call_args"], **options["call_kwargs"])
    except (TaskNotFound, InvalidTask, TypeError) as error:
        raise CommandError(str(error)) from None
    command.stdout.write(result.id)
    return 0
