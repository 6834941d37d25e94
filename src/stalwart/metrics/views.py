"""``metrics``: a Django view that serves the metrics to Prometheus.

Mount it in the project's URLs (``path("metrics", metrics)``), behind whatever keeps it
private (a network rule, a proxy, or a decorator of your own): it tells how busy the queue
is, by queue and task name, and nothing about any job's arguments.
"""

from typing import TYPE_CHECKING, Any, cast

from django.http import HttpResponse
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS
from django.views.decorators.http import require_GET

if TYPE_CHECKING:
    from stalwart.backend import StalwartBackend


@require_GET
def metrics(request: Any, backend: str = DEFAULT_TASK_BACKEND_ALIAS) -> HttpResponse:
    from django.tasks import task_backends

    from stalwart.metrics.collector import exposition

    try:
        import prometheus_client  # noqa: F401 - only to say what is missing
    except ImportError:
        return HttpResponse(
            "prometheus_client is not installed: pip install 'django-stalwart[prometheus]'\n",
            status=501,
            content_type="text/plain",
        )
    # The alias the project mounted the view for: its Stalwart backend.
    stalwart = cast("StalwartBackend", task_backends[backend])
    body, content_type = exposition(stalwart.config)
    return HttpResponse(body, content_type=content_type)
