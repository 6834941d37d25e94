"""Every page of the dashboard through Django's test client, as an operator reads it."""

import copy
import re
import uuid
from datetime import timedelta

import pytest
from django.conf import settings
from django.db.models.functions import Now
from django.test import override_settings
from django.utils import timezone

import stalwart
from stalwart import Call, browsing, control, enqueue_many
from stalwart.models import BatchJob, Job, Process
from tests.dashboard.conftest import ADMIN
from tests.helpers import drain
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def text(response) -> str:
    assert response.status_code == 200, response.content[:2000]
    return response.content.decode()


def listed(response) -> list[str]:
    """The job ids of a list page, in order."""
    return re.findall(r'<tr data-job="([0-9a-f-]+)"', text(response))


def process(kind: str = "worker", *, supervisor=None, queues="*", silent_for: float = 0):
    return Process.objects.create(
        kind=kind,
        name=f"{kind}-host-{Process.objects.count()}",
        pid=4242,
        hostname="host-a",
        supervisor=supervisor,
        created_at=Now(),
        last_heartbeat_at=timezone.now() - timedelta(seconds=silent_for),
        metadata={"queues": queues, "threads": 4, "busy": 1, "rss_bytes": 50 * 2**20},
    )


def test_the_admin_index_leads_to_the_dashboard(viewer):
    index = text(viewer.get("/admin/"))
    assert "/admin/stalwart/dashboard/" in index
    response = viewer.get("/admin/stalwart/dashboard/")
    assert response.status_code == 302
    assert response["Location"] == ADMIN + "/"


def test_the_overview_shows_each_queue_with_its_counts_latency_and_workers(viewer):
    tasks.add.enqueue(1, 1)
    tasks.add.using(queue_name="mail").enqueue(2, 2)
    tasks.always_fails.using(queue_name="mail").enqueue()
    drain(queues="mail")
    tasks.add.using(queue_name="mail").enqueue(3, 3)
    control.pause("mail")
    tasks.add.using(queue_name="quiet").enqueue(4, 4)
    drain(queues="quiet")  # a queue with nothing left but a job done in the hour
    process(queues="default")
    page = text(viewer.get(ADMIN + "/"))
    quiet = page[page.index('data-queue="quiet"') :].split("</tr>")[0]
    cells = re.findall(r'<td class="number">(?:<a [^>]*>)?([^<]*)', quiet)
    assert cells[5:8] == ["\u2013", "1", "0"]  # no latency; one success in the hour
    mail = page[page.index('data-queue="mail"') :].split("</tr>")[0]
    cells = re.findall(r'<td class="number">(?:<a [^>]*>)?([^<]*)', mail)
    # ready, scheduled, running, blocked, failed, latency, succeeded and failed in the hour
    assert cells[:5] == ["1", "0", "0", "0", "1"]
    assert cells[6:8] == ["1", "1"]
    assert "paused" in mail
    assert "no live worker" in mail
    default = page[page.index('data-queue="default"') :].split("</tr>")[0]
    assert "worker-host-0" in default
    assert ">Pause</button>" not in page  # a viewer sees no buttons


def test_each_state_lists_its_jobs_in_its_order(viewer):
    low = tasks.add.using(priority=-1).enqueue(1, 1)
    high = tasks.add.using(priority=9).enqueue(2, 2)
    soon = tasks.add.using(run_after=timezone.now() + timedelta(minutes=5)).enqueue(3, 3)
    later = tasks.add.using(run_after=timezone.now() + timedelta(hours=5)).enqueue(4, 4)
    assert listed(viewer.get(ADMIN + "/jobs/ready/")) == [high.id, low.id]
    assert listed(viewer.get(ADMIN + "/jobs/scheduled/")) == [soon.id, later.id]
    page = text(viewer.get(ADMIN + "/jobs/ready/"))
    assert re.search(r"Ready <span class=\"badge\">2</span>", page)
    assert re.search(r"Scheduled <span class=\"badge\">2</span>", page)


