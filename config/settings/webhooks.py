"""What fairq tells the outside: webhooks (docs/webhooks.md) and e-mail notices."""

from __future__ import annotations

from datetime import timedelta

import environ

from .environment import env

# Webhooks (docs/webhooks.md): a signed POST per job state change to the team's
# endpoints and the job's notify_url, sent by the worker after commit. A failed try is
# tried again after each of FAIRQ_WEBHOOK_RETRY_SECONDS in turn (the first try and one
# more per entry), each POST within FAIRQ_WEBHOOK_TIMEOUT_SECONDS, redirects not
# followed. Link-local and metadata addresses are always refused; private and loopback
# ones unless FAIRQ_WEBHOOK_ALLOW_PRIVATE (on in dev, the demo and tests).
FAIRQ_WEBHOOK_RETRY_SECONDS = [
    float(x) for x in env.list("FAIRQ_WEBHOOK_RETRY_SECONDS", default=["10", "60", "300", "1800", "7200"])]
FAIRQ_WEBHOOK_TIMEOUT_SECONDS = env.float("FAIRQ_WEBHOOK_TIMEOUT_SECONDS", default=5.0)
FAIRQ_WEBHOOK_ALLOW_PRIVATE = env.bool("FAIRQ_WEBHOOK_ALLOW_PRIVATE", default=False)
FAIRQ_WEBHOOK_SWEEP_SECONDS = env.float("FAIRQ_WEBHOOK_SWEEP_SECONDS", default=30.0)
if (len(FAIRQ_WEBHOOK_RETRY_SECONDS) > 20
        or any(not 0 < s <= 7 * 86400 for s in FAIRQ_WEBHOOK_RETRY_SECONDS)):
    raise environ.ImproperlyConfigured(
        "FAIRQ_WEBHOOK_RETRY_SECONDS must be at most 20 delays of (0, 604800] seconds")
if not 0 < FAIRQ_WEBHOOK_TIMEOUT_SECONDS <= 60 or FAIRQ_WEBHOOK_SWEEP_SECONDS <= 0:
    raise environ.ImproperlyConfigured(
        "FAIRQ_WEBHOOK_TIMEOUT_SECONDS must be in (0, 60] and FAIRQ_WEBHOOK_SWEEP_SECONDS > 0")
# The Celery queue of the webhook tasks: always a queue of their own, served by a worker
# of its own (`celery worker -Q webhooks`; docker-compose's `webhooks`, the Kustomize
# base's fairq-webhooks, the demo's second in-process consumer), so a slow receiver never
# holds a worker the scheduler cycle needs (docs/webhooks.md). The cycle's workers serve
# CELERY_TASK_DEFAULT_QUEUE only (`-Q celery`).
CELERY_TASK_DEFAULT_QUEUE = "celery"
FAIRQ_WEBHOOK_QUEUE = env("FAIRQ_WEBHOOK_QUEUE", default="webhooks")
if not FAIRQ_WEBHOOK_QUEUE or FAIRQ_WEBHOOK_QUEUE == CELERY_TASK_DEFAULT_QUEUE:
    raise environ.ImproperlyConfigured(
        "FAIRQ_WEBHOOK_QUEUE must name a queue other than the scheduler's (celery)")
CELERY_TASK_ROUTES = {"queueing.tasks.webhook*": {"queue": FAIRQ_WEBHOOK_QUEUE}}
# The keys that encrypt the signing secrets of webhook endpoints and teams' notify URLs at
# rest (queueing/sealing.py, docs/webhooks.md): Fernet keys, comma-separated; the first
# encrypts, all decrypt (rotation: put a new key first, run `manage.py
# reencrypt_webhook_secrets`, then drop the old one). Empty: a key derived from
# DJANGO_SECRET_KEY (`check --deploy` warns: changing DJANGO_SECRET_KEY would lose them).
# New key: python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"
FAIRQ_WEBHOOK_SECRET_KEYS = env.list("FAIRQ_WEBHOOK_SECRET_KEYS", default=[])


def _check_secret_keys() -> None:
    from cryptography.fernet import Fernet

    for key in FAIRQ_WEBHOOK_SECRET_KEYS:
        try:
            Fernet(key.encode())
        except ValueError as exc:
            raise environ.ImproperlyConfigured(
                "FAIRQ_WEBHOOK_SECRET_KEYS: each key is 32 url-safe base64-encoded bytes "
                "(Fernet.generate_key())") from exc


_check_secret_keys()
# Finished deliveries and their tries are kept this many days (0: for ever).
FAIRQ_WEBHOOK_LOG_RETENTION_DAYS = env.float("FAIRQ_WEBHOOK_LOG_RETENTION_DAYS", default=30.0)
if FAIRQ_WEBHOOK_LOG_RETENTION_DAYS < 0:
    raise environ.ImproperlyConfigured("FAIRQ_WEBHOOK_LOG_RETENTION_DAYS must be >= 0")

# Notices by e-mail (queueing/services/notices.py): a job's submitter hears when its GPUs
# are flagged idle or it is reclaimed (rules U2, U3). EMAIL_URL picks the mail server
# (smtp://user:password@host:587 with ?tls=True, or consolemail:// as in the demo);
# FAIRQ_PUBLIC_URL is the dashboard's address the messages (and webhooks) link to.
FAIRQ_NOTICE_EMAILS = env.bool("FAIRQ_NOTICE_EMAILS", default=True)
FAIRQ_PUBLIC_URL = env("FAIRQ_PUBLIC_URL", default="")
if FAIRQ_PUBLIC_URL and not (
        FAIRQ_PUBLIC_URL.startswith(("http://", "https://"))
        and FAIRQ_PUBLIC_URL.split("://", 1)[1].split("/", 1)[0]
        and not any(c in FAIRQ_PUBLIC_URL for c in "?# ")):
    raise environ.ImproperlyConfigured(
        "FAIRQ_PUBLIC_URL must be an absolute http(s) URL such as https://fairq.example.com")
vars().update(env.email_url("EMAIL_URL", default="consolemail://"))
DEFAULT_FROM_EMAIL = env("DEFAULT_FROM_EMAIL", default="fairq <fairq@localhost>")

beat = {
    "webhook-deliveries-purge": {
        "task": "queueing.tasks.webhook_deliveries_purge_task",
        "schedule": timedelta(hours=1),
        "options": {"expires": 3600},
    },
    "webhooks-due": {
        "task": "queueing.tasks.webhooks_due_task",
        "schedule": timedelta(seconds=FAIRQ_WEBHOOK_SWEEP_SECONDS),
        "options": {"expires": FAIRQ_WEBHOOK_SWEEP_SECONDS},
    },
}
