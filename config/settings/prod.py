"""Production: secrets and hosts must come from the environment; secure cookies; Redis."""

from __future__ import annotations

import environ

from .base import *  # noqa: F403
from .environment import env
from .logs import logging_config

# Production never falls back to SQLite, a per-process cache or the in-memory broker
# (tasks would never reach the worker): both URLs are required.
for _name in ("DATABASE_URL", "REDIS_URL"):
    if not env(_name, default=""):
        raise environ.ImproperlyConfigured(f"{_name} must be set in production")

DEBUG = False
SECRET_KEY = env("DJANGO_SECRET_KEY")  # no default: fail loudly when unset
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS")
SESSION_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", default=True)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE
# HTTPS (docs/deployment.md, "HTTPS"): plain HTTP is redirected and browsers are told to
# stay on HTTPS. Behind a TLS-terminating proxy set FAIRQ_TRUSTED_PROXY_COUNT, which also
# trusts its X-Forwarded-Proto (base.py); without that every request looks like plain
# HTTP and the redirect would loop. /healthz, /readyz and /metrics are exempt: probes and scrapes
# reach the pod directly, not through the proxy.
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", default=True)
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$"]
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", default=365 * 24 * 3600)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", default=False)
if not SECURE_HSTS_PRELOAD:
    # Preloading is a promise about the whole domain to the browsers' lists: the
    # operator's call (DJANGO_SECURE_HSTS_PRELOAD), not a default to nag about.
    SILENCED_SYSTEM_CHECKS = ["security.W021"]
SECURE_CONTENT_TYPE_NOSNIFF = True
# /metrics never open in production: 403 until FAIRQ_METRICS_TOKEN is set (check --deploy
# warns, fairq.W001).
FAIRQ_METRICS_REQUIRE_TOKEN = True
CONN_MAX_AGE = env.int("DJANGO_CONN_MAX_AGE", default=60)
# One JSON object per log line for the log pipeline (docs/deployment.md, "Logs").
FAIRQ_LOG_FORMAT = env("FAIRQ_LOG_FORMAT", default="json")
LOGGING = logging_config(FAIRQ_LOG_FORMAT)
