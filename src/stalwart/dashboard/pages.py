"""The dashboard's pages: overview, jobs by state, one job, processes, recurring tasks,
batches and one batch.

Every page needs the view permission; each reads through ``stalwart.browsing`` (lists,
counts, one job) or ``stalwart.status`` (queues and processes), so it stays fast on a big
table. Nothing a job carries (arguments, results, error texts) is ever marked safe: the
templates escape it.
"""

import json
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import django
from django.db.models import Count
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.tasks import task_backends
from django.template.response import TemplateResponse
from django.urls import reverse

from stalwart import browsing
from stalwart.aliases import is_stalwart, stalwart_aliases
from stalwart.binding import check_entry
from stalwart.control import paused_queues
from stalwart.dashboard.filters import FilterForm
from stalwart.dashboard.permissions import VIEW, allowed_actions, forbidden
from stalwart.models import Dashboard, Job, JobStatus
from stalwart.queues import QueueSelector
from stalwart.status import collect_status
from stalwart.ticks import database_now, last_runs

# What each state's list offers to do, to the selection or to everything that matches.
BULK_ACTIONS = {
    "ready": ["cancel"],
    "scheduled": ["run-now", "cancel"],
    "blocked": ["cancel"],
    "pending": ["cancel"],
    "running": ["cancel"],
    "failed": ["retry", "discard"],
    "successful": [],
    "cancelled": [],
}
# What a job's own page offers, by its state.
JOB_ACTIONS = BULK_ACTIONS
# What a batch's page offers while the batch has not finished (``Batch.cancel``).
BATCH_ACTIONS = ["cancel"]
LABELS = {
    "retry": "Retry",
    "discard": "Discard",
    "cancel": "Cancel",
    "run-now": "Run now",
}
# The states whose jobs wait on their queue: a paused queue's are marked so.
WAITING = ("ready", "scheduled", "blocked", "pending")
# The batches a page lists, newest first.
BATCHES_SHOWN = 50
# Seconds between two refreshes of a page that refreshes itself (overview, lists).
REFRESH_SECONDS = 5
# Django 6.1's admin draws breadcrumbs as a list (<ol>), 6.0's as a <div>: as theirs, ours.
BREADCRUMBS_LIST = django.VERSION >= (6, 1)


def stalwart_backend(alias: str) -> Any:
    try:
        backend = task_backends[alias]
    except Exception:  # noqa: BLE001 - InvalidTaskBackend and the like: no such page
        raise Http404(f"No Stalwart backend {alias!r}.") from None
    if not is_stalwart(backend):
        raise Http404(f"TASKS[{alias!r}] is not a Stalwart backend.")
    return backend


def frame(request: Any, site: Any, alias: str, title: str, active: str) -> dict[str, Any]:
    """What every page's template needs: the admin's context, the backend, the tabs."""
    return {
        **site.each_context(request),
        "title": title,
        "opts": Dashboard._meta,
        "backend": alias,
        "aliases": stalwart_aliases(),
        "active": active,
        "allowed": allowed_actions(request.user),
        "states": browsing.STATES,
        "labels": LABELS,
        "breadcrumbs_list": BREADCRUMBS_LIST,
        "refresh_seconds": REFRESH_SECONDS,
    }


def _guard(request: Any, context: dict[str, Any]) -> HttpResponse | None:
    if request.user.has_perm(VIEW):
        return None
    return forbidden(request, context, VIEW, "see the Stalwart dashboard")


# -- overview --------------------------------------------------------------------------------


def overview(request: Any, site: Any, backend: str) -> HttpResponse:
    config = stalwart_backend(backend).config
    context = frame(request, site, backend, "Task queue", "overview")
    if (refused := _guard(request, context)) is not None:
        return refused
    status = collect_status(config)
    hour_ago = status.database_time - timedelta(hours=1)
    last_hour: dict[tuple[str, str], int] = {
        (queue, state): count
        for queue, state, count in Job.objects.using(config.database)
        .filter(status__in=["successful", "failed"], finished_at__gte=hour_ago)
        .values("queue_name", "status")
        .annotate(n=Count("pk"))
        .values_list("queue_name", "status", "n")
    }
    names = {queue.name for queue in status.queues} | {queue for queue, _ in last_hour}
    by_name = {queue.name: queue for queue in status.queues}
    workers = [p for p in status.processes if p.kind == "worker"]
    rows = []
    for name in sorted(names):
        queue = by_name.get(name)
        serving = [p for p in workers if p.alive and _serves(p.queues, name)]
        rows.append(
            {
                "name": name,
                "status": queue,
                "succeeded_last_hour": last_hour.get((name, "successful"), 0),
                "failed_last_hour": last_hour.get((name, "failed"), 0),
                "serving": serving,
            }
        )
    context.update(
        queues=rows,
        status=status,
        problems=status.problems(max_ready_age=None),
        totals=browsing.state_counts(config.database, browsing.JobFilter()),
    )
    return TemplateResponse(request, "stalwart/dashboard/overview.html", context)


