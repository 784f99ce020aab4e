"""History retention (docs/deployment.md, "History retention"): how long finished jobs
and usage records are kept, and where their archive goes before they are deleted."""

from __future__ import annotations

from datetime import timedelta

import environ

from .environment import BASE_DIR, env

# Finished jobs (SUCCEEDED, FAILED, CANCELLED) finished more than this many days ago are
# archived and deleted with everything that is theirs: events, utilization summary and
# samples, checkpoints, kept-log rows (their files too), notebook session. A job's events
# go with the job: a job page without its events would tell a wrong story. 0 keeps them
# for ever (the default: the accounting page and the API list them).
FAIRQ_JOB_RETENTION_DAYS = env.int("FAIRQ_JOB_RETENTION_DAYS", default=0)
# Usage records that ended more than this many days ago are archived and deleted once
# the reports' roll-up holds them; their rule F1 contribution is kept per team, so fair
# share and `fairshare_recompute` stay exact. Records priced apart (rule C4: spot, or a
# price of their own) are kept: the reports read them again. 0 keeps them for ever (the
# default: `/api/v1/costs/` and the accounting page read the records themselves); else
# at least 62 days (the budget check reads the current month's records, rule B2).
FAIRQ_USAGE_RETENTION_DAYS = env.int("FAIRQ_USAGE_RETENTION_DAYS", default=0)
if FAIRQ_JOB_RETENTION_DAYS < 0:
    raise environ.ImproperlyConfigured("FAIRQ_JOB_RETENTION_DAYS must be >= 0 (0 = keep for ever)")
if FAIRQ_USAGE_RETENTION_DAYS != 0 and FAIRQ_USAGE_RETENTION_DAYS < 62:
    raise environ.ImproperlyConfigured(
        "FAIRQ_USAGE_RETENTION_DAYS must be 0 (keep for ever) or at least 62")
# Where the archive goes: gzipped JSON lines, one file per table and UTC day, in the
# "fairq-history" storage (files under FAIRQ_HISTORY_STORAGE_DIR by default; any Django
# storage backend, e.g. django-storages' S3, as for the kept logs).
FAIRQ_HISTORY_STORAGE_DIR = env("FAIRQ_HISTORY_STORAGE_DIR",
                                default=str(BASE_DIR / "media" / "fairq-history"))
FAIRQ_HISTORY_STORAGE_BACKEND = env("FAIRQ_HISTORY_STORAGE_BACKEND",
                                    default="django.core.files.storage.FileSystemStorage")
FAIRQ_HISTORY_STORAGE_OPTIONS = env.json("FAIRQ_HISTORY_STORAGE_OPTIONS", default={})
if not isinstance(FAIRQ_HISTORY_STORAGE_OPTIONS, dict):
    raise environ.ImproperlyConfigured("FAIRQ_HISTORY_STORAGE_OPTIONS must be a JSON object")
if FAIRQ_HISTORY_STORAGE_BACKEND == "django.core.files.storage.FileSystemStorage":
    FAIRQ_HISTORY_STORAGE_OPTIONS = {"location": FAIRQ_HISTORY_STORAGE_DIR,
                                     **FAIRQ_HISTORY_STORAGE_OPTIONS}

beat = {
    # Archives and deletes what is older than the retentions above and the per-minute
    # utilization samples older than FAIRQ_UTIL_RETENTION_DAYS.
    "history-prune": {
        "task": "queueing.tasks.history_prune_task",
        "schedule": timedelta(hours=1),
        "options": {"expires": 3600},
    },
}
