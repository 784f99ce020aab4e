"""Local development and `make demo`: debug on, SQLite unless DATABASE_URL says otherwise."""

from __future__ import annotations

from .base import *  # noqa: F403
from .environment import env

DEBUG = env.bool("DJANGO_DEBUG", default=True)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["*"])
# Serve static files straight from the apps (no collectstatic needed to run locally).
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True
# Webhooks to a receiver on this machine (docs/webhooks.md).
FAIRQ_WEBHOOK_ALLOW_PRIVATE = env.bool("FAIRQ_WEBHOOK_ALLOW_PRIVATE", default=True)
