"""Nothing a job carries is ever rendered as markup: arguments, return values, error texts,
even a task path or queue name written into the row by hand."""

import pytest

import stalwart
from stalwart.models import Batch, Job
from tests.dashboard.conftest import ADMIN
from tests.helpers import drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

SCRIPT = "<script>alert('stalwart')</script>"
ESCAPED = "&lt;script&gt;alert(&#x27;stalwart&#x27;)&lt;/script&gt;"


def test_script_in_arguments_and_exception_text_renders_inert(viewer):
    job = tasks.fail.enqueue(SCRIPT)
    drain()
    for page in (f"/job/{job.id}/", "/jobs/failed/"):
        text = viewer.get(ADMIN + page).content.decode()
        assert "<script>alert" not in text
        assert ESCAPED in text


def test_script_in_a_return_value_and_in_stored_names_renders_inert(viewer):
    job = tasks.echo.enqueue(SCRIPT, note=SCRIPT)
    drain()
    Job.objects.filter(pk=job.id).update(
        task_path=f"tests.{SCRIPT}", concurrency_key=SCRIPT, unique_key="<b>bold</b>"
    )
    for page in (f"/job/{job.id}/", "/jobs/successful/"):
        text = viewer.get(ADMIN + page).content.decode()
        assert "<script>alert" not in text
        assert "<b>bold</b>" not in text
    detail = viewer.get(ADMIN + f"/job/{job.id}/").content.decode()
    assert detail.count(ESCAPED) >= 3  # task path, arguments, return value


def test_script_in_a_batchs_label_and_callbacks_renders_inert(viewer):
    batch = stalwart.batch(on_finish=tasks.noop, label=SCRIPT)
    member = batch.enqueue(tasks.add, 1, 1)
    Batch.objects.filter(pk=batch.id).update(
        callbacks={"on_finish": {"task_path": SCRIPT, "queue_name": "<b>bold</b>"}}
    )
    for page in (f"/batch/{batch.id}/", "/batches/", f"/job/{member.id}/"):
        text = viewer.get(ADMIN + page).content.decode()
        assert "<script>alert" not in text
        assert "<b>bold</b>" not in text
        assert ESCAPED in text
    detail = viewer.get(ADMIN + f"/batch/{batch.id}/").content.decode()
    assert detail.count(ESCAPED) >= 3  # title, label, the callback's task
