from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, re_path

from accounts import sso
from queueing import web
from queueing.metrics import metrics_view
from queueing.web.notebook_proxy import notebook_http

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    # Single sign-on (404 unless configured); the names are mozilla-django-oidc's.
    path("oidc/authenticate/", sso.oidc_authenticate, name="oidc_authentication_init"),
    path("oidc/callback/", sso.oidc_callback, name="oidc_authentication_callback"),
    path("api/v1/", include("queueing.api.urls")),
    path("healthz", web.healthz, name="healthz"),
    path("readyz", web.readyz, name="readyz"),
    path("healthz/scheduler", web.healthz_scheduler, name="healthz-scheduler"),
    path("metrics", metrics_view, name="metrics"),
    # A notebook session's JupyterLab, proxied (docs/sessions.md, "Opening one");
    # its WebSockets are config/asgi.py's.
    re_path(r"^sessions/(?P<job_id>[0-9]{1,18})/lab(?P<rest>/.*)?$", notebook_http,
            name="session-lab"),
    path("", web.home, name="home"),
    path("", include("queueing.web.urls")),
]
