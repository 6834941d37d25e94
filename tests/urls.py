"""The test project's URLs: the admin (with Stalwart's dashboard) and the metrics view."""

from django.contrib import admin
from django.urls import path

from stalwart.metrics.views import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics, name="metrics"),
]
