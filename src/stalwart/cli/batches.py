"""``queue batches``: the batches, newest first, each with its members by state."""

import argparse
import json
from typing import Any

from stalwart.cli import format_table, get_backend, subcommand
from stalwart.cli.types import whole


def _batches_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit", type=whole(1, 1000), default=20, help="Batches to list (default: %(default)s)."
    )
    parser.add_argument(
        "--unfinished",
        action="store_true",
        help="Only the batches whose callbacks are still to come (open, or closed and waiting).",
    )
    parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")


@subcommand(
    "batches",
    "List batches, newest first: open, closed or finished, with their members by state.",
    _batches_arguments,
)
def batches(command: Any, options: dict[str, Any]) -> int:
    from stalwart.browsing import batch_summaries

    backend = get_backend(options["backend"])
    listed = batch_summaries(
        backend.config.database,
        backend.alias,
        limit=options["limit"],
        unfinished=bool(options.get("unfinished")),
    )
    for item in listed:
        item["created_at"] = item["created_at"].isoformat()
    if options.get("json"):
        command.stdout.write(json.dumps({"batches": listed}, indent=2))
        return 0
    if not listed:
        command.stdout.write("No batches.")
        return 0
    header = ["ID", "LABEL", "STATE", "TOTAL", "WAITING", "RUNNING", "OK", "FAILED", "CANCELLED"]
    columns = ("total", "waiting", "running", "succeeded", "failed", "cancelled")
    table = [
        [item["id"], item["label"] or "-", item["state"], *(str(item[key]) for key in columns)]
        for item in listed
    ]
    command.stdout.write(format_table(header, table))
    return 0