def test_filters_narrow_every_list_and_its_counts(viewer):
    tasks.add.enqueue(1, 1)
    mail = tasks.add.using(queue_name="mail", priority=5).enqueue(2, 2)
    noop = tasks.noop.using(queue_name="mail").enqueue()
    assert listed(viewer.get(ADMIN + "/jobs/ready/?queue=mail")) == [mail.id, noop.id]
    assert listed(viewer.get(ADMIN + "/jobs/ready/?queue=mail&priority=5")) == [mail.id]
    assert listed(viewer.get(ADMIN + "/jobs/ready/?task=tests.testapp.tasks.noop")) == [noop.id]
    Job.objects.filter(pk=noop.id).update(available_at=timezone.now() - timedelta(days=2))
    since = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S")
    assert noop.id not in listed(viewer.get(ADMIN + f"/jobs/ready/?queue=mail&since={since}"))
    assert listed(viewer.get(ADMIN + f"/jobs/ready/?queue=mail&until={since}")) == [noop.id]
    page = text(viewer.get(ADMIN + "/jobs/ready/?queue=mail"))
    assert 'href="/admin/stalwart/dashboard/default/jobs/failed/?queue=mail"' in page
    bad = text(viewer.get(ADMIN + "/jobs/ready/?priority=500&queue=no%20spaces"))
    assert "Ensure this value is less than or equal to 100" in bad


def test_search_by_id_opens_the_job_or_says_it_is_not_there(viewer):
    job = tasks.add.enqueue(1, 1)
    response = viewer.get(ADMIN + f"/jobs/ready/?id={job.id}")
    assert response.status_code == 302
    assert response["Location"] == f"{ADMIN}/job/{job.id}/"
    missing = "01939f2e-0000-7000-8000-000000000000"
    assert f"No job has the id {missing}" in text(viewer.get(ADMIN + f"/jobs/ready/?id={missing}"))


def test_pages_of_a_long_list_go_forward_and_back_by_cursor(viewer):
    jobs = enqueue_many(tasks.add, [Call(n, n) for n in range(120)])
    ids = [job.id for job in jobs]
    first = viewer.get(ADMIN + "/jobs/ready/?queue=default")
    assert listed(first) == ids[:50]
    after = re.search(r'href="\?queue=default&amp;after=([^"]+)" rel="next"', text(first))[1]
    second = viewer.get(ADMIN + f"/jobs/ready/?queue=default&after={after}")
    assert listed(second) == ids[50:100]
    third_cursor = re.search(r'after=([^"]+)" rel="next"', text(second))[1]
    third = viewer.get(ADMIN + f"/jobs/ready/?after={third_cursor}")
    assert listed(third) == ids[100:]
    assert 'rel="next"' not in text(third)
    before = re.search(r'before=([^"]+)" rel="prev"', text(third))[1]
    assert listed(viewer.get(ADMIN + f"/jobs/ready/?before={before}")) == ids[50:100]
    assert viewer.get(ADMIN + "/jobs/ready/?after=not-a-cursor").status_code == 400
    assert viewer.get(ADMIN + "/jobs/lost/").status_code == 404
    assert viewer.get("/admin/stalwart/dashboard/nope/").status_code == 404


def test_running_jobs_show_their_process_its_heartbeat_and_whether_it_is_dead(viewer):
    alive, dead = process(), process(silent_for=600)
    one, two, orphan = (tasks.add.enqueue(n, n) for n in range(3))
    for job, owner in ((one, alive.id), (two, dead.id), (orphan, 999_999)):
        Job.objects.filter(pk=job.id).update(
            status="running", owner=owner, attempt=1, last_attempted_at=timezone.now()
        )
    page = text(viewer.get(ADMIN + "/jobs/running/"))
    rows = {
        job_id: page[page.index(f'data-job="{job_id}"') :].split("</tr>")[0]
        for job_id in (one.id, two.id, orphan.id)
    }
    assert "pid 4242 on host-a" in rows[one.id]
    assert "dead" not in rows[one.id]
    assert '<span class="badge bad">dead</span>' in rows[two.id]
    assert '<span class="badge bad">dead</span> (no row)' in rows[orphan.id]


def test_blocked_jobs_show_their_key_and_who_holds_its_slots(viewer):
    from django.tasks import default_task_backend

    holder = tasks.one_at_a_time.enqueue("acct-1")
    waiting = tasks.one_at_a_time.enqueue("acct-1")
    default_task_backend.store.unblock(["acct-1"])
    page = text(viewer.get(ADMIN + "/jobs/blocked/"))
    row = page[page.index(f'data-job="{waiting.id}"') :].split("</tr>")[0]
    assert "acct-1" in row
    assert "(limit 1)" in row
    assert f"/job/{holder.id}/" in row


