"""Metrics as Prometheus reads them: from the view a project mounts and from ``queue
metrics``; counters that add up across worker processes."""

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db.models import F
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from stalwart import control
from stalwart.metrics import tally
from stalwart.models import Counter, Job
from tests.helpers import drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def counting():
    """This process counts its events into the database (added when flushed)."""
    counted = tally.install("default", background=False)
    yield counted
    tally.uninstall("default")


def scrape(text: str) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` from Prometheus's text format."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_view_reports_queue_gauges_counters_and_a_duration_histogram(counting):
    for number in range(3):
        tasks.add.enqueue(number, number)
    tasks.fail.using(queue_name="mail").enqueue("no")
    tasks.add.using(queue_name="mail").enqueue(1, 1)
    control.pause("mail")
    drain()
    # The older of the two waiting mail jobs has waited ten minutes more than it would have.
    oldest = Job.objects.filter(queue_name="mail").order_by("available_at").first()
    Job.objects.filter(pk=oldest.pk).update(available_at=F("available_at") - timedelta(minutes=10))
    counting.flush()
    response = Client().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = scrape(response.content.decode())
    add = "tests.testapp.tasks.add"
    assert samples[("stalwart_jobs_enqueued_total", (("queue", "default"), ("task", add)))] == 3
    assert samples[("stalwart_jobs_succeeded_total", (("queue", "default"), ("task", add)))] == 3
    fail = (("queue", "mail"), ("task", "tests.testapp.tasks.fail"))
    assert ("stalwart_jobs_failed_total", fail) not in samples  # paused: never ran
    assert samples[("stalwart_queue_jobs", (("queue", "mail"), ("state", "ready")))] == 2
    assert samples[("stalwart_queue_paused", (("queue", "mail"),))] == 1
    # By the database's clock, at least those ten minutes; at most a (generous) minute more.
    age = samples[("stalwart_queue_oldest_ready_age_seconds", (("queue", "mail"),))]
    assert 600 <= age < 660
    assert samples[("stalwart_job_duration_seconds_count", (("task", add),))] == 3
    assert samples[("stalwart_job_duration_seconds_bucket", (("le", "+Inf"), ("task", add)))] == 3
    assert samples[("stalwart_job_duration_seconds_sum", (("task", add),))] > 0


def test_counters_keep_counting_failures_retries_discards_and_cancels(counting):
    tasks.fail.enqueue("no")
    tasks.always_fails.enqueue()
    drain()
    later = tasks.add.using(run_after=timezone.now() + timedelta(days=1)).enqueue(1, 1)
    control.discard_failed(control.Selection(task_path="tests.testapp.tasks.fail"))
    import stalwart

    stalwart.cancel(later)
    counting.flush()
    out = StringIO()
    call_command("queue", "metrics", stdout=out)
    samples = scrape(out.getvalue())
    always = (("queue", "default"), ("task", "tests.testapp.tasks.always_fails"))
    assert samples[("stalwart_jobs_retried_total", always)] == 2
    assert samples[("stalwart_jobs_failed_total", always)] == 1
    assert samples[("stalwart_jobs_discarded_total", (("queue", ""), ("task", "")))] == 1
    assert samples[("stalwart_jobs_cancelled_total", (("queue", ""), ("task", "")))] == 1
    assert counting.flush() == 0  # nothing new since


def test_counts_survive_a_failed_write_and_are_added_later(counting):
    counting.record("job_enqueued", {"queue": "q", "task": "t"})
    Counter.objects.all().delete()
    with pytest.MonkeyPatch.context() as patch:
        from django.db import DatabaseError, connection

        from stalwart.db import statements_for

        def refuse(*args, **kwargs):
            raise DatabaseError("the database is away")

        patch.setattr(type(statements_for(connection)), "add_to_counters", refuse)
        assert counting.flush() == 0
    assert counting.pending()
    assert counting.flush() == 1
    assert Counter.objects.get(name="enqueued").value == 1
