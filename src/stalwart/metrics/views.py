"""``metrics``: a Django view that serves the metrics to Prometheus.

Mount it in the project's URLs (``path("metrics", metrics)``), behind whatever keeps it
private (a network rule, a proxy, or a decorator of your own): it tells how busy the queue
is, by queue and task name, and nothing about any job's arguments.
"""

from typing import Any

from django.http import HttpResponse
from django.tasks import DEFAULT_TASK_BACKEND_ALIAS
from django.views.decorators.http import require_GET


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
    body, content_type = exposition(task_backends[backend].config)
    return HttpResponse(body, content_type=content_type)
