"""The dashboard in a real browser, as an operator uses it: log in, open every page,
filter, retry a failed job and watch a worker run it, pause a queue and watch the worker
leave it alone, cancel a scheduled job. Every page is photographed."""

import copy
from datetime import timedelta

import pytest
from django.conf import settings
from django.test import override_settings
from django.utils import timezone
from selenium.webdriver.common.by import By

import stalwart
from stalwart import Call, control, enqueue_many
from stalwart.models import Job
from tests.helpers import drain, wait_for, worker_thread
from tests.testapp import tasks

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

DASHBOARD = "/admin/stalwart/dashboard/default"


def status(job) -> str:
    return Job.objects.get(pk=job.id).status


def test_every_page_opens_and_filters_narrow_the_list(visit):
    recurring = copy.deepcopy(settings.TASKS)
    recurring["default"]["OPTIONS"]["recurring"] = {
        "nightly-report": {"task": "tests.testapp.tasks.noop", "schedule": "30 2 * * *"},
    }
    with override_settings(TASKS=recurring):
        for number in range(3):
            tasks.add.enqueue(number, number)
        tasks.add.using(queue_name="mail", priority=5).enqueue(7, 7)
        tasks.add.using(run_after=timezone.now() + timedelta(hours=2)).enqueue(8, 8)
        failed = tasks.fail.using(queue_name="mail").enqueue("<script>alert(1)</script>")
        drain(queues="mail")
        holder = tasks.one_at_a_time.enqueue("account-17")
        tasks.one_at_a_time.enqueue("account-17")
        Job.objects.filter(pk=holder.id).update(
            status="running", owner=999, attempt=1, last_attempted_at=timezone.now()
        )
        browser = visit()
        browser.open("/admin/", "admin-index")
        browser.click('a[href="/admin/stalwart/dashboard/"]', "overview")
        assert "Queues" in browser.text()
        queues = [row.get_attribute("data-queue") for row in browser.all("#queues tr[data-queue]")]
        assert sorted(queues) == ["default", "mail"]
        for state in ("ready", "scheduled", "running", "blocked", "failed", "successful"):
            browser.open(f"{DASHBOARD}/jobs/{state}/", f"jobs-{state}")
        browser.open(f"{DASHBOARD}/jobs/successful/")
        browser.find("#id_queue").send_keys("mail")
        browser.click("#filters button[type=submit]", "jobs-filtered")
        rows = browser.all("#jobs tr[data-job]")
        assert len(rows) == 1
        assert "mail" in rows[0].text
        browser.open(f"{DASHBOARD}/job/{failed.id}/")
        browser.click("#arguments summary", "job-failed", navigates=False)
        assert "<script>alert(1)</script>" in browser.find("#arguments pre").text  # as text
        browser.open(f"{DASHBOARD}/processes/", "processes")
        browser.open(f"{DASHBOARD}/recurring/", "recurring")
        assert "nightly-report" in browser.text()


def test_retry_a_failed_job_and_see_it_succeed_once_a_worker_runs_it(visit):
    job = tasks.flaky.enqueue(failures=1)
    Job.objects.filter(pk=job.id).update(max_attempts=1)  # fails for good on its first try
    drain()
    assert status(job) == "failed"
    browser = visit()
    browser.open(f"{DASHBOARD}/jobs/failed/", "failed-before-retry")
    browser.click(f'tr[data-job="{job.id}"] input[type=checkbox]', navigates=False)
    browser.button("Retry selected", "confirm-retry")
    assert "1 failed job will be retried" in browser.text()
    browser.button("Yes, retry")
    assert "Retried 1 failed job." in browser.text()
    with worker_thread():
        wait_for(lambda: status(job) == "successful", message="the retried job to succeed")
    browser.open(f"{DASHBOARD}/job/{job.id}/", "job-retried-successful")
    assert browser.find("#state").text == "successful"


def test_pause_a_queue_and_the_worker_stops_claiming_from_it(visit):
    tasks.add.using(queue_name="mail").enqueue(1, 1)
    browser = visit()
    with worker_thread(queues="mail") as worker:
        wait_for(lambda: not Job.objects.exclude(status="successful").exists(), message="drain")
        browser.open(f"{DASHBOARD}/")
        browser.click('tr[data-queue="mail"] button', "overview-paused")
        assert "Paused 'mail'" in browser.text()
        wait_for(lambda: "mail" in worker.metadata()["paused"], message="the worker to see it")
        waiting = tasks.add.using(queue_name="mail").enqueue(2, 2)
        done = worker.jobs_done
        for _ in range(3):  # three more rounds of the worker's loop, each with a claim
            seen = worker._next_pause_check
            wait_for(lambda seen=seen: worker._next_pause_check != seen, message="a poll")
        assert status(waiting) == "ready"
        assert worker.jobs_done == done
        browser.open(f"{DASHBOARD}/")
        browser.click('tr[data-queue="mail"] button')
        assert "Resumed 'mail'" in browser.text()
        wait_for(lambda: status(waiting) == "successful", message="the worker to claim again")


