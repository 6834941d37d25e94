"""``manage.py queue``: a thin shell over ``stalwart.cli``."""

import sys
from typing import Any

from django.core.management.base import BaseCommand

from stalwart import cli


class Command(BaseCommand):
    help = "Run and operate the Stalwart task queue. See 'queue SUBCOMMAND --help'."
    requires_system_checks = []  # 'queue check' runs them itself; workers must start fast

    def add_arguments(self, parser: Any) -> None:
        cli.add_arguments(parser)

    def handle(self, *args: Any, **options: Any) -> None:
        status = cli.run(self, options)
        if status:
            sys.exit(status)
