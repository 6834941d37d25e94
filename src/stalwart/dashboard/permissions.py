"""Who may see the dashboard, and who may do what: one permission per action."""

from typing import Any

from django.http import HttpResponse
from django.template.response import TemplateResponse

VIEW = "stalwart.view_dashboard"
# The permission each action needs.
ACTIONS = {
    "retry": "stalwart.retry_job",
    "discard": "stalwart.discard_job",
    "cancel": "stalwart.cancel_job",
    "run-now": "stalwart.run_job_now",
    "pause": "stalwart.pause_queue",
    "resume": "stalwart.pause_queue",
    "enqueue": "stalwart.enqueue_recurring",
}


def allowed_actions(user: Any) -> set[str]:
    return {action for action, permission in ACTIONS.items() if user.has_perm(permission)}


def forbidden(request: Any, context: dict[str, Any], permission: str, what: str) -> HttpResponse:
    """A 403 page in the admin's frame that says which permission is missing."""
    return TemplateResponse(
        request,
        "stalwart/dashboard/forbidden.html",
        {**context, "permission": permission, "what": what, "title": "Not allowed"},
        status=403,
    )