def test_failed_jobs_show_their_last_error(viewer):
    job = tasks.fail.enqueue("the disk is full")
    drain()
    page = text(viewer.get(ADMIN + "/jobs/failed/"))
    row = page[page.index(f'data-job="{job.id}"') :].split("</tr>")[0]
    assert "ValueError: the disk is full" in row


def test_a_job_shows_every_attempt_and_hides_its_arguments_behind_a_click(viewer):
    job = tasks.always_fails.enqueue()
    drain()
    page = text(viewer.get(ADMIN + f"/job/{job.id}/"))
    assert page.count('<section class="attempt attempt-failed"') == 3
    assert page.count("ConnectionError: never works") >= 3
    assert "Traceback (most recent call last)" in page
    assert re.search(r'<details id="arguments">\s*<summary>Show the arguments', page)
    for label in ("Enqueued", "Run after", "Available", "Started", "Last attempt", "Finished"):
        assert f"<dt>{label}</dt>" in page
    assert "worker-" in page  # worker ids
    done = tasks.add.enqueue(20, 22)
    drain()
    success = text(viewer.get(ADMIN + f"/job/{done.id}/"))
    assert re.search(r'<details id="return-value">.*<pre>42</pre>', success, re.S)
    assert page.count('<section class="attempt attempt-failed"') == 3
    assert re.search(r"Attempt 1: successful</h3>\s*<p class=\"quiet\">ended ", success)
    missing = "01939f2e-0000-7000-8000-000000000000"
    assert viewer.get(ADMIN + f"/job/{missing}/").status_code == 404


def test_a_job_says_which_attempts_were_interrupted_and_why(viewer):
    job = tasks.add.enqueue(1, 1)
    Job.objects.filter(pk=job.id).update(
        attempt=1,
        interruptions=[
            {"attempt": 1, "cause": "its database connection was lost", "at": "", "process": "w9"}
        ],
    )
    drain()
    page = text(viewer.get(ADMIN + f"/job/{job.id}/"))
    interrupted = page[page.index('id="attempt-1"') :].split("</section>")[0]
    assert "Attempt 1: interrupted" in interrupted
    assert "its database connection was lost" in interrupted
    assert "not charged: 1 of 10 interruptions used" in interrupted
    assert "Attempt 2: successful" in page


def test_processes_show_supervisors_with_their_children_and_mark_the_dead(viewer):
    supervisor = process("supervisor", queues=None)
    process(supervisor=supervisor.id)
    process("dispatcher", supervisor=supervisor.id, queues=None, silent_for=600)
    page = text(viewer.get(ADMIN + "/processes/"))
    order = re.findall(r'<tr class="(child)?" data-process="(\d+)"', page)
    assert [child for child, _ in order] == ["", "child", "child"]
    assert page.count('<span class="badge bad">dead</span>') == 1
    assert "1 / 4" in page  # busy threads
    assert "50 MB" in page


def test_recurring_tasks_show_their_schedule_and_runs():
    tasks_setting = copy.deepcopy(settings.TASKS)
    tasks_setting["default"]["OPTIONS"]["recurring"] = {
        "nightly": {"task": "tests.testapp.tasks.noop", "schedule": "@daily"},
        "broken": {"task": "tests.testapp.tasks.nowhere", "schedule": "@hourly"},
    }
    from django.contrib.auth.models import Permission, User
    from django.test import Client

    with override_settings(TASKS=tasks_setting):
        user = User.objects.create_user("r", password="pw", is_staff=True)  # noqa: S106 - a test user
        user.user_permissions.add(Permission.objects.get(codename="view_dashboard"))
        client = Client()
        client.force_login(user)
        page = text(client.get(ADMIN + "/recurring/"))
    nightly = page[page.index('data-key="nightly"') :].split("</tr>")[0]
    assert "@daily" in nightly
    assert "never" in nightly  # no run yet
    assert re.search(r"in \d+(\.\d)? (h|min)", nightly)  # the next run
    broken = page[page.index('data-key="broken"') :].split("</tr>")[0]
    assert "cannot be enqueued" in broken


