"""Enqueue a handful of sample tasks, run a worker until they are done, show the results."""

from datetime import timedelta

from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.tasks import TaskResultStatus
from django.utils import timezone

from shop import tasks
from shop.logs import FAILS_ON_PURPOSE, ON_PURPOSE
from stalwart import Call, enqueue_many


def note(result) -> str:
    if result.task.run_after:
        return " (deferred 2 s)"
    if result.task.module_path == FAILS_ON_PURPOSE:
        return f" {ON_PURPOSE}"
    return ""


class Command(BaseCommand):
    help = "Run the Stalwart demo."

    def handle(self, *args, **options):
        self.stdout.write("Enqueueing sample tasks...")
        results = [
            tasks.send_receipt.enqueue(1001, "ada@example.com"),
            tasks.fetch_exchange_rate.enqueue("GBP"),
            tasks.nightly_report.using(run_after=timezone.now() + timedelta(seconds=2)).enqueue(),
            tasks.charge_card.enqueue(1002),
        ]
        results += enqueue_many(tasks.resize_image, [Call(f"photo-{n}.jpg", 640) for n in range(5)])
        for result in results:
            self.stdout.write(f"  {result.task.name:<20} {result.id}{note(result)}")

        self.stdout.write(
            "\nRunning a worker until the queue is empty (queue work --stop-when-empty)..."
        )
        call_command("queue", "work", "--stop-when-empty", "--poll-interval", "0.2")

        self.stdout.write("\nResults:")
        for result in results:
            result.refresh()
            if result.status == TaskResultStatus.SUCCESSFUL:
                outcome = repr(result.return_value)
            else:
                outcome = result.errors[-1].traceback.strip().splitlines()[-1]
                if result.task.module_path == FAILS_ON_PURPOSE:
                    outcome += f"  {ON_PURPOSE}"
            self.stdout.write(f"  {result.task.name:<20} {result.status:<10} {outcome}")
        self.stdout.write(self.style.SUCCESS("\nDone. The jobs are rows in example/db.sqlite3."))
