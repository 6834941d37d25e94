"""The test project's URLs: the admin (with Stalwart's dashboard) and the metrics view."""

from django.contrib import admin
from django.http import HttpResponse
from django.urls import path

from stalwart.metrics.views import metrics


def no_icon(request: object) -> HttpResponse:
    """The site's icon, which browsers ask for: none (the browser tests count 404s)."""
    return HttpResponse(status=204)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics, name="metrics"),
    path("favicon.ico", no_icon),
]