def _serves(queues: str | None, name: str) -> bool:
    return queues is not None and bool(queues) and QueueSelector.parse(queues).serves(name)


# -- jobs by state ---------------------------------------------------------------------------


def jobs(request: Any, site: Any, backend: str, state: str) -> HttpResponse:
    config = stalwart_backend(backend).config
    if state not in browsing.STATES:
        raise Http404(f"{state!r} is not a job state.")
    context = frame(request, site, backend, f"{state.capitalize()} jobs", "jobs")
    if (refused := _guard(request, context)) is not None:
        return refused
    form = FilterForm(request.GET or None)
    found = form.searched_id() if form.is_valid() else None
    if found is not None:
        job = browsing.find_job(config.database, found)
        if job is not None:
            return HttpResponseRedirect(reverse("admin:stalwart_job", args=[backend, job.id]))
        context["not_found"] = found
    where = form.job_filter(state) if form.is_valid() else browsing.JobFilter(state=state)
    try:
        page = browsing.list_jobs(
            config.database,
            where,
            after=request.GET.get("after") or None,
            before=request.GET.get("before") or None,
        )
    except browsing.InvalidCursor as error:
        return HttpResponse(str(error), status=400, content_type="text/plain")
    now = database_now(config.database)
    context.update(
        state=state,
        finished=state in browsing.FINISHED,
        form=form,
        page=page,
        counts=browsing.state_counts(config.database, where),
        filter_query=form.query_string(),
        bulk_actions=[a for a in BULK_ACTIONS[state] if a in context["allowed"]],
        now=now,
    )
    if state == "running":
        context["owners"] = browsing.owners(
            config.database, page.rows, now=now, threshold=config.process_alive_threshold
        )
    if state == "blocked":
        context["keys"] = browsing.slot_holders(config.database, page.rows)
    if state in WAITING:
        context["paused"] = set(paused_queues(database=config.database))
    if state in browsing.FINISHED:
        # Lists read no errors nor results (browsing.LIST_FIELDS): this page's, apart.
        finished = {
            pk: (errors, result)
            for pk, errors, result in Job.objects.using(config.database)
            .filter(pk__in=[job.pk for job in page.rows])
            .values_list("pk", "errors", "return_value")
        }
        context["last_errors"] = {
            pk: attempts[-1] if (attempts := browsing.attempts(Job(errors=errors))) else None
            for pk, (errors, _) in finished.items()
        }
        context["return_values"] = {
            pk: json.dumps(result, ensure_ascii=False)
            for pk, (_, result) in finished.items()
            if state == "successful"
        }
    return TemplateResponse(request, "stalwart/dashboard/jobs.html", context)


# -- one job ---------------------------------------------------------------------------------


def job(request: Any, site: Any, backend: str, job_id: Any) -> HttpResponse:
    config = stalwart_backend(backend).config
    context = frame(request, site, backend, f"Job {job_id}", "jobs")
    if (refused := _guard(request, context)) is not None:
        return refused
    row = browsing.find_job(config.database, job_id)
    if row is None:
        raise Http404("No such job (finished jobs are deleted after their retention period).")
    now = database_now(config.database)
    owner = None
    if row.owner is not None:
        owner = browsing.owners(
            config.database, [row], now=now, threshold=config.process_alive_threshold
        )[row.owner]
    context.update(
        job=row,
        task_result_status=row.get_status_display(),
        django_status=str(_task_result_status(row.status)),
        history=browsing.history(row),
        owner=owner,
        graph=dict(
            zip(("runs_after", "dependants"), browsing.graph(config.database, row.id), strict=True)
        ),
        # Pretty JSON as text: the template escapes it like any other text.
        arguments=json.dumps({"args": row.args, "kwargs": row.kwargs}, indent=2),
        return_value=json.dumps(row.return_value, indent=2),
        actions=[a for a in JOB_ACTIONS[row.status] if a in context["allowed"]],
        now=now,
        queue_paused=row.status in WAITING
        and row.queue_name in paused_queues(database=config.database),
        batch=browsing.batch_of_job(config.database, row.id),
    )
    return TemplateResponse(request, "stalwart/dashboard/job.html", context)


