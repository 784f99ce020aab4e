"""Production: secrets and hosts must come from the environment; secure cookies; Redis."""

from __future__ import annotations

import environ

from .base import *  # noqa: F403
from .base import env

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
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_CONTENT_TYPE_NOSNIFF = True
CONN_MAX_AGE = env.int("DJANGO_CONN_MAX_AGE", default=60)