def test_ids_in_lists_tell_apart_the_jobs_of_one_bulk_enqueue(viewer):
    """UUIDv7 ids made together share their first digits (the time): the lists show the
    last twelve too, and the whole id in the link's title."""
    results = enqueue_many(tasks.add, [Call(n, n) for n in range(3)])
    page = text(viewer.get(f"{ADMIN}/jobs/ready/"))
    shown = re.findall(r'title="([0-9a-f-]{36})">([^<]+)</a>', page)
    assert {whole for whole, _ in shown} == {result.id for result in results}
    assert len({cut for _, cut in shown}) == 3
    for whole, cut in shown:
        assert cut == f"{whole[:8]}…{whole[-12:]}"


def test_finished_lists_show_how_long_each_ran_and_successful_ones_what_they_returned(viewer):
    done = tasks.echo.enqueue("<b>bold</b>", n=1)
    tasks.fail.enqueue("nope")
    drain()
    successful = text(viewer.get(f"{ADMIN}/jobs/successful/"))
    assert '<th class="number" title="How long its last attempt ran">Took</th>' in successful
    assert "<th>Return value</th>" in successful
    # Escaped, as everything a job carries.
    assert "{&quot;args&quot;: [&quot;&lt;b&gt;bold&lt;/b&gt;&quot;]" in successful
    job = Job.objects.get(pk=done.id)
    took = (job.finished_at - job.last_attempted_at).total_seconds()
    assert f'<td class="number">{took:.1f} s</td>' in successful
    failed = text(viewer.get(f"{ADMIN}/jobs/failed/"))
    assert "Took</th>" in failed
    assert "Return value" not in failed


def test_a_paused_queues_waiting_jobs_say_it(viewer):
    waiting = tasks.add.using(queue_name="mail").enqueue(1, 1)
    tasks.add.enqueue(2, 2)
    control.pause("mail")
    page = text(viewer.get(f"{ADMIN}/jobs/ready/"))
    assert page.count(">paused</span>") == 1
    row = page[page.index(f'<tr data-job="{waiting.id}"') :].split("</tr>")[0]
    assert ">paused</span>" in row
    assert 'id="queue-paused"' in text(viewer.get(f"{ADMIN}/job/{waiting.id}/"))
    control.resume("mail")
    assert ">paused</span>" not in text(viewer.get(f"{ADMIN}/jobs/ready/"))


def test_breadcrumbs_are_drawn_as_the_admins_own(viewer):
    """Django 6.1's admin styles an <ol class="breadcrumbs">, 6.0's a <div>: the dashboard
    draws the one of the Django it runs on, as a native page of the same admin does."""
    native = text(viewer.get("/admin/password_change/"))
    page = text(viewer.get(f"{ADMIN}/"))
    for markup in ('<ol class="breadcrumbs">', '<div class="breadcrumbs">'):
        assert (markup in page) == (markup in native)


def test_the_overview_and_lists_offer_a_refresh_that_keeps_their_place(viewer):
    for path in ("/", "/jobs/ready/?queue=mail"):
        page = text(viewer.get(ADMIN + path))
        assert 'id="stalwart-refresh"' in page
        assert "stalwart/dashboard/refresh.js" in page
        assert "data-refresh=" in page
    assert 'id="stalwart-refresh"' not in text(viewer.get(f"{ADMIN}/processes/"))


def test_pending_jobs_have_their_tab_and_a_job_shows_what_it_runs_after(viewer):
    parent = tasks.add.enqueue(1, 2)
    child = stalwart.enqueue_after([parent], tasks.plus_parents)
    assert listed(viewer.get(ADMIN + "/jobs/pending/")) == [child.id]
    page = text(viewer.get(ADMIN + "/jobs/pending/"))
    assert re.search(r"Pending <span class=\"badge\">1</span>", page)
    shown = text(viewer.get(ADMIN + f"/job/{child.id}/"))
    assert re.search(rf'id="runs-after"><a href="[^"]*/job/{parent.id}/">{parent.id}</a>', shown)
    assert "(ready)" in shown
    parent_page = text(viewer.get(ADMIN + f"/job/{parent.id}/"))
    assert re.search(rf'id="dependants"><a href="[^"]*/job/{child.id}/">', parent_page)
    assert "(pending)" in parent_page


