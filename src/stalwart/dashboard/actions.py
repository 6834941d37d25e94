"""The dashboard's actions: each a POST (the admin's CSRF check applies), each behind its
own permission, each done through ``stalwart.control`` in bounded batches, and each
answered with a message and a redirect. An action on everything that matches a filter is
confirmed first, on a page that says how many jobs it will change.
"""

import uuid
from typing import Any

from django.contrib import messages
from django.http import (
    Http404,
    HttpResponse,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
)
from django.template.response import TemplateResponse
from django.urls import reverse

from stalwart import browsing, control
from stalwart.batches import Batch
from stalwart.binding import bound_task
from stalwart.dashboard.filters import FilterForm
from stalwart.dashboard.pages import (
    BATCH_ACTIONS,
    BULK_ACTIONS,
    JOB_ACTIONS,
    frame,
    stalwart_backend,
)
from stalwart.dashboard.permissions import ACTIONS, VIEW, forbidden


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def perform(action: str, selection: control.Selection, alias: str, *, dry_run: bool) -> str:
    """Do (or count, with ``dry_run``) ``action`` on ``selection``; say what was done."""
    if action == "cancel":
        done = control.cancel_jobs(selection, backend=alias, dry_run=dry_run)
        if dry_run:
            return (
                f"{_plural(done.cancelled, 'waiting job')} will be cancelled, and "
                f"{_plural(done.requested, 'running job')} asked to stop"
            )
        return (
            f"Cancelled {_plural(done.cancelled, 'waiting job')}; asked "
            f"{_plural(done.requested, 'running job')} to stop."
        )
    operation, noun, verb, future = {
        "retry": (control.retry_failed, "failed job", "Retried", "will be retried"),
        "discard": (control.discard_failed, "failed job", "Discarded", "will be discarded"),
        "run-now": (
            control.run_now,
            "scheduled job",
            "Made claimable now:",
            "will be made claimable now",
        ),
    }[action]
    count = operation(selection, backend=alias, dry_run=dry_run)
    if dry_run:
        return f"{_plural(count, noun)} {future}"
    return f"{verb} {_plural(count, noun)}."


