"""fairq's own log lines, and the jobs' logs it keeps (docs/deployment.md, "Logs" and
"Log storage"; docs/kubernetes.md, "Logs")."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import environ

from .environment import BASE_DIR, env

# FAIRQ_LOG_FORMAT: "plain" lines, or "json": one object per line with timestamp, level,
# logger, message and, inside the scheduler, cycle_id, job_id and team (queueing/logcontext.py;
# docs/deployment.md, "Logs"). Production defaults to json (prod.py).
FAIRQ_LOG_FORMAT = env("FAIRQ_LOG_FORMAT", default="plain")
# The root logger's level (DEBUG, INFO, WARNING, ...).
FAIRQ_LOG_LEVEL = env("FAIRQ_LOG_LEVEL", default="INFO")


def logging_config(log_format: str) -> dict[str, Any]:
    if log_format not in ("plain", "json"):
        raise environ.ImproperlyConfigured(
            f"FAIRQ_LOG_FORMAT must be 'plain' or 'json', not {log_format!r}")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": "queueing.logcontext.ContextFilter"}},
        # Only the formatter in use: dictConfig builds every one listed.
        "formatters": {log_format: {
            "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
            "json": {
                "()": "pythonjsonlogger.json.JsonFormatter",
                "fmt": "%(asctime)s %(levelname)s %(name)s %(message)s",
                "rename_fields": {"asctime": "timestamp", "levelname": "level",
                                  "name": "logger"},
                "datefmt": "%Y-%m-%dT%H:%M:%S%z",
            },
        }[log_format]},
        "handlers": {"console": {"class": "logging.StreamHandler", "formatter": log_format,
                                 "filters": ["context"]}},
        "root": {"handlers": ["console"], "level": FAIRQ_LOG_LEVEL},
        "loggers": {"django.db.backends": {"level": "WARNING"}},
    }


LOGGING = logging_config(FAIRQ_LOG_FORMAT)

# Job logs: the worker keeps the last lines of each running (and just finished) job's
# logs in the database, refreshed every FAIRQ_LOG_ARCHIVE_SECONDS; the web and the API
# read only that copy (they have no cluster access; docs/kubernetes.md, "RBAC").
FAIRQ_LOG_ARCHIVE_SECONDS = env.float("FAIRQ_LOG_ARCHIVE_SECONDS", default=15.0)
# A run of that task starts no new chunk of reads past this many seconds (its soft time
# limit is 40 s); what is left is the next run's, first in line, queued at once behind
# the cycles sent meanwhile. Short, because on a one-process worker (docker-compose) a
# pod that starts during a run waits for it before a cycle sees it.
FAIRQ_LOG_ARCHIVE_BUDGET_SECONDS = env.float("FAIRQ_LOG_ARCHIVE_BUDGET_SECONDS", default=3.0)
if not 0 < FAIRQ_LOG_ARCHIVE_BUDGET_SECONDS <= 35:
    raise environ.ImproperlyConfigured("FAIRQ_LOG_ARCHIVE_BUDGET_SECONDS must be in (0, 35]")
FAIRQ_LOG_ARCHIVE_LINES = env.int("FAIRQ_LOG_ARCHIVE_LINES", default=1000)
FAIRQ_LOG_ARCHIVE_MAX_BYTES = env.int("FAIRQ_LOG_ARCHIVE_MAX_BYTES", default=256 * 1024)
if FAIRQ_LOG_ARCHIVE_SECONDS <= 0 or FAIRQ_LOG_ARCHIVE_LINES <= 0 or \
        FAIRQ_LOG_ARCHIVE_MAX_BYTES <= 0:
    raise environ.ImproperlyConfigured("FAIRQ_LOG_ARCHIVE_* must be > 0")
# When an attempt ends (success, failure, preemption, cancel, node lost) the worker keeps
# the tail of each replica's log (at most FAIRQ_LOG_ARCHIVE_BYTES, of the last
# FAIRQ_LOG_ARCHIVE_KEEP_LINES lines) in the "fairq-logs" storage below: files under
# FAIRQ_LOG_STORAGE_DIR by default; any Django storage backend, e.g. django-storages' S3
# (FAIRQ_LOG_STORAGE_BACKEND=storages.backends.s3.S3Storage and its OPTIONS as JSON in
# FAIRQ_LOG_STORAGE_OPTIONS; docs/deployment.md, "Log storage").
FAIRQ_LOG_ARCHIVE_BYTES = env.int("FAIRQ_LOG_ARCHIVE_BYTES", default=1024 * 1024)
FAIRQ_LOG_ARCHIVE_KEEP_LINES = env.int("FAIRQ_LOG_ARCHIVE_KEEP_LINES", default=10_000)
if not 0 < FAIRQ_LOG_ARCHIVE_BYTES <= 1 << 30 or FAIRQ_LOG_ARCHIVE_KEEP_LINES <= 0:
    raise environ.ImproperlyConfigured(
        "FAIRQ_LOG_ARCHIVE_BYTES must be 1..1073741824 and FAIRQ_LOG_ARCHIVE_KEEP_LINES > 0")
FAIRQ_LOG_STORAGE_DIR = env("FAIRQ_LOG_STORAGE_DIR", default=str(BASE_DIR / "media" / "fairq-logs"))
FAIRQ_LOG_STORAGE_BACKEND = env("FAIRQ_LOG_STORAGE_BACKEND",
                                default="django.core.files.storage.FileSystemStorage")
FAIRQ_LOG_STORAGE_OPTIONS = env.json("FAIRQ_LOG_STORAGE_OPTIONS", default={})
if not isinstance(FAIRQ_LOG_STORAGE_OPTIONS, dict):
    raise environ.ImproperlyConfigured("FAIRQ_LOG_STORAGE_OPTIONS must be a JSON object")
if FAIRQ_LOG_STORAGE_BACKEND == "django.core.files.storage.FileSystemStorage":
    FAIRQ_LOG_STORAGE_OPTIONS = {"location": FAIRQ_LOG_STORAGE_DIR, **FAIRQ_LOG_STORAGE_OPTIONS}
# How many workloads' logs the worker reads at once before stopping them (a cycle's
# preemption victims): each read keeps the backend's own timeout.
FAIRQ_LOG_READ_CONCURRENCY = env.int("FAIRQ_LOG_READ_CONCURRENCY", default=8)
if not 1 <= FAIRQ_LOG_READ_CONCURRENCY <= 64:
    raise environ.ImproperlyConfigured("FAIRQ_LOG_READ_CONCURRENCY must be 1..64")
# A workload about to be stopped whose log the cluster does not answer for (a timeout, a
# server error) is left running and read again, for at most this many seconds after the
# first unanswered read; then what fairq has is kept and it is stopped. 0: never wait.
FAIRQ_LOG_KEEP_RETRY_SECONDS = env.float("FAIRQ_LOG_KEEP_RETRY_SECONDS", default=60.0)
if not 0 <= FAIRQ_LOG_KEEP_RETRY_SECONDS <= 3600:
    raise environ.ImproperlyConfigured("FAIRQ_LOG_KEEP_RETRY_SECONDS must be 0..3600")
# Kept logs (rows and stored files) of attempts kept longer ago than this many days are
# deleted by the hourly `job-logs-prune` task, each pruned attempt recorded as a job event
# (kind `logs_pruned`); 0 keeps them for ever.
FAIRQ_LOG_RETENTION_DAYS = env.int("FAIRQ_LOG_RETENTION_DAYS", default=30)
if FAIRQ_LOG_RETENTION_DAYS < 0:
    raise environ.ImproperlyConfigured("FAIRQ_LOG_RETENTION_DAYS must be >= 0 (0 = keep for ever)")

beat = {
    "job-logs-archive": {
        "task": "queueing.tasks.job_logs_archive_task",
        "schedule": timedelta(seconds=FAIRQ_LOG_ARCHIVE_SECONDS),
        "options": {"expires": FAIRQ_LOG_ARCHIVE_SECONDS},
    },
    "job-logs-prune": {
        "task": "queueing.tasks.job_logs_prune_task",
        "schedule": timedelta(hours=1),
        "options": {"expires": 3600},
    },
}