def test_cancel_a_scheduled_job(visit):
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=1)).enqueue(1, 1)
    browser = visit()
    browser.open(f"{DASHBOARD}/job/{later.id}/", "job-scheduled")
    browser.button("Cancel", "job-cancelled")
    assert "Cancelled 1 waiting job" in browser.text()
    assert browser.find("#state").text == "cancelled"
    assert status(later) == "cancelled"


def test_what_a_newcomer_looks_for_is_on_the_page(visit):
    """Ids that tell a bulk enqueue's jobs apart, a paused queue's jobs marked, durations and
    return values in the lists, and breadcrumbs styled as the admin's own."""
    bulk = enqueue_many(tasks.add, [Call(n, n) for n in range(3)])
    tasks.add.using(queue_name="mail").enqueue(5, 5)
    control.pause("mail")
    browser = visit()
    browser.open(f"{DASHBOARD}/jobs/ready/", "jobs-ready-ids")
    shown = {
        row.get_attribute("data-job"): row.find_element(By.CSS_SELECTOR, "td.mono a").text
        for row in browser.all("#jobs tr[data-job]")
    }
    assert len({shown[result.id] for result in bulk}) == 3  # each visibly its own
    paused = browser.all("#jobs tr[data-job] .badge.warn")
    assert [badge.text for badge in paused] == ["paused"]
    dashboard_crumbs = browser.find(".breadcrumbs").value_of_css_property("background-color")
    browser.open("/admin/password_change/")
    native_crumbs = browser.find(".breadcrumbs").value_of_css_property("background-color")
    assert dashboard_crumbs == native_crumbs != "rgba(0, 0, 0, 0)"
    control.resume("mail")
    drain()
    browser.open(f"{DASHBOARD}/jobs/successful/", "jobs-successful-durations")
    headers = [cell.text.upper() for cell in browser.all("#jobs thead th")]  # as the admin
    assert "TOOK" in headers
    assert "RETURN VALUE" in headers
    assert "10" in browser.text()  # 5 + 5, returned


def test_a_page_refreshes_itself_in_place_once_asked(visit):
    """The switch is off until turned on, then remembered; a refresh keeps the address (the
    filters), the scroll position and the page itself (no navigation)."""
    for number in range(40):  # a list long enough to scroll
        tasks.add.using(queue_name="mail").enqueue(number, number)
    tasks.add.enqueue(0, 0)
    browser = visit()
    browser.open(f"{DASHBOARD}/jobs/ready/?queue=mail", "jobs-refresh-off")
    switch = browser.find("#stalwart-refresh")
    assert not switch.is_selected()
    switch.click()
    address = browser.driver.current_url
    page = browser.find("html")
    browser.driver.execute_script("window.scrollTo(0, 400)")
    late = tasks.add.using(queue_name="mail", priority=50).enqueue(99, 99)  # listed first
    other = tasks.add.enqueue(98, 98)  # another queue: filtered out
    wait_for(
        lambda: browser.all(f'#jobs tr[data-job="{late.id}"]'),
        timeout=30,
        message="the new job to appear without a reload",
    )
    assert not browser.all(f'#jobs tr[data-job="{other.id}"]')
    assert browser.driver.current_url == address
    assert browser.find("html") == page  # the same document: not loaded again
    assert browser.driver.execute_script("return window.scrollY") == 400
    browser.check("jobs-refreshed")
    browser.open(f"{DASHBOARD}/")
    assert browser.find("#stalwart-refresh").is_selected()  # remembered


def test_a_batch_opens_from_the_list_and_its_members_open_their_jobs(visit):
    with stalwart.batch(on_finish=tasks.noop, label="nightly import") as batch:
        batch.enqueue_many(tasks.add, [Call(n, n) for n in range(3)])
        failing = batch.enqueue(tasks.fail, "no")
    Job.objects.filter(pk=failing.id).update(max_attempts=1)
    drain()
    browser = visit()
    browser.open(f"{DASHBOARD}/batches/", "batches")
    browser.click(f'tr[data-batch="{batch.id}"] a', "batch")
    assert browser.find("#batch-state").text == "finished"
    assert "4 of 4 members finished" in browser.find("#progress").text
    assert browser.find('#callbacks tr[data-callback="on_finish"] .badge').text == "successful"
    browser.click('nav[aria-label="Members by state"] a[href="?state=failed"]', "batch-failed")
    assert [row.get_attribute("data-job") for row in browser.all("#members tr[data-job]")] == [
        failing.id
    ]
    browser.click(f'#members tr[data-job="{failing.id}"] a', "batch-member")
    assert browser.find("#state").text == "failed"
    assert browser.find("#batch a").text == "nightly import"
