"""The API (docs/api.md): rate limits, the submit fast path, /metrics."""

from __future__ import annotations

from datetime import timedelta

import environ

from .environment import env

# Rate limits: per API token (or session user), and per address without credentials.
FAIRQ_API_RATE = env("FAIRQ_API_RATE", default="6000/min")
FAIRQ_API_ANON_RATE = env("FAIRQ_API_ANON_RATE", default="120/min")
# Failed token authentications per client address; over it every token from that
# address is refused with 429 until the window ends.
FAIRQ_API_AUTH_FAILURE_RATE = env("FAIRQ_API_AUTH_FAILURE_RATE", default="20/min")
# Checkpoint reports per job (all its attempts' tokens share it): a job that checkpoints
# every minute uses 1 of 60; a loop reporting without pause is answered 429.
FAIRQ_CHECKPOINT_RATE = env("FAIRQ_CHECKPOINT_RATE", default="60/min")
for _rate in (FAIRQ_API_RATE, FAIRQ_API_ANON_RATE, FAIRQ_API_AUTH_FAILURE_RATE,
              FAIRQ_CHECKPOINT_RATE):
    if _rate and (_rate.count("/") != 1 or not _rate.split("/")[0].isdigit()
                  or _rate.split("/")[1][:1] not in {"s", "m", "h", "d"}):
        raise environ.ImproperlyConfigured(f"API rate {_rate!r} must look like '6000/min'")
# POST /api/v1/jobs/ with a token and a plain job body skips DRF's machinery, every check
# kept (queueing/api/jobs.py); off: DRF's view answers every submit.
FAIRQ_FAST_SUBMIT = env.bool("FAIRQ_FAST_SUBMIT", default=True)
# The hottest statements (a job's INSERT with its event) prepared once per database
# connection (queueing/rawsql.py::statement_cursor); off behind a transaction-mode
# connection pooler that loses prepared statements (PgBouncer before 1.21).
FAIRQ_DB_PREPARE = env.bool("FAIRQ_DB_PREPARE", default=True)
# The submit lane (queueing/api/lane.py, config/wsgi.py): such a submit runs through
# MIDDLEWARE without these, each of which has nothing to do for a token POST of JSON.
# A constant, not read from the environment.
FAIRQ_SUBMIT_LANE_SKIPS = {
    "whitenoise.middleware.WhiteNoiseMiddleware": "serves /static/ only",
    "django.contrib.sessions.middleware.SessionMiddleware": "a token request has no session",
    "django.middleware.csrf.CsrfViewMiddleware": "token requests are CSRF-exempt (no cookie)",
    "django.contrib.auth.middleware.AuthenticationMiddleware":
        "the session's user; the lane authenticates the token itself",
    "django_htmx.middleware.HtmxMiddleware": "HTML partials only",
    "django.contrib.messages.middleware.MessageMiddleware": "HTML flash messages only",
    "axes.middleware.AxesMiddleware":
        "the login form's lockout; token failures have their own limit (accounts/authentication.py)",
    "django.middleware.http.ConditionalGetMiddleware": "GET and HEAD only",
}
# /metrics wants `Authorization: Bearer <FAIRQ_METRICS_TOKEN>` when the token is set. Unset:
# open, unless FAIRQ_METRICS_REQUIRE_TOKEN, then 403. Not read from the environment: on in
# production (prod.py), off elsewhere.
FAIRQ_METRICS_TOKEN = env("FAIRQ_METRICS_TOKEN", default="")
FAIRQ_METRICS_REQUIRE_TOKEN = False

beat = {
    # Idempotency-Key records live a day (docs/api.md); older ones are deleted hourly.
    "idempotency-purge": {
        "task": "queueing.tasks.idempotency_purge_task",
        "schedule": timedelta(hours=1),
        "options": {"expires": 3600},
    },
}