def test_batches_show_their_state_and_members_by_state_newest_first(viewer):
    with stalwart.batch(on_finish=tasks.noop, label="finished one") as done:
        done.enqueue(tasks.add, 1, 1)
        failing = done.enqueue(tasks.fail, "no")
    Job.objects.filter(pk=failing.id).update(max_attempts=1)
    drain()
    still_open = stalwart.batch(label="still open")
    still_open.enqueue(tasks.noop)
    page = text(viewer.get(ADMIN + "/batches/"))
    rows = re.findall(r'<tr data-batch="([0-9a-f-]+)"', page)
    assert rows == [still_open.id, done.id]
    finished = page[page.index(f'data-batch="{done.id}"') :].split("</tr>")[0]
    assert "finished one" in finished
    assert '<span class="badge bad">finished</span>' in finished
    cells = re.findall(r'<td class="number">([^<]*)', finished)
    assert cells == ["2", "0", "0", "1", "1", "0"]  # jobs, waiting, running, ok, failed, ...
    assert "on_finish" in finished
    unfinished = text(viewer.get(ADMIN + "/batches/?unfinished=1"))
    assert re.findall(r'<tr data-batch="([0-9a-f-]+)"', unfinished) == [still_open.id]
    assert ">Batches</a>" in page


def members(response) -> list[str]:
    """The job ids of a batch page's members, in order."""
    page = text(response)
    return re.findall(r'<tr data-job="([0-9a-f-]+)"', page[page.index('id="members"') :])


def test_a_batch_shows_its_progress_and_each_callbacks_state(viewer):
    with stalwart.batch(
        on_success=tasks.noop,
        on_failure=(tasks.echo, Call("failed")),
        on_finish=tasks.noop,
        label="nightly import",
    ) as done:
        done.enqueue(tasks.add, 1, 1)
        failing = done.enqueue(tasks.fail, "no")
    Job.objects.filter(pk=failing.id).update(max_attempts=1)
    drain()
    page = text(viewer.get(ADMIN + f"/batch/{done.id}/"))
    assert '<span class="badge bad" id="batch-state">finished</span>' in page
    assert "nightly import" in page
    counts = page[page.index('id="progress-counts"') :].split("</table>")[0]
    # jobs, waiting, running, succeeded, failed, cancelled, deleted
    assert re.findall(r'<td class="number">([^<]*)', counts) == ["2", "0", "0", "1", "1", "0", "0"]
    assert "2 of 2 members finished" in page
    links = dict(
        BatchJob.objects.filter(batch=done.id).exclude(role="member").values_list("role", "job")
    )
    assert sorted(links) == ["on_failure", "on_finish"]
    for role, job_id in links.items():
        row = page[page.index(f'data-callback="{role}"') :].split("</tr>")[0]
        assert f'href="{ADMIN}/job/{job_id}/"' in row
        assert f">{Job.objects.get(pk=job_id).status}</span>" in row
    on_failure = page[page.index('data-callback="on_failure"') :].split("</tr>")[0]
    assert "tests.testapp.tasks.echo" in on_failure
    on_success = page[page.index('data-callback="on_success"') :].split("</tr>")[0]
    assert "not enqueued: the batch's outcome did not call for it" in on_success
    assert "/job/" not in on_success

    waiting = stalwart.batch(on_finish=tasks.noop)
    waiting.enqueue(tasks.add, 2, 2)
    page = text(viewer.get(ADMIN + f"/batch/{waiting.id}/"))
    assert 'id="batch-state">open</span>' in page
    assert "0 of 1 member finished" in page
    assert "to come, once the batch is closed and every member has finished" in page
    waiting.close()
    page = text(viewer.get(ADMIN + f"/batch/{waiting.id}/"))
    assert 'id="batch-state">closed</span>' in page
    assert "to come, once every member has finished" in page
    empty = stalwart.batch()
    assert "made without callbacks" in text(viewer.get(ADMIN + f"/batch/{empty.id}/"))


