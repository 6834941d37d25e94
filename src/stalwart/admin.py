"""The dashboard's entry in the Django admin (found by ``admin.autodiscover()``)."""

from django.contrib import admin

from stalwart.dashboard.admin import DashboardAdmin
from stalwart.models import Dashboard

admin.site.register(Dashboard, DashboardAdmin)