def _check(request: Any, context: dict, action: str) -> HttpResponse | None:
    """None if the user may do ``action``; else the 403 page that says why not."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not request.user.has_perm(VIEW):
        return forbidden(request, context, VIEW, "see the Stalwart dashboard")
    permission = ACTIONS.get(action)
    if permission is None:
        raise Http404(f"No action {action!r}.")
    if not request.user.has_perm(permission):
        return forbidden(request, context, permission, f"{action.replace('-', ' ')} jobs")
    return None


def job_action(request: Any, site: Any, backend: str, job_id: uuid.UUID, action: str) -> Any:
    config = stalwart_backend(backend).config
    context = frame(request, site, backend, "Not allowed", "jobs")
    if (refused := _check(request, context, action)) is not None:
        return refused
    job = browsing.find_job(config.database, job_id)
    if job is None:
        raise Http404("No such job.")
    if action not in JOB_ACTIONS[job.status]:
        messages.warning(request, f"A {job.status} job cannot be given '{action}'.")
    else:
        text = perform(action, control.Selection(ids=[job.id]), backend, dry_run=False)
        messages.success(request, text)
    if browsing.find_job(config.database, job_id) is None:  # discarded
        return HttpResponseRedirect(reverse("admin:stalwart_jobs", args=[backend, job.status]))
    return HttpResponseRedirect(reverse("admin:stalwart_job", args=[backend, job.id]))


def _bulk_selection(request: Any, backend: str, state: str) -> Any:
    """The jobs a bulk action names (and where to go back to), or a response that refuses."""
    form = FilterForm(request.POST)
    if not form.is_valid():
        return HttpResponseBadRequest("Invalid filters.")
    everything = request.POST.get("scope") == "all"
    try:
        ids = [] if everything else [uuid.UUID(i) for i in request.POST.getlist("ids")]
    except ValueError:
        return HttpResponseBadRequest("Invalid job id.")
    back = reverse("admin:stalwart_jobs", args=[backend, state])
    if form.query_string():
        back += "?" + form.query_string()
    if not everything and not ids:
        messages.warning(request, "Select some jobs first.")
        return HttpResponseRedirect(back)
    return form, everything, ids, back


def bulk(request: Any, site: Any, backend: str, state: str) -> Any:
    stalwart_backend(backend)
    if state not in browsing.STATES:
        raise Http404(f"{state!r} is not a job state.")
    action = request.POST.get("action", "")
    context = frame(request, site, backend, "Confirm", "jobs")
    if (refused := _check(request, context, action)) is not None:
        return refused
    if action not in BULK_ACTIONS[state]:
        return HttpResponseBadRequest(f"'{action}' does not apply to {state} jobs.")
    chosen = _bulk_selection(request, backend, state)
    if isinstance(chosen, HttpResponse):
        return chosen
    form, everything, ids, back = chosen
    selection = form.selection(state, ids)
    if request.POST.get("confirm") != "yes":
        context.update(
            state=state,
            action=action,
            everything=everything,
            ids=[str(i) for i in ids],
            form=form,
            back=back,
            preview=perform(action, selection, backend, dry_run=True),
        )
        return TemplateResponse(request, "stalwart/dashboard/confirm.html", context)
    messages.success(request, perform(action, selection, backend, dry_run=False))
    return HttpResponseRedirect(back)


def queue_action(request: Any, site: Any, backend: str, queue: str, action: str) -> Any:
    stalwart_backend(backend)
    context = frame(request, site, backend, "Not allowed", "overview")
    if action not in ("pause", "resume"):
        raise Http404(f"No action {action!r}.")
    if (refused := _check(request, context, action)) is not None:
        return refused
    try:
        changed = (control.pause if action == "pause" else control.resume)(queue, backend=backend)
    except ValueError as error:
        return HttpResponseBadRequest(str(error))
    if action == "pause":
        text = f"Paused {queue!r}; running jobs finish." if changed else f"{queue!r} was paused."
    else:
        text = f"Resumed {queue!r}." if changed else f"{queue!r} was not paused."
    messages.success(request, text)
    return HttpResponseRedirect(reverse("admin:stalwart_overview", args=[backend]))


def batch_action(request: Any, site: Any, backend: str, batch_id: uuid.UUID, action: str) -> Any:
    """Cancel a batch that has not finished (``Batch.cancel``): its waiting members
    cancelled, its running ones asked to stop, the batch closed; confirmed first."""
    config = stalwart_backend(backend).config
    context = frame(request, site, backend, "Confirm", "batches")
    if action not in BATCH_ACTIONS:
        raise Http404(f"No action {action!r} for a batch.")
    if (refused := _check(request, context, action)) is not None:
        return refused
    found = browsing.find_batch(config.database, backend, batch_id)
    if found is None:
        raise Http404(f"No batch {batch_id} in backend {backend!r}.")
    back = reverse("admin:stalwart_batch", args=[backend, found.id])
    if found.state == "finished":
        messages.warning(request, "This batch has finished: its callbacks were enqueued.")
        return HttpResponseRedirect(back)
    closes = " and close the batch" if found.state == "open" else ""
    if request.POST.get("confirm") != "yes":
        waiting, running = browsing.cancellable_members(config.database, found.id)
        context.update(
            batch=found,
            action=action,
            back=back,
            preview=(
                f"{_plural(waiting, 'waiting member')} will be cancelled, and "
                f"{_plural(running, 'running member')} asked to stop{closes}"
            ),
        )
        return TemplateResponse(request, "stalwart/dashboard/confirm.html", context)
    done = Batch(found.id, backend=backend).cancel()
    messages.success(
        request,
        f"Cancelled {_plural(done.cancelled, 'waiting member')}; asked "
        f"{_plural(done.requested, 'running member')} to stop"
        f"{'; closed the batch' if closes else ''}.",
    )
    return HttpResponseRedirect(back)


def enqueue_recurring(request: Any, site: Any, backend: str, key: str) -> Any:
    config = stalwart_backend(backend).config
    context = frame(request, site, backend, "Not allowed", "recurring")
    if (refused := _check(request, context, "enqueue")) is not None:
        return refused
    entry = next((entry for entry in config.recurring if entry.key == key), None)
    if entry is None:
        raise Http404(f"No recurring task {key!r}.")
    # A job like the schedule's, outside it: the schedule's own ticks are unchanged.
    result = bound_task(entry, backend).enqueue(*entry.args, **entry.kwargs)
    messages.success(request, f"Enqueued {entry.key!r} now as job {result.id}.")
    return HttpResponseRedirect(reverse("admin:stalwart_recurring", args=[backend]))
