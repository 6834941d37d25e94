"""``DashboardAdmin``: the dashboard's URLs under the admin, behind the admin's login."""

from typing import Any

from django.contrib import admin
from django.http import HttpResponseRedirect
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS
from django.urls import path, reverse

from stalwart.aliases import stalwart_aliases
from stalwart.dashboard import actions, pages
from stalwart.dashboard.permissions import VIEW


class DashboardAdmin(admin.ModelAdmin):
    """No change list, no forms: every page is the dashboard's own."""

    def has_module_permission(self, request: Any) -> bool:
        return request.user.has_perm(VIEW)

    def has_view_permission(self, request: Any, obj: Any = None) -> bool:
        return request.user.has_perm(VIEW)

    def has_add_permission(self, request: Any) -> bool:
        return False

    def has_change_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: Any, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: Any, extra_context: Any = None) -> Any:
        aliases = stalwart_aliases()
        alias = aliases[0] if aliases else DEFAULT_TASK_BACKEND_ALIAS
        return HttpResponseRedirect(reverse("admin:stalwart_overview", args=[alias]))

    def get_urls(self) -> list:
        def view(function: Any) -> Any:
            def wrapped(request: Any, *args: Any, **kwargs: Any) -> Any:
                return function(request, self.admin_site, *args, **kwargs)

            return self.admin_site.admin_view(wrapped)

        return [
            path("", view(self.changelist_view_wrapper), name="stalwart_dashboard_changelist"),
            path("<str:backend>/", view(pages.overview), name="stalwart_overview"),
            path("<str:backend>/jobs/<str:state>/", view(pages.jobs), name="stalwart_jobs"),
            path(
                "<str:backend>/jobs/<str:state>/bulk/",
                view(actions.bulk),
                name="stalwart_bulk",
            ),
            path("<str:backend>/job/<uuid:job_id>/", view(pages.job), name="stalwart_job"),
            path(
                "<str:backend>/job/<uuid:job_id>/<str:action>/",
                view(actions.job_action),
                name="stalwart_job_action",
            ),
            path(
                "<str:backend>/queue/<str:queue>/<str:action>/",
                view(actions.queue_action),
                name="stalwart_queue_action",
            ),
            path("<str:backend>/processes/", view(pages.processes), name="stalwart_processes"),
            path("<str:backend>/recurring/", view(pages.recurring), name="stalwart_recurring"),
            path("<str:backend>/batches/", view(pages.batches), name="stalwart_batches"),
            path("<str:backend>/batch/<uuid:batch_id>/", view(pages.batch), name="stalwart_batch"),
            path(
                "<str:backend>/batch/<uuid:batch_id>/<str:action>/",
                view(actions.batch_action),
                name="stalwart_batch_action",
            ),
            path(
                "<str:backend>/recurring/<str:key>/enqueue/",
                view(actions.enqueue_recurring),
                name="stalwart_recurring_enqueue",
            ),
        ]

    def changelist_view_wrapper(self, request: Any, site: Any) -> Any:
        return self.changelist_view(request)
