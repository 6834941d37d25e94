"""A bulk enqueue stores exactly what single enqueues store, however its rows are sent (on
PostgreSQL, more than a few rows go as binary arrays bound on the server)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from stalwart import Call, enqueue_many
from stalwart.models import Job
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

FIELDS = ("task_path", "queue_name", "priority", "status", "args", "kwargs", "max_attempts")


def stored(results) -> list[tuple]:
    rows = Job.objects.filter(id__in=[result.id for result in results]).values_list(*FIELDS)
    by_id = dict(zip([r.id for r in results], rows, strict=True))
    return [by_id[result.id] for result in results]


def test_many_rows_are_stored_as_one_at_a_time_would_store_them():
    calls = [
        Call(i, "ünïcode ☃", None, [1.5, {"nested": True}], key=f"value {i}", empty={})
        for i in range(60)
    ]
    later = timezone.now() + timedelta(hours=1)
    task = tasks.echo.using(priority=7, queue_name="bulk")
    bulk = enqueue_many(task, calls) + enqueue_many(task.using(run_after=later), calls)
    one_by_one = [task.enqueue(*c.args, **c.kwargs) for c in calls]
    one_by_one += [task.using(run_after=later).enqueue(*c.args, **c.kwargs) for c in calls]
    bulk_rows, single_rows = stored(bulk), stored(one_by_one)
    assert bulk_rows == single_rows
    assert {row[3] for row in bulk_rows} == {"ready", "scheduled"}
    assert bulk_rows[0][4] == [0, "ünïcode ☃", None, [1.5, {"nested": True}]]
    assert bulk_rows[0][5] == {"key": "value 0", "empty": {}}
