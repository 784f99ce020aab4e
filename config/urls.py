from __future__ import annotations

from django.contrib import admin
from django.urls import include, path

from queueing import web

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("api/v1/", include("queueing.api.urls")),
    path("healthz", web.healthz, name="healthz"),
    path("", web.home, name="home"),
]
