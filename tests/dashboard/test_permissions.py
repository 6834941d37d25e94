"""Who may see and do what: a view permission for every page, one per action, and a clear
403 page that names the missing permission."""

import copy

import pytest
from django.conf import settings
from django.test import Client, override_settings

import stalwart
from stalwart.models import Job, QueuePause
from tests.dashboard.conftest import ADMIN, csrf
from tests.helpers import drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

PAGES = ["/", "/jobs/failed/", "/processes/", "/recurring/"]


def test_logged_out_people_are_sent_to_the_login_page():
    for page in PAGES:
        response = Client().get(ADMIN + page)
        assert response.status_code == 302
        assert response["Location"].startswith("/admin/login/")


def test_staff_without_the_view_permission_get_a_403_that_says_why(login):
    job = tasks.add.enqueue(1, 1)
    client = login()
    for page in [*PAGES, f"/job/{job.id}/"]:
        response = client.get(ADMIN + page)
        assert response.status_code == 403
        text = response.content.decode()
        assert "needs the permission <code>stalwart.view_dashboard</code>" in text
        assert "Traceback" not in text
    assert "/admin/stalwart/dashboard/" not in client.get("/admin/").content.decode()


def test_each_action_needs_its_own_permission(login):
    failed = tasks.fail.enqueue()
    drain()
    later = tasks.add.using(queue_name="mail").enqueue(1, 1)
    viewer = login("stalwart.view_dashboard", username="viewer")
    page = f"{ADMIN}/job/{failed.id}/"
    token = csrf(viewer, page)
    assert "<button" not in viewer.get(page).content.decode().split('id="actions"')[-1][:50]
    for url, data, permission in (
        (f"{page}retry/", {}, "stalwart.retry_job"),
        (f"{page}discard/", {}, "stalwart.discard_job"),
        (f"{ADMIN}/job/{later.id}/cancel/", {}, "stalwart.cancel_job"),
        (f"{ADMIN}/job/{later.id}/run-now/", {}, "stalwart.run_job_now"),
        (f"{ADMIN}/queue/mail/pause/", {}, "stalwart.pause_queue"),
        (f"{ADMIN}/jobs/failed/bulk/", {"action": "retry", "scope": "all"}, "stalwart.retry_job"),
    ):
        response = viewer.post(url, {"csrfmiddlewaretoken": token, **data})
        assert response.status_code == 403, url
        assert f"<code>{permission}</code>" in response.content.decode()
    assert Job.objects.get(pk=failed.id).status == "failed"
    assert Job.objects.get(pk=later.id).status == "ready"
    assert not QueuePause.objects.exists()

    retrier = login("stalwart.view_dashboard", "stalwart.retry_job", username="retrier")
    text = retrier.get(page).content.decode()
    assert ">Retry</button>" in text
    assert ">Discard</button>" not in text
    token = csrf(retrier, page)
    assert retrier.post(f"{page}discard/", {"csrfmiddlewaretoken": token}).status_code == 403
    assert retrier.post(f"{page}retry/", {"csrfmiddlewaretoken": token}).status_code == 302
    assert Job.objects.get(pk=failed.id).status == "ready"


def test_enqueueing_a_recurring_task_now_needs_its_permission(login):
    tasks_setting = copy.deepcopy(settings.TASKS)
    tasks_setting["default"]["OPTIONS"]["recurring"] = {
        "nightly": {"task": "tests.testapp.tasks.add", "schedule": "@daily", "args": [2, 3]},
    }
    with override_settings(TASKS=tasks_setting):
        page = f"{ADMIN}/recurring/"
        url = f"{page}nightly/enqueue/"
        viewer = login("stalwart.view_dashboard", username="viewer")
        assert ">Enqueue now</button>" not in viewer.get(page).content.decode()
        refused = viewer.post(url, {"csrfmiddlewaretoken": csrf(viewer, page)})
        assert refused.status_code == 403
        assert "<code>stalwart.enqueue_recurring</code>" in refused.content.decode()
        allowed = login("stalwart.view_dashboard", "stalwart.enqueue_recurring")
        assert ">Enqueue now</button>" in allowed.get(page).content.decode()
        done = allowed.post(url, {"csrfmiddlewaretoken": csrf(allowed, page)})
        assert done.status_code == 302
        job = Job.objects.get()
        assert (job.task_path, job.args, job.status) == ("tests.testapp.tasks.add", [2, 3], "ready")
        missing = allowed.post(f"{page}nope/enqueue/", {"csrfmiddlewaretoken": csrf(allowed, page)})
        assert missing.status_code == 404


def test_cancelling_a_batch_needs_the_cancel_permission(login):
    batch = stalwart.batch()
    member = batch.enqueue(tasks.add, 1, 1)
    page = f"{ADMIN}/batch/{batch.id}/"
    url = f"{page}cancel/"
    viewer = login("stalwart.view_dashboard", username="viewer")
    assert "Cancel the batch" not in viewer.get(page).content.decode()
    for data in ({}, {"confirm": "yes"}):
        refused = viewer.post(url, {"csrfmiddlewaretoken": csrf(viewer, page), **data})
        assert refused.status_code == 403
        assert "<code>stalwart.cancel_job</code>" in refused.content.decode()
    assert Job.objects.get(pk=member.id).status == "ready"
    assert not batch.closed
    assert viewer.get(url).status_code == 405
    assert login().get(page).status_code == 403  # no view permission: no page
    allowed = login("stalwart.view_dashboard", "stalwart.cancel_job", username="canceller")
    assert "Cancel the batch" in allowed.get(page).content.decode()
    done = allowed.post(url, {"csrfmiddlewaretoken": csrf(allowed, page), "confirm": "yes"})
    assert done.status_code == 302
    assert Job.objects.get(pk=member.id).status == "cancelled"
