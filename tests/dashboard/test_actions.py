"""The dashboard's actions through Django's test client: each a POST with a CSRF token,
each behind its own permission, bulk ones confirmed with their count first."""

import re
from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.utils import timezone

import stalwart
from stalwart import Call
from stalwart.models import Job, QueuePause
from tests.dashboard.conftest import ADMIN, csrf
from tests.helpers import drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def status(job) -> str:
    return Job.objects.get(pk=job.id).status


def said(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def post(client, url: str, page: str, **data) -> object:
    return client.post(url, {"csrfmiddlewaretoken": csrf(client, page), **data})


def failed_jobs(count: int, **using) -> list:
    jobs = [tasks.fail.using(**using).enqueue() for _ in range(count)]
    drain(queues=using.get("queue_name", "default"))
    return jobs


def test_retry_and_discard_a_failed_job_from_its_page(operator):
    retried, discarded = failed_jobs(2)
    page = f"{ADMIN}/job/{retried.id}/"
    response = post(operator, f"{page}retry/", page)
    assert response.status_code == 302
    assert response["Location"] == page
    assert said(response) == ["Retried 1 failed job."]
    assert status(retried) == "ready"
    page = f"{ADMIN}/job/{discarded.id}/"
    response = post(operator, f"{page}discard/", page)
    assert response["Location"] == f"{ADMIN}/jobs/failed/"
    assert not Job.objects.filter(pk=discarded.id).exists()


def test_cancel_a_scheduled_job_and_ask_a_running_one_to_stop(operator):
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    page = f"{ADMIN}/job/{later.id}/"
    assert ">Cancel</button>" in operator.get(page).content.decode()
    response = post(operator, f"{page}cancel/", page)
    assert said(response) == ["Cancelled 1 waiting job; asked 0 running jobs to stop."]
    assert status(later) == "cancelled"
    running = tasks.add.enqueue(2, 2)
    Job.objects.filter(pk=running.id).update(status="running", owner=7, attempt=1)
    page = f"{ADMIN}/job/{running.id}/"
    assert ">Ask to stop</button>" in operator.get(page).content.decode()
    post(operator, f"{page}cancel/", page)
    row = Job.objects.get(pk=running.id)
    assert (row.status, row.cancel_requested_at is not None) == ("running", True)
    assert "cancel requested" in operator.get(page).content.decode()


def test_run_a_scheduled_job_now_from_the_list(operator):
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    page = f"{ADMIN}/jobs/scheduled/"
    assert f'formaction="{ADMIN}/job/{later.id}/run-now/"' in operator.get(page).content.decode()
    post(operator, f"{ADMIN}/job/{later.id}/run-now/", page)
    assert status(later) == "ready"


def test_an_action_that_does_not_fit_the_state_changes_nothing(operator):
    job = tasks.add.enqueue(1, 1)
    page = f"{ADMIN}/job/{job.id}/"
    response = post(operator, f"{page}retry/", page)
    assert said(response) == ["A ready job cannot be given 'retry'."]
    assert status(job) == "ready"
    assert operator.get(f"{page}retry/").status_code == 405
    assert post(operator, f"{page}explode/", page).status_code == 404


def test_bulk_retry_of_the_selection_is_confirmed_with_its_count(operator):
    first, second, third = failed_jobs(3)
    page = f"{ADMIN}/jobs/failed/"
    url = f"{page}bulk/"
    chosen = {"action": "retry", "scope": "selected", "ids": [first.id, second.id]}
    confirm = post(operator, url, page, **chosen)
    assert confirm.status_code == 200
    assert "2 failed jobs will be retried" in confirm.content.decode()
    assert {status(job) for job in (first, second, third)} == {"failed"}
    done = post(operator, url, page, confirm="yes", **chosen)
    assert said(done) == ["Retried 2 failed jobs."]
    assert [status(job) for job in (first, second, third)] == ["ready", "ready", "failed"]


def test_bulk_discard_of_everything_matching_the_filter(operator):
    kept = failed_jobs(1)
    gone = failed_jobs(3, queue_name="mail")
    page = f"{ADMIN}/jobs/failed/?queue=mail"
    text = operator.get(page).content.decode()
    assert "Discard all 3 matching…" in text
    request = {"action": "discard", "scope": "all", "queue": "mail"}
    confirm = post(operator, f"{ADMIN}/jobs/failed/bulk/", page, **request)
    assert "3 failed jobs will be discarded" in confirm.content.decode()
    done = post(operator, f"{ADMIN}/jobs/failed/bulk/", page, confirm="yes", **request)
    assert done["Location"] == f"{ADMIN}/jobs/failed/?queue=mail"
    assert not Job.objects.filter(pk__in=[job.id for job in gone]).exists()
    assert status(kept[0]) == "failed"


def test_bulk_cancel_from_a_state_touches_only_that_state(operator):
    ready = [tasks.add.using(priority=3).enqueue(n, n) for n in range(2)]
    other = tasks.add.enqueue(9, 9)
    later = tasks.add.using(priority=3, run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    page = f"{ADMIN}/jobs/ready/?priority=3"
    request = {"action": "cancel", "scope": "all", "priority": "3", "confirm": "yes"}
    done = post(operator, f"{ADMIN}/jobs/ready/bulk/", page, **request)
    assert said(done) == ["Cancelled 2 waiting jobs; asked 0 running jobs to stop."]
    assert [status(job) for job in ready] == ["cancelled", "cancelled"]
    assert (status(other), status(later)) == ("ready", "scheduled")


def test_a_bulk_action_with_nothing_selected_says_so(operator):
    failed_jobs(1)
    page = f"{ADMIN}/jobs/failed/"
    response = post(operator, f"{page}bulk/", page, action="retry", scope="selected")
    assert said(response) == ["Select some jobs first."]
    bad = post(operator, f"{page}bulk/", page, action="run-now", scope="all")
    assert bad.status_code == 400


def test_pause_and_resume_a_queue_from_the_overview(operator):
    tasks.add.using(queue_name="mail").enqueue(1, 1)
    page = f"{ADMIN}/"
    assert re.search(r">Pause</button>", operator.get(page).content.decode())
    response = post(operator, f"{ADMIN}/queue/mail/pause/", page)
    assert said(response) == ["Paused 'mail'; running jobs finish."]
    assert QueuePause.objects.filter(queue_name="mail").exists()
    assert ">Resume</button>" in operator.get(page).content.decode()
    post(operator, f"{ADMIN}/queue/mail/resume/", page)
    assert not QueuePause.objects.exists()
    assert post(operator, f"{ADMIN}/queue/no%20way/pause/", page).status_code == 400


def test_csrf_is_checked_on_every_action(operator):
    job = failed_jobs(1)[0]
    batch = stalwart.batch()
    for url, data in (
        (f"{ADMIN}/job/{job.id}/retry/", {}),
        (f"{ADMIN}/batch/{batch.id}/cancel/", {"confirm": "yes"}),
        (f"{ADMIN}/jobs/failed/bulk/", {"action": "retry", "scope": "all", "confirm": "yes"}),
        (f"{ADMIN}/queue/default/pause/", {}),
    ):
        response = operator.post(url, data)
        assert response.status_code == 403
        assert b"CSRF" in response.content
    assert status(job) == "failed"
    assert not QueuePause.objects.exists()
    assert not batch.closed


def test_cancel_a_batch_from_its_page_once_confirmed(operator):
    batch = stalwart.batch(on_failure=tasks.noop, label="to stop")
    waiting = batch.enqueue_many(tasks.add, [Call(n, n) for n in range(2)])
    running = batch.enqueue(tasks.add, 9, 9)
    Job.objects.filter(pk=running.id).update(status="running", owner=7, attempt=1)
    page = f"{ADMIN}/batch/{batch.id}/"
    assert ">Cancel the batch…</button>" in operator.get(page).content.decode()
    confirm = post(operator, f"{page}cancel/", page)
    assert confirm.status_code == 200
    shown = confirm.content.decode()
    assert (
        "2 waiting members will be cancelled, and 1 running member asked to stop and close "
        "the batch" in shown
    )
    assert ">Yes, cancel the batch</button>" in shown
    assert {status(job) for job in [*waiting, running]} == {"ready", "running"}
    assert not stalwart.get_batch(batch.id).closed
    done = post(operator, f"{page}cancel/", page, confirm="yes")
    assert done.status_code == 302
    assert done["Location"] == page
    assert said(done) == [
        "Cancelled 2 waiting members; asked 1 running member to stop; closed the batch."
    ]
    assert [status(job) for job in waiting] == ["cancelled", "cancelled"]
    assert Job.objects.get(pk=running.id).cancel_requested_at is not None
    assert stalwart.get_batch(batch.id).closed


def test_a_finished_batch_offers_no_cancel(operator):
    with stalwart.batch(on_finish=tasks.noop) as batch:
        batch.enqueue(tasks.add, 1, 1)
    drain()
    page = f"{ADMIN}/batch/{batch.id}/"
    assert stalwart.get_batch(batch.id).finished
    assert "Cancel the batch" not in operator.get(page).content.decode()
    response = post(operator, f"{page}cancel/", page, confirm="yes")
    assert response["Location"] == page
    assert said(response) == ["This batch has finished: its callbacks were enqueued."]
    assert post(operator, f"{page}retry/", page).status_code == 404
    missing = f"{ADMIN}/batch/01939f2e-0000-7000-8000-000000000000/cancel/"
    assert post(operator, missing, page).status_code == 404