def test_a_batchs_members_are_filtered_by_state_and_paged_by_cursor(viewer):
    with stalwart.batch(label="big") as big:
        ids = [
            result.id for result in big.enqueue_many(tasks.add, [Call(n, n) for n in range(120)])
        ]
    Job.objects.filter(pk__in=ids[:70]).update(status="successful", finished_at=timezone.now())
    Job.objects.filter(pk__in=ids[:2]).delete()  # as retention does, once finished
    page = f"{ADMIN}/batch/{big.id}/"
    first = viewer.get(page)
    assert members(first) == ids[:50]
    shown = text(first)
    assert re.search(r"All <span class=\"badge\">120</span>", shown)
    assert re.search(r"Successful <span class=\"badge\">68</span>", shown)
    assert re.search(r"Ready <span class=\"badge\">50</span>", shown)
    counts = shown[shown.index('id="progress-counts"') :].split("</table>")[0]
    # jobs, waiting, running, succeeded, failed, cancelled, deleted
    cells = re.findall(r'<td class="number">([^<]*)', counts)
    assert cells == ["120", "50", "0", "68", "0", "0", "2"]
    deleted = shown[shown.index(f'<tr data-job="{ids[0]}"') :].split("</tr>")[0]
    assert "deleted" in deleted
    assert "/job/" not in deleted
    assert f'href="{ADMIN}/job/{ids[2]}/"' in shown
    after = re.search(r'href="\?after=([^"]+)" rel="next"', shown)[1]
    second = viewer.get(f"{page}?after={after}")
    assert members(second) == ids[50:100]
    after = re.search(r'after=([^"]+)" rel="next"', text(second))[1]
    third = viewer.get(f"{page}?after={after}")
    assert members(third) == ids[100:]
    assert 'rel="next"' not in text(third)
    before = re.search(r'before=([^"]+)" rel="prev"', text(third))[1]
    assert members(viewer.get(f"{page}?before={before}")) == ids[50:100]

    successful = viewer.get(f"{page}?state=successful")
    assert members(successful) == ids[2:52]
    next_link = r'href="\?state=successful&amp;after=([^"]+)" rel="next"'
    after = re.search(next_link, text(successful))[1]
    rest = viewer.get(f"{page}?state=successful&after={after}")
    assert members(rest) == ids[52:70]
    assert 'rel="next"' not in text(rest)
    assert members(viewer.get(f"{page}?state=ready")) == ids[70:120]
    assert viewer.get(f"{page}?state=deleted").status_code == 400  # a count, not a list
    assert members(viewer.get(f"{page}?state=failed")) == []
    assert viewer.get(f"{page}?state=lost").status_code == 400
    assert viewer.get(f"{page}?after=not-a-cursor").status_code == 400
    another_lists = browsing._encode([uuid.UUID(ids[0])])  # a pending jobs' list's cursor
    assert viewer.get(f"{page}?after={another_lists}").status_code == 400


def test_the_list_and_a_members_page_link_to_its_batch(viewer):
    with stalwart.batch(on_finish=tasks.noop, label="linked") as linked:
        member = linked.enqueue(tasks.add, 1, 1)
    alone = tasks.add.enqueue(2, 2)
    batch_page = f"{ADMIN}/batch/{linked.id}/"
    listing = text(viewer.get(ADMIN + "/batches/"))
    row = listing[listing.index(f'data-batch="{linked.id}"') :].split("</tr>")[0]
    assert f'<a href="{batch_page}">linked</a>' in row
    shown = text(viewer.get(f"{ADMIN}/job/{member.id}/"))
    assert re.search(
        rf'id="batch"><a href="{batch_page}">linked</a> <span class="quiet">\(a member\)', shown
    )
    assert 'id="batch"' not in text(viewer.get(f"{ADMIN}/job/{alone.id}/"))
    drain()
    callback = BatchJob.objects.get(batch=linked.id, role="on_finish").job
    shown = text(viewer.get(f"{ADMIN}/job/{callback}/"))
    assert f'id="batch"><a href="{batch_page}">' in shown
    assert "its <code>on_finish</code> callback" in shown
    assert f'href="{ADMIN}/job/{member.id}/"' in text(viewer.get(batch_page))


def test_an_unknown_batch_is_a_404(viewer):
    known = stalwart.batch()
    assert viewer.get(f"{ADMIN}/batch/01939f2e-0000-7000-8000-000000000000/").status_code == 404
    assert viewer.get(f"{ADMIN}/batch/not-a-batch/").status_code == 404
    other = "/admin/stalwart/dashboard/limited"
    assert viewer.get(f"{other}/batch/{known.id}/").status_code == 404  # another backend's
    assert viewer.get(f"{ADMIN}/batch/{known.id}/").status_code == 200
