from django.contrib import admin
from django.urls import path

from stalwart.metrics.views import metrics

urlpatterns = [path("admin/", admin.site.urls), path("metrics", metrics)]