def _task_result_status(state: str) -> Any:
    return JobStatus(state).task_result_status


# -- processes -------------------------------------------------------------------------------


def processes(request: Any, site: Any, backend: str) -> HttpResponse:
    config = stalwart_backend(backend).config
    context = frame(request, site, backend, "Processes", "processes")
    if (refused := _guard(request, context)) is not None:
        return refused
    status = collect_status(config)
    ids = {process.id for process in status.processes}
    tree = []
    # Supervisors with their children beneath; a child whose supervisor has no row stands
    # alone.
    for process in status.processes:
        if process.supervisor is None or process.supervisor not in ids:
            children = [p for p in status.processes if p.supervisor == process.id]
            tree.append({"process": process, "children": children})
    context.update(tree=tree, status=status, threshold=config.process_alive_threshold)
    return TemplateResponse(request, "stalwart/dashboard/processes.html", context)


# -- recurring tasks -------------------------------------------------------------------------


def recurring(request: Any, site: Any, backend: str) -> HttpResponse:
    config = stalwart_backend(backend).config
    context = frame(request, site, backend, "Recurring tasks", "recurring")
    if (refused := _guard(request, context)) is not None:
        return refused
    now = database_now(config.database)
    latest = last_runs(config.database)
    entries = []
    for entry in config.recurring:
        last = latest.get(entry.key)
        entries.append(
            {
                "entry": entry,
                "last_run": last,
                "next_run": entry.next_after(max(now, last) if last else now),
                "problem": check_entry(entry, backend),
            }
        )
    context.update(entries=entries, now=now)
    return TemplateResponse(request, "stalwart/dashboard/recurring.html", context)


# -- batches ---------------------------------------------------------------------------------


def batches(request: Any, site: Any, backend: str) -> HttpResponse:
    config = stalwart_backend(backend).config
    context = frame(request, site, backend, "Batches", "batches")
    if (refused := _guard(request, context)) is not None:
        return refused
    unfinished = request.GET.get("unfinished") == "1"
    context.update(
        batches=browsing.batch_summaries(
            config.database, backend, limit=BATCHES_SHOWN, unfinished=unfinished
        ),
        unfinished=unfinished,
        now=database_now(config.database),
    )
    return TemplateResponse(request, "stalwart/dashboard/batches.html", context)


def batch(request: Any, site: Any, backend: str, batch_id: Any) -> HttpResponse:
    config = stalwart_backend(backend).config
    context = frame(request, site, backend, f"Batch {batch_id}", "batches")
    if (refused := _guard(request, context)) is not None:
        return refused
    found = browsing.find_batch(config.database, backend, batch_id)
    if found is None:
        raise Http404(f"No batch {batch_id} in backend {backend!r}.")
    state = request.GET.get("state") or None
    if state is not None and state not in browsing.STATES:
        return HttpResponse(f"{state!r} is not a job state.", status=400, content_type="text/plain")
    try:
        page = browsing.batch_members(
            config.database,
            found.id,
            state=state,
            after=request.GET.get("after") or None,
            before=request.GET.get("before") or None,
        )
    except browsing.InvalidCursor as error:
        return HttpResponse(str(error), status=400, content_type="text/plain")
    unfinished = found.state != "finished"
    context.update(
        title=f"Batch {found.label or found.id}",
        batch=found,
        state=state,
        state_query=urlencode({"state": state}) if state else "",
        page=page,
        actions=[a for a in BATCH_ACTIONS if unfinished and a in context["allowed"]],
        now=database_now(config.database),
    )
    return TemplateResponse(request, "stalwart/dashboard/batch.html", context)
