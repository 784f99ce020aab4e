"""Settings shared by every environment. Everything deployment-specific comes from the
environment (django-environ); a bad value fails at start-up, not at first use."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import environ

# The policy's defaults are the product's: every FAIRQ_* below that maps a policy knob only
# overrides them (queueing/policy/settings.py, pure: no Django).
from queueing.policy.settings import DEFAULTS as _POLICY
from queueing.validation import parse_bytes as _parse_bytes

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

SECRET_KEY = env("DJANGO_SECRET_KEY", default="fairq-insecure-dev-key-change-me")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "django_celery_beat",
    "accounts",
    "queueing",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # NUL in path, query or form; API bodies over the size limit (queueing/middleware.py).
    "queueing.middleware.RefuseBadInputMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# SQLite when DATABASE_URL is unset; PostgreSQL (psycopg 3) with postgres://...
DATABASES = {
    "default": env.db_url("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
}
DATABASES["default"].setdefault("ATOMIC_REQUESTS", False)  # services own transactions
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The in-process worker and the web threads share one file: wait for the writer
    # instead of failing with "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault("timeout", 20)
    DATABASES["default"]["OPTIONS"].setdefault(
        "init_command", "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;"
    )
    DATABASES["default"]["OPTIONS"].setdefault("transaction_mode", "IMMEDIATE")
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env("REDIS_URL", default="")
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                          "LOCATION": REDIS_URL}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES: dict[str, dict[str, object]] = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
LOGIN_URL = "/accounts/login/"

# FAIRQ_LOG_FORMAT: "plain" lines, or "json": one object per line with timestamp, level,
# logger, message and, inside the scheduler, cycle_id, job_id and team (queueing/logcontext.py;
# docs/deployment.md, "Logs"). Production defaults to json (prod.py).
FAIRQ_LOG_FORMAT = env("FAIRQ_LOG_FORMAT", default="plain")


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
        "root": {"handlers": ["console"], "level": env("FAIRQ_LOG_LEVEL", default="INFO")},
        "loggers": {"django.db.backends": {"level": "WARNING"}},
    }


LOGGING = logging_config(FAIRQ_LOG_FORMAT)

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "accounts.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "queueing.api.schema.FairqAutoSchema",
    "EXCEPTION_HANDLER": "queueing.api.errors.exception_handler",
    # JSON bodies only (415 otherwise): no RecursionError, no NUL (queueing/api/parsers.py).
    "DEFAULT_PARSER_CLASSES": ["queueing.api.parsers.SafeJSONParser"],
    "TEST_REQUEST_DEFAULT_FORMAT": "json",
    "DEFAULT_PAGINATION_CLASS": "queueing.api.pagination.JobCursorPagination",
    "PAGE_SIZE": 50,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "fairq API",
    "DESCRIPTION": "A multi-tenant fair-share queue for GPU jobs on Kubernetes.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
}

# --- Celery -------------------------------------------------------------------------
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default=REDIS_URL or "memory://")
CELERY_RESULT_BACKEND = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SOFT_TIME_LIMIT = 60
CELERY_TASK_TIME_LIMIT = 90
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Keep LOGGING's handler (FAIRQ_LOG_FORMAT, the log context) in the worker and beat:
# Celery would otherwise replace the root logger's handlers with its own format.
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_BEAT_SCHEDULER = env(
    "CELERY_BEAT_SCHEDULER", default="django_celery_beat.schedulers:DatabaseScheduler"
)
FAIRQ_CYCLE_INTERVAL_SECONDS = env.float("FAIRQ_CYCLE_INTERVAL_SECONDS", default=_POLICY.cycle_seconds)
if FAIRQ_CYCLE_INTERVAL_SECONDS <= 0:
    raise environ.ImproperlyConfigured("FAIRQ_CYCLE_INTERVAL_SECONDS must be > 0")
# The time a scheduler cycle allows itself, well inside its task's time limits (soft 50 s,
# hard 60 s: queueing/tasks.py): step 1 stops handling moved workloads at 40% of it, step
# 5 starts no new chunk of FAIRQ_CYCLE_SUBMIT_CHUNK creates past it, and at most
# FAIRQ_CYCLE_STOP_BATCH workloads no job holds are stopped (their logs kept first) per
# cycle; the rest is the next cycle's, kicked at once (docs/performance.md, "Cycle budget").
FAIRQ_CYCLE_BUDGET_SECONDS = env.float("FAIRQ_CYCLE_BUDGET_SECONDS", default=8.0)
FAIRQ_CYCLE_STOP_BATCH = env.int("FAIRQ_CYCLE_STOP_BATCH", default=64)
FAIRQ_CYCLE_SUBMIT_CHUNK = env.int("FAIRQ_CYCLE_SUBMIT_CHUNK", default=64)
if not 0 < FAIRQ_CYCLE_BUDGET_SECONDS <= 45 or FAIRQ_CYCLE_STOP_BATCH < 1 or \
        FAIRQ_CYCLE_SUBMIT_CHUNK < 1:
    raise environ.ImproperlyConfigured(
        "FAIRQ_CYCLE_BUDGET_SECONDS must be in (0, 45] (the cycle task's soft limit is 50 s); "
        "FAIRQ_CYCLE_STOP_BATCH and FAIRQ_CYCLE_SUBMIT_CHUNK >= 1")
# The scheduler is unhealthy (GET /healthz/scheduler answers 503) when its last successful
# cycle is older than this many cycle intervals (60 s at the default 3 s).
FAIRQ_SCHEDULER_STALE_CYCLES = env.float("FAIRQ_SCHEDULER_STALE_CYCLES", default=20.0)
if FAIRQ_SCHEDULER_STALE_CYCLES < 2:
    raise environ.ImproperlyConfigured("FAIRQ_SCHEDULER_STALE_CYCLES must be >= 2")
# ... and "behind" (also 503) when its last successful cycle, or a gap between two
# successful cycles within that stale window, is longer than this many intervals (15 s at
# the default 3 s): cycles that still succeed, but now and then instead of every interval
# (a worker busy with other work).
FAIRQ_SCHEDULER_BEHIND_CYCLES = env.float("FAIRQ_SCHEDULER_BEHIND_CYCLES", default=5.0)
if not 2 <= FAIRQ_SCHEDULER_BEHIND_CYCLES <= FAIRQ_SCHEDULER_STALE_CYCLES:
    raise environ.ImproperlyConfigured(
        "FAIRQ_SCHEDULER_BEHIND_CYCLES must be >= 2 and <= FAIRQ_SCHEDULER_STALE_CYCLES")
# The worker and beat touch a heartbeat file per scheduler tick (queueing/health.py); their
# liveness probes (`manage.py heartbeat_check`) read it. Empty: the system's temp dir.
FAIRQ_HEARTBEAT_DIR = env("FAIRQ_HEARTBEAT_DIR", default="")
CELERY_BEAT_SCHEDULE = {
    "scheduler-cycle": {
        "task": "queueing.tasks.scheduler_cycle_task",
        "schedule": timedelta(seconds=FAIRQ_CYCLE_INTERVAL_SECONDS),
        # A late tick is worthless: the next one is seconds away.
        "options": {"expires": FAIRQ_CYCLE_INTERVAL_SECONDS * 2},
    },
}

# --- fairq ----------------------------------------------------------------------------
# Fair-share (docs/scheduling.md, rules F1-F3).
FAIRQ_DECAY_HALF_LIFE_HOURS = env.float("FAIRQ_DECAY_HALF_LIFE_HOURS",
                                        default=_POLICY.half_life_hours)
if FAIRQ_DECAY_HALF_LIFE_HOURS <= 0:
    raise environ.ImproperlyConfigured("FAIRQ_DECAY_HALF_LIFE_HOURS must be > 0")
# Rule F6: an admission counts as this many seconds of usage at once (one recompute
# interval: standings are recomputed every scheduler cycle).
FAIRQ_FAIRSHARE_RECOMPUTE_SECONDS = env.float(
    "FAIRQ_FAIRSHARE_RECOMPUTE_SECONDS", default=FAIRQ_CYCLE_INTERVAL_SECONDS
)
# Rule P1: multifactor priority weights; max age in hours caps the age factor.
FAIRQ_PRIORITY_WEIGHT_FAIRSHARE = env.float("FAIRQ_PRIORITY_WEIGHT_FAIRSHARE",
                                            default=_POLICY.priority.fair_share)
FAIRQ_PRIORITY_WEIGHT_AGE = env.float("FAIRQ_PRIORITY_WEIGHT_AGE", default=_POLICY.priority.age)
FAIRQ_PRIORITY_WEIGHT_SIZE = env.float("FAIRQ_PRIORITY_WEIGHT_SIZE", default=_POLICY.priority.size)
FAIRQ_PRIORITY_MAX_AGE_HOURS = env.float("FAIRQ_PRIORITY_MAX_AGE_HOURS",
                                         default=_POLICY.priority.max_age_seconds / 3600.0)
FAIRQ_PRIORITY_FAVOR_SMALL = env.bool("FAIRQ_PRIORITY_FAVOR_SMALL",
                                      default=_POLICY.priority.favor_small)
# Standings snapshots for charts: one row per interval, kept this many days.
FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS = env.float("FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS", default=900.0)
FAIRQ_FAIRSHARE_SNAPSHOT_RETENTION_DAYS = env.float(
    "FAIRQ_FAIRSHARE_SNAPSHOT_RETENTION_DAYS", default=90.0
)
for _name in ("FAIRQ_FAIRSHARE_RECOMPUTE_SECONDS", "FAIRQ_PRIORITY_WEIGHT_FAIRSHARE",
              "FAIRQ_PRIORITY_WEIGHT_AGE", "FAIRQ_PRIORITY_WEIGHT_SIZE",
              "FAIRQ_PRIORITY_MAX_AGE_HOURS", "FAIRQ_FAIRSHARE_SNAPSHOT_RETENTION_DAYS"):
    if globals()[_name] < 0:
        raise environ.ImproperlyConfigured(f"{_name} must be >= 0")
if FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS <= 0:
    raise environ.ImproperlyConfigured("FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS must be > 0")
CELERY_BEAT_SCHEDULE["fairshare-snapshot"] = {
    "task": "queueing.tasks.fairshare_snapshot_task",
    "schedule": timedelta(seconds=FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS),
    "options": {"expires": FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS},
}
# Idempotency-Key records live a day (docs/api.md); older ones are deleted hourly.
CELERY_BEAT_SCHEDULE["idempotency-purge"] = {
    "task": "queueing.tasks.idempotency_purge_task",
    "schedule": timedelta(hours=1),
    "options": {"expires": 3600},
}

# Job logs: the worker keeps the last lines of each running (and just finished) job's
# logs in the database, refreshed every FAIRQ_LOG_ARCHIVE_SECONDS; the web and the API
# read only that copy (they have no cluster access; docs/kubernetes.md, "RBAC").
FAIRQ_LOG_ARCHIVE_SECONDS = env.float("FAIRQ_LOG_ARCHIVE_SECONDS", default=15.0)
# A run of that task starts no new chunk of reads past this many seconds (its soft time
# limit is 40 s); what is left is the next run's, first in line.
FAIRQ_LOG_ARCHIVE_BUDGET_SECONDS = env.float("FAIRQ_LOG_ARCHIVE_BUDGET_SECONDS", default=10.0)
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
STORAGES["fairq-logs"] = {"BACKEND": FAIRQ_LOG_STORAGE_BACKEND,
                          "OPTIONS": FAIRQ_LOG_STORAGE_OPTIONS}
CELERY_BEAT_SCHEDULE["job-logs-archive"] = {
    "task": "queueing.tasks.job_logs_archive_task",
    "schedule": timedelta(seconds=FAIRQ_LOG_ARCHIVE_SECONDS),
    "options": {"expires": FAIRQ_LOG_ARCHIVE_SECONDS},
}
# GPU utilization and idle GPUs (docs/scheduling.md, "Idle GPUs", rules U1-U5): read once a
# cycle from Prometheus (dcgm-exporter's metrics) at FAIRQ_PROMETHEUS_URL; unset: from the
# simulated cluster when that is the backend, else off. Per-minute samples are kept
# FAIRQ_UTIL_RETENTION_DAYS (the per-attempt summaries for good).
FAIRQ_PROMETHEUS_URL = env("FAIRQ_PROMETHEUS_URL", default="")
FAIRQ_PROMETHEUS_TIMEOUT_SECONDS = env.float("FAIRQ_PROMETHEUS_TIMEOUT_SECONDS", default=5.0)
FAIRQ_UTIL_RETENTION_DAYS = env.float("FAIRQ_UTIL_RETENTION_DAYS", default=30.0)
if FAIRQ_PROMETHEUS_URL:
    from queueing.backends.prometheus import parse_prometheus_url

    try:
        parse_prometheus_url(FAIRQ_PROMETHEUS_URL)
    except ValueError as _exc:
        raise environ.ImproperlyConfigured(str(_exc)) from _exc
if not 0 < FAIRQ_PROMETHEUS_TIMEOUT_SECONDS <= 60 or FAIRQ_UTIL_RETENTION_DAYS <= 0:
    raise environ.ImproperlyConfigured(
        "FAIRQ_PROMETHEUS_TIMEOUT_SECONDS must be in (0, 60] and FAIRQ_UTIL_RETENTION_DAYS > 0")
CELERY_BEAT_SCHEDULE["utilization-purge"] = {
    "task": "queueing.tasks.utilization_purge_task",
    "schedule": timedelta(hours=1),
    "options": {"expires": 3600},
}
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
CELERY_BEAT_SCHEDULE["job-logs-prune"] = {
    "task": "queueing.tasks.job_logs_prune_task",
    "schedule": timedelta(hours=1),
    "options": {"expires": 3600},
}
# Notices by e-mail (queueing/services/notices.py): a job's submitter hears when its GPUs
# are flagged idle or it is reclaimed (rules U2, U3). EMAIL_URL picks the mail server
# (smtp://user:password@host:587 with ?tls=True, or consolemail:// as in the demo);
# FAIRQ_PUBLIC_URL is the dashboard's address the messages link to.
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
# The cluster view (nodes, free GPUs, live workloads) the worker publishes each cycle for
# the web; older than this, pages say it is stale (is the worker running?).
FAIRQ_CLUSTER_VIEW_STALE_SECONDS = env.float("FAIRQ_CLUSTER_VIEW_STALE_SECONDS", default=120.0)

# The cluster backend: "simulated" (in-process, the default) or "kubernetes".
FAIRQ_CLUSTER_BACKEND = env("FAIRQ_CLUSTER_BACKEND", default="simulated")
if FAIRQ_CLUSTER_BACKEND not in {"simulated", "kubernetes"}:
    raise environ.ImproperlyConfigured(
        f"FAIRQ_CLUSTER_BACKEND must be 'simulated' or 'kubernetes', not {FAIRQ_CLUSTER_BACKEND!r}"
    )
FAIRQ_KUBECONFIG = env("FAIRQ_KUBECONFIG", default="")
FAIRQ_KUBE_CONTEXT = env("FAIRQ_KUBE_CONTEXT", default="")
# Rule K5 (docs/clusters.md): how long a cluster fairq cannot read keeps its running jobs
# (they hold their quota and are charged) before they are requeued elsewhere.
FAIRQ_CLUSTER_UNREACHABLE_GRACE_SECONDS = env.int("FAIRQ_CLUSTER_UNREACHABLE_GRACE_SECONDS",
                                                  default=600)
if FAIRQ_CLUSTER_UNREACHABLE_GRACE_SECONDS < 0:
    raise environ.ImproperlyConfigured("FAIRQ_CLUSTER_UNREACHABLE_GRACE_SECONDS must be >= 0")

# The simulated cluster: node pools as "count x gpus x gpu_type" separated by commas.
FAIRQ_SIM_NODES = env("FAIRQ_SIM_NODES", default="4x8xh100,4x8xa100,2x7xmig-1g-10gb")
FAIRQ_SIM_DEFAULT_SECONDS = env.float("FAIRQ_SIM_DEFAULT_SECONDS", default=60.0)
if FAIRQ_SIM_DEFAULT_SECONDS < 0:
    raise environ.ImproperlyConfigured("FAIRQ_SIM_DEFAULT_SECONDS must be >= 0")


def _check_sim_nodes(spec: str) -> None:
    """Parse FAIRQ_SIM_NODES at start-up, not at the first cycle."""
    from queueing.backends.simulated import SimulatedClusterError, parse_node_spec

    try:
        parse_node_spec(spec)
    except SimulatedClusterError as exc:
        raise environ.ImproperlyConfigured(str(exc)) from exc


_check_sim_nodes(FAIRQ_SIM_NODES)

# Kick a scheduler cycle after a submit or a finish (debounced through the cache).
FAIRQ_KICK_SCHEDULER = env.bool("FAIRQ_KICK_SCHEDULER", default=True)
# Demo only: submit synthetic jobs so the standings move.
FAIRQ_DEMO_LOAD = env.bool("FAIRQ_DEMO_LOAD", default=False)
FAIRQ_DEFAULT_TIER = env("FAIRQ_DEFAULT_TIER", default="normal")
# The lifetime of an API token issued without one, in days (the team page's form and
# POST /tokens/ without `expires_in_days`); 0: such tokens never expire.
FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS = env.int("FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS", default=90)
if not 0 <= FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS <= 3650:
    raise environ.ImproperlyConfigured("FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS must be 0..3650")
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

# --- Client address, login throttling (docs/deployment.md, "Behind a proxy") -----------------
# How many reverse proxies in front of fairq append to X-Forwarded-For (0: none, the peer
# is the client). accounts.client_ip.client_ip() is the one reader, for rate limits,
# login throttling and audit records. Behind proxies their X-Forwarded-Proto is trusted.
FAIRQ_TRUSTED_PROXY_COUNT = env.int("FAIRQ_TRUSTED_PROXY_COUNT", default=0)
if not 0 <= FAIRQ_TRUSTED_PROXY_COUNT <= 10:
    raise environ.ImproperlyConfigured("FAIRQ_TRUSTED_PROXY_COUNT must be 0..10")
if FAIRQ_TRUSTED_PROXY_COUNT:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# django-axes: a username is locked out at one client address after this many failed
# logins (web and admin), for this long; a success resets the count. Attempts are rows in
# the database (AccessAttempt, AccessLog: visible in the admin, shared by every process).
FAIRQ_LOGIN_FAILURE_LIMIT = env.int("FAIRQ_LOGIN_FAILURE_LIMIT", default=5)
FAIRQ_LOGIN_COOLOFF_MINUTES = env.int("FAIRQ_LOGIN_COOLOFF_MINUTES", default=15)
if FAIRQ_LOGIN_FAILURE_LIMIT < 1 or FAIRQ_LOGIN_COOLOFF_MINUTES < 1:
    raise environ.ImproperlyConfigured(
        "FAIRQ_LOGIN_FAILURE_LIMIT and FAIRQ_LOGIN_COOLOFF_MINUTES must be >= 1")
INSTALLED_APPS.append("axes")
MIDDLEWARE.insert(1, "accounts.client_ip.ClientIpMiddleware")  # before anything audits
MIDDLEWARE.append("axes.middleware.AxesMiddleware")  # after authentication
AUTHENTICATION_BACKENDS = [
    "accounts.backends.LoginThrottleBackend",
    "django.contrib.auth.backends.ModelBackend",
]
# Single sign-on with OpenID Connect (accounts/sso.py; docs/deployment.md, "Single
# sign-on"): on when OIDC_RP_CLIENT_ID is set. The provider's endpoints are given
# explicitly (mozilla-django-oidc does no discovery).
OIDC_RP_CLIENT_ID = env("OIDC_RP_CLIENT_ID", default="")
OIDC_RP_CLIENT_SECRET = env("OIDC_RP_CLIENT_SECRET", default="")
OIDC_OP_AUTHORIZATION_ENDPOINT = env("OIDC_OP_AUTHORIZATION_ENDPOINT", default="")
OIDC_OP_TOKEN_ENDPOINT = env("OIDC_OP_TOKEN_ENDPOINT", default="")
OIDC_OP_USER_ENDPOINT = env("OIDC_OP_USER_ENDPOINT", default="")
OIDC_OP_JWKS_ENDPOINT = env("OIDC_OP_JWKS_ENDPOINT", default="")
OIDC_RP_SIGN_ALGO = env("OIDC_RP_SIGN_ALGO", default="RS256")
OIDC_RP_SCOPES = env("OIDC_RP_SCOPES", default="openid email profile")
# Match the ID token's `kid` header to a JWKS key. Off only for a provider that signs
# without a kid and publishes a single key.
OIDC_VERIFY_KID = env.bool("OIDC_VERIFY_KID", default=True)
# After a refused or failed sign-on: the login page, which says so.
LOGIN_REDIRECT_URL_FAILURE = "/accounts/login/?sso=failed"
# The claims: the username (matched to accounts without a password), and the groups
# whose `<prefix><team slug>` make a member and `<prefix><team slug><admin suffix>` a
# team admin. Memberships are re-synced from the claim at every sign-on.
FAIRQ_OIDC_USERNAME_CLAIM = env("FAIRQ_OIDC_USERNAME_CLAIM", default="preferred_username")
FAIRQ_OIDC_GROUPS_CLAIM = env("FAIRQ_OIDC_GROUPS_CLAIM", default="groups")
FAIRQ_OIDC_TEAM_GROUP_PREFIX = env("FAIRQ_OIDC_TEAM_GROUP_PREFIX", default="")
FAIRQ_OIDC_ADMIN_GROUP_SUFFIX = env("FAIRQ_OIDC_ADMIN_GROUP_SUFFIX", default=":admin")
# The group that makes fairq staff (tiers, quotas, prices, every team). Empty: sign-on
# leaves staff rights alone (granted by hand). Set: re-synced at every sign-on, so leaving
# the group takes them away at the next login.
FAIRQ_OIDC_STAFF_GROUP = env("FAIRQ_OIDC_STAFF_GROUP", default="")
FAIRQ_OIDC_ENABLED = bool(OIDC_RP_CLIENT_ID)
if FAIRQ_OIDC_ENABLED:
    _missing = [n for n in ("OIDC_OP_AUTHORIZATION_ENDPOINT", "OIDC_OP_TOKEN_ENDPOINT",
                            "OIDC_OP_USER_ENDPOINT") if not globals()[n]]
    if OIDC_RP_SIGN_ALGO == "RS256" and not OIDC_OP_JWKS_ENDPOINT:
        _missing.append("OIDC_OP_JWKS_ENDPOINT")
    if _missing:
        raise environ.ImproperlyConfigured(
            f"OIDC_RP_CLIENT_ID is set, so single sign-on needs {', '.join(_missing)}")
    AUTHENTICATION_BACKENDS.append("accounts.sso_backend.FairqOIDCBackend")
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_FAILURE_LIMIT = FAIRQ_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=FAIRQ_LOGIN_COOLOFF_MINUTES)
# Per username AND address: a guesser is stopped at their address without locking the
# real user out everywhere (which anyone could do by typing the username).
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "accounts.client_ip.client_ip"
AXES_LOCKOUT_CALLABLE = "accounts.backends.lockout_response"
AXES_HTTP_RESPONSE_CODE = 429
AXES_VERBOSE = False

# --- API v1 (docs/api.md) ----------------------------------------------------------------
# Rate limits: per API token (or session user), and per address without credentials.
FAIRQ_API_RATE = env("FAIRQ_API_RATE", default="6000/min")
FAIRQ_API_ANON_RATE = env("FAIRQ_API_ANON_RATE", default="120/min")
# Failed token authentications per client address; over it every token from that
# address is refused with 429 until the window ends.
FAIRQ_API_AUTH_FAILURE_RATE = env("FAIRQ_API_AUTH_FAILURE_RATE", default="20/min")
for _rate in (FAIRQ_API_RATE, FAIRQ_API_ANON_RATE, FAIRQ_API_AUTH_FAILURE_RATE):
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
REST_FRAMEWORK["DEFAULT_THROTTLE_CLASSES"] = [
    "queueing.api.throttling.TokenRateThrottle",
    "queueing.api.throttling.AnonymousRateThrottle",
]
# ETag on every GET answer and 304 for a matching If-None-Match (polling clients).
MIDDLEWARE.append("django.middleware.http.ConditionalGetMiddleware")
# Swagger UI from the drf-spectacular-sidecar package: no CDN.
INSTALLED_APPS.append("drf_spectacular_sidecar")
SPECTACULAR_SETTINGS.update({
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "COMPONENT_SPLIT_REQUEST": True,
    # The schema and Swagger UI are public (no secrets in them); calls still need a token.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
    # Two answers have a `state`: each enum keeps a name of its own (an attempt's, as
    # before; a cluster's, rule K8) instead of both being renamed after their component.
    "ENUM_NAME_OVERRIDES": {"StateEnum": "queueing.selectors.accounting.ATTEMPT_STATES",
                            "ClusterStateEnum": "queueing.selectors.clusters.CLUSTER_STATES"},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "queueing.api.schema.add_errors_and_idempotency",
    ],
})
# /metrics wants `Authorization: Bearer <FAIRQ_METRICS_TOKEN>` when the token is set. Unset:
# open, unless FAIRQ_METRICS_REQUIRE_TOKEN (always on in production), then 403.
FAIRQ_METRICS_TOKEN = env("FAIRQ_METRICS_TOKEN", default="")
FAIRQ_METRICS_REQUIRE_TOKEN = env.bool("FAIRQ_METRICS_REQUIRE_TOKEN", default=False)
# Fair-share standings of every team to every user (like Slurm's sshare); by default a
# user sees only the teams they are in, staff see all (docs/api.md, "Who sees which team").
FAIRQ_FAIRSHARE_PUBLIC = env.bool("FAIRQ_FAIRSHARE_PUBLIC", default=False)

# Preemption (docs/scheduling.md, rules R1-R8).
FAIRQ_PREEMPTION_ENABLED = env.bool("FAIRQ_PREEMPTION_ENABLED", default=_POLICY.preemption.enabled)
# Rule R5: at most this many preemptions per preemptor team per window (-1 = no limit).
FAIRQ_PREEMPTION_MAX_PER_TEAM = env.int(
    "FAIRQ_PREEMPTION_MAX_PER_TEAM",
    default=-1 if _POLICY.preemption.max_per_team is None else _POLICY.preemption.max_per_team)
FAIRQ_PREEMPTION_WINDOW_SECONDS = env.int("FAIRQ_PREEMPTION_WINDOW_SECONDS",
                                          default=int(_POLICY.preemption.window_seconds))
# Rule R8: a preemptor waits for its victims (no new victims) while the cluster lists
# their workloads, and at least this long after preempting; it is nominated this long.
FAIRQ_PREEMPTION_TERMINATION_GRACE_SECONDS = env.int(
    "FAIRQ_PREEMPTION_TERMINATION_GRACE_SECONDS",
    default=int(_POLICY.preemption.termination_grace_seconds))
FAIRQ_PREEMPTION_NOMINATION_SECONDS = env.int(
    "FAIRQ_PREEMPTION_NOMINATION_SECONDS", default=int(_POLICY.preemption.nomination_seconds))
# Victim searches per cycle: bounds the cost of a long queue of jobs that cannot fit.
FAIRQ_PREEMPTION_MAX_SEARCHES = env.int("FAIRQ_PREEMPTION_MAX_SEARCHES",
                                        default=_POLICY.preemption.max_searches)
# Rule R3: a job preempted this many times is no longer a victim (-1 = no such protection).
FAIRQ_PREEMPTION_MAX_PER_JOB = env.int(
    "FAIRQ_PREEMPTION_MAX_PER_JOB",
    default=-1 if _POLICY.preemption.max_preemptions_per_job is None
    else _POLICY.preemption.max_preemptions_per_job)
# Rule R9: a preemption's victims may lose at most this many GPU-seconds per GPU-second
# its preemptor has waited (-1 = no such check).
FAIRQ_PREEMPTION_LOST_PER_WAIT = env.float(
    "FAIRQ_PREEMPTION_LOST_PER_WAIT",
    default=-1.0 if _POLICY.preemption.lost_per_wait is None
    else _POLICY.preemption.lost_per_wait)
if FAIRQ_PREEMPTION_LOST_PER_WAIT < 0 and FAIRQ_PREEMPTION_LOST_PER_WAIT != -1:
    raise environ.ImproperlyConfigured("FAIRQ_PREEMPTION_LOST_PER_WAIT must be >= 0 or -1")
for _name in ("FAIRQ_PREEMPTION_MAX_PER_TEAM", "FAIRQ_PREEMPTION_MAX_PER_JOB"):
    if globals()[_name] < -1:
        raise environ.ImproperlyConfigured(f"{_name} must be >= -1")
for _name in ("FAIRQ_PREEMPTION_WINDOW_SECONDS", "FAIRQ_PREEMPTION_TERMINATION_GRACE_SECONDS",
              "FAIRQ_PREEMPTION_NOMINATION_SECONDS", "FAIRQ_PREEMPTION_MAX_SEARCHES"):
    if globals()[_name] < 0:
        raise environ.ImproperlyConfigured(f"{_name} must be >= 0")

# --- Web dashboard (docs/dashboard.md) -------------------------------------------------------
# HTMX for the live parts (request.htmx); htmx and uPlot are vendored under static/vendor/
# and served by whitenoise: no CDN, no network at run time.
INSTALLED_APPS.append("django_htmx")
MIDDLEWARE.insert(MIDDLEWARE.index("django.contrib.auth.middleware.AuthenticationMiddleware") + 1,
                  "django_htmx.middleware.HtmxMiddleware")
STATICFILES_DIRS = [BASE_DIR / "static"]
_template_options = TEMPLATES[0]["OPTIONS"]
assert isinstance(_template_options, dict)
_template_options["context_processors"].append("queueing.web.views.nav")
_template_options["context_processors"].append("accounts.sso.sso_context")
_template_options["libraries"] = {"fairq": "queueing.web.templatetags",
                                  "fairq_costs": "queueing.web.cost_tags"}
# Error pages (templates/403.html, 404.html, 500.html) replace Django's plain ones.

# Content-Security-Policy on every response (django-csp; docs/deployment.md,
# "Content-Security-Policy"). Scripts only from fairq's own static files: no inline
# script, no event-handler attribute, no eval (static/js/fairq.js binds what the pages
# did inline). Styles may be inline: the pages set computed widths in style attributes,
# and the admin's and Swagger UI's templates carry <style> blocks; CSS runs no script.
MIDDLEWARE.insert(MIDDLEWARE.index("django.middleware.security.SecurityMiddleware") + 1,
                  "csp.middleware.CSPMiddleware")
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": ["'self'"],
        "script-src": ["'self'"],
        "style-src": ["'self'", "'unsafe-inline'"],
        "img-src": ["'self'", "data:"],  # the favicon is `data:,`; Swagger UI's icons
        "connect-src": ["'self'"],  # htmx's requests, the job stream
        "font-src": ["'self'"],
        "object-src": ["'none'"],
        "base-uri": ["'self'"],
        "form-action": ["'self'"],  # single sign-on starts with a link, not a form
        "frame-ancestors": ["'none'"],  # as X-Frame-Options: DENY
    },
}

# --- Kubernetes backend (docs/kubernetes.md) ---------------------------------------------
# Team namespaces are <prefix><team slug>; fairq creates and labels them.
FAIRQ_KUBE_NAMESPACE_PREFIX = env("FAIRQ_KUBE_NAMESPACE_PREFIX", default="fairq-")
if FAIRQ_KUBE_NAMESPACE_PREFIX and not (
    len(FAIRQ_KUBE_NAMESPACE_PREFIX) <= 22 and FAIRQ_KUBE_NAMESPACE_PREFIX[0].isalnum()
    and FAIRQ_KUBE_NAMESPACE_PREFIX.endswith("-")
    and all(c in "abcdefghijklmnopqrstuvwxyz0123456789-" for c in FAIRQ_KUBE_NAMESPACE_PREFIX)
):
    raise environ.ImproperlyConfigured(
        "FAIRQ_KUBE_NAMESPACE_PREFIX must be a short DNS label prefix such as 'fairq-'")
# Image registries jobs may pull from ("ghcr.io/acme", "registry.example.com"); empty = any.
FAIRQ_REGISTRY_ALLOWLIST = env.list("FAIRQ_REGISTRY_ALLOWLIST", default=[])
if any(not _r or "://" in _r or " " in _r for _r in FAIRQ_REGISTRY_ALLOWLIST):
    raise environ.ImproperlyConfigured(
        "FAIRQ_REGISTRY_ALLOWLIST entries are registries or registry/path prefixes, no scheme")
# The most node-local scratch one `empty_dir` volume of a job may ask for (bytes; its
# size_limit). Default 1Ti.
FAIRQ_MAX_SCRATCH_BYTES = env.int("FAIRQ_MAX_SCRATCH_BYTES", default=2**40)
if not 1 <= FAIRQ_MAX_SCRATCH_BYTES <= 2**60:
    raise environ.ImproperlyConfigured("FAIRQ_MAX_SCRATCH_BYTES must be within 1..2**60 bytes")
# A failed pod fails the attempt (fairq requeues or not; Kubernetes does not retry).
FAIRQ_K8S_BACKOFF_LIMIT = env.int("FAIRQ_K8S_BACKOFF_LIMIT", default=0)
# Finished Jobs (and their pods' logs) are kept this long.
FAIRQ_K8S_TTL_AFTER_FINISHED_SECONDS = env.int("FAIRQ_K8S_TTL_AFTER_FINISHED_SECONDS",
                                               default=3600)
# A pod that cannot pull its image for this long fails its job.
FAIRQ_K8S_IMAGE_PULL_TIMEOUT_SECONDS = env.int("FAIRQ_K8S_IMAGE_PULL_TIMEOUT_SECONDS",
                                               default=300)
FAIRQ_K8S_TERMINATION_GRACE_SECONDS = env.int("FAIRQ_K8S_TERMINATION_GRACE_SECONDS", default=30)
# Rule R10: the longest termination grace period a job of a preemptible tier may have when
# the tier sets no cap of its own (Tier.max_termination_grace_seconds, which may raise or
# lower it): a preempted victim holds its GPUs for its grace period (docs/kubernetes.md).
FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS = env.int(
    "FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS", default=300)
if not 0 <= FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS <= 24 * 3600:
    raise environ.ImproperlyConfigured(
        "FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS must be within 0..86400")
# Every pod has a memory limit (= its request): a job that sets no memory, of a team with
# no default, gets this much per GPU of a replica, at most what the largest node of its
# GPU type can allocate (docs/kubernetes.md, "Memory, /dev/shm and CPU"). No CPU default:
# a CPU limit throttles (CFS quota) and CPU, unlike memory, is shared without killing.
FAIRQ_DEFAULT_MEMORY_PER_GPU = env("FAIRQ_DEFAULT_MEMORY_PER_GPU", default="32Gi")
try:
    _parse_bytes(FAIRQ_DEFAULT_MEMORY_PER_GPU)
except ValueError as _exc:
    raise environ.ImproperlyConfigured(
        f"FAIRQ_DEFAULT_MEMORY_PER_GPU must be a quantity of bytes such as 32Gi: {_exc}"
    ) from None
# A Job that has had no pod this long while the Job controller reports why it cannot
# create them (a FailedCreate event: a ResourceQuota or LimitRange refuses) fails its job;
# without such an event the job only shows as waiting for the cluster (a slow controller).
FAIRQ_K8S_POD_CREATE_TIMEOUT_SECONDS = env.int("FAIRQ_K8S_POD_CREATE_TIMEOUT_SECONDS",
                                               default=120)
# Who creates team namespaces, their ResourceQuota and the scheduler's RoleBinding in each,
# and the PriorityClasses: "separate" = only `manage.py sync_cluster` run as the
# fairq-provisioner service account (platform/k8s/base/rbac.yaml; the worker has no
# cluster-wide writes, a team's jobs wait until it is provisioned); "scheduler" = the
# worker itself on a team's first job (it then needs the provisioner's ClusterRole too).
FAIRQ_K8S_PROVISION = env("FAIRQ_K8S_PROVISION", default="separate")
if FAIRQ_K8S_PROVISION not in {"separate", "scheduler"}:
    raise environ.ImproperlyConfigured("FAIRQ_K8S_PROVISION must be 'separate' or 'scheduler'")
# The service account the provisioner binds in each team namespace ("namespace/name";
# empty = bind nothing, e.g. a scheduler running outside the cluster as a user).
FAIRQ_K8S_SCHEDULER_SERVICE_ACCOUNT = env("FAIRQ_K8S_SCHEDULER_SERVICE_ACCOUNT",
                                          default="fairq-system/fairq-scheduler")
if FAIRQ_K8S_SCHEDULER_SERVICE_ACCOUNT and FAIRQ_K8S_SCHEDULER_SERVICE_ACCOUNT.count("/") != 1:
    raise environ.ImproperlyConfigured(
        "FAIRQ_K8S_SCHEDULER_SERVICE_ACCOUNT must be 'namespace/name' or empty")
# The provisioner's service account ("namespace/name"), bound in each team namespace at
# bootstrap (`manage.py sync_cluster --bootstrap`): the only place it may label the
# namespace, set its quota and bind the scheduler (docs/kubernetes.md, "RBAC").
FAIRQ_K8S_PROVISIONER_SERVICE_ACCOUNT = env("FAIRQ_K8S_PROVISIONER_SERVICE_ACCOUNT",
                                            default="fairq-system/fairq-provisioner")
if FAIRQ_K8S_PROVISIONER_SERVICE_ACCOUNT and \
        FAIRQ_K8S_PROVISIONER_SERVICE_ACCOUNT.count("/") != 1:
    raise environ.ImproperlyConfigured(
        "FAIRQ_K8S_PROVISIONER_SERVICE_ACCOUNT must be 'namespace/name' or empty")
# Namespaces outside fairq's whose pods run on the GPU nodes too (comma-separated): their
# bound pods' GPUs, CPU and memory count against the nodes' capacity. The worker reads
# pods only in fairq's team namespaces and these, each allowed by a RoleBinding of the
# ClusterRole fairq-read-pods there (docs/kubernetes.md, "RBAC"); empty = none.
FAIRQ_K8S_OTHER_POD_NAMESPACES = env.list("FAIRQ_K8S_OTHER_POD_NAMESPACES", default=[])
if any(not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", _n)
       for _n in FAIRQ_K8S_OTHER_POD_NAMESPACES):
    raise environ.ImproperlyConfigured(
        "FAIRQ_K8S_OTHER_POD_NAMESPACES entries are namespace names (DNS-1123 labels)")
# An admitted job whose Job the API server keeps refusing (403: a namespace quota on
# Jobs, an RBAC denial) fails after this long, giving its GPUs back.
FAIRQ_K8S_SUBMIT_REFUSED_SECONDS = env.int("FAIRQ_K8S_SUBMIT_REFUSED_SECONDS", default=600)
# Pods labelled by fairq that no Job owns (deleted with orphan propagation) are deleted
# once they are this old.
FAIRQ_K8S_ORPHAN_POD_GRACE_SECONDS = env.int("FAIRQ_K8S_ORPHAN_POD_GRACE_SECONDS",
                                             default=30)
# Full relist of the watched objects, on top of the watches.
FAIRQ_K8S_RESYNC_SECONDS = env.int("FAIRQ_K8S_RESYNC_SECONDS", default=300)
for _name in ("FAIRQ_K8S_BACKOFF_LIMIT", "FAIRQ_K8S_TTL_AFTER_FINISHED_SECONDS",
              "FAIRQ_K8S_IMAGE_PULL_TIMEOUT_SECONDS", "FAIRQ_K8S_TERMINATION_GRACE_SECONDS",
              "FAIRQ_K8S_POD_CREATE_TIMEOUT_SECONDS", "FAIRQ_K8S_SUBMIT_REFUSED_SECONDS",
              "FAIRQ_K8S_ORPHAN_POD_GRACE_SECONDS"):
    if globals()[_name] < 0:
        raise environ.ImproperlyConfigured(f"{_name} must be >= 0")
if FAIRQ_K8S_RESYNC_SECONDS < 10:
    raise environ.ImproperlyConfigured("FAIRQ_K8S_RESYNC_SECONDS must be >= 10")
# How many Job creates the cycle keeps in flight at once (most of a create is waiting on
# the API server); 1 = one after the other.
FAIRQ_K8S_SUBMIT_CONCURRENCY = env.int("FAIRQ_K8S_SUBMIT_CONCURRENCY", default=8)
if not 1 <= FAIRQ_K8S_SUBMIT_CONCURRENCY <= 64:
    raise environ.ImproperlyConfigured("FAIRQ_K8S_SUBMIT_CONCURRENCY must be 1-64")

# Spot capacity on Kubernetes (docs/kubernetes.md, "Spot nodes"; rules K4, K6): a node
# carrying one of these labels (key=value, or a key for any value) is spot; a spot node on
# which one of these taints or labels (key or key=value) appears is being reclaimed, and
# its jobs are requeued at once (as when it is deleted). Defaults: the clouds' own (GKE,
# Karpenter, EKS, AKS; GKE's, aws-node-termination-handler's and Karpenter's termination
# taints) and fairq's `fairq.io/spot=true`, `fairq.io/reclaim`.
FAIRQ_SPOT_NODE_LABELS = env.list("FAIRQ_SPOT_NODE_LABELS", default=[
    "cloud.google.com/gke-spot=true", "cloud.google.com/gke-preemptible=true",
    "karpenter.sh/capacity-type=spot", "eks.amazonaws.com/capacityType=SPOT",
    "kubernetes.azure.com/scalesetpriority=spot", "fairq.io/spot=true"])
FAIRQ_SPOT_TERMINATION_TAINTS = env.list("FAIRQ_SPOT_TERMINATION_TAINTS", default=[
    "cloud.google.com/impending-node-termination", "aws-node-termination-handler/spot-itn",
    "karpenter.sh/disrupted", "karpenter.sh/disruption", "fairq.io/reclaim"])
# Taints that mark spot capacity (not its reclamation; same grammar, any effect): a spot
# node carrying only these is still used, and the pods of an attempt placed on spot
# tolerate them (rule K4); on-demand attempts do not. Default: AKS's spot pool taint. A
# key that is also a termination taint is refused.
FAIRQ_SPOT_TOLERATIONS = env.list("FAIRQ_SPOT_TOLERATIONS", default=[
    "kubernetes.azure.com/scalesetpriority=spot"])


def _check_spot_matches() -> None:
    """Parse the three spot settings at start-up (a typo would silently match nothing)."""
    from queueing.backends.k8s_api import parse_node_matches, spot_tolerations_problem

    parsed = {}
    for name in ("FAIRQ_SPOT_NODE_LABELS", "FAIRQ_SPOT_TERMINATION_TAINTS",
                 "FAIRQ_SPOT_TOLERATIONS"):
        try:
            parsed[name] = parse_node_matches(globals()[name], what=name)
        except ValueError as exc:
            raise environ.ImproperlyConfigured(str(exc)) from exc
    problem = spot_tolerations_problem(parsed["FAIRQ_SPOT_TOLERATIONS"],
                                       parsed["FAIRQ_SPOT_TERMINATION_TAINTS"])
    if problem:
        raise environ.ImproperlyConfigured(problem)


_check_spot_matches()

# Cost and budgets (docs/scheduling.md, rules C1 and B1-B3): the currency of GpuPrice and
# TeamBudget amounts (an ISO 4217 code, shown next to every amount).
FAIRQ_CURRENCY = env.str("FAIRQ_CURRENCY", default="EUR").strip().upper()
if not (len(FAIRQ_CURRENCY) == 3 and FAIRQ_CURRENCY.isalpha() and FAIRQ_CURRENCY.isascii()):
    raise environ.ImproperlyConfigured("FAIRQ_CURRENCY must be a three-letter ISO 4217 code, e.g. EUR")
CELERY_BEAT_SCHEDULE["budgets-check"] = {
    "task": "queueing.tasks.budgets_check_task",
    "schedule": timedelta(minutes=5),
    "options": {"expires": 300},
}
CELERY_BEAT_SCHEDULE["usage-days-roll-up"] = {
    "task": "queueing.tasks.usage_days_roll_up_task",
    "schedule": timedelta(minutes=10),
    "options": {"expires": 600},
}

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
CELERY_BEAT_SCHEDULE["webhook-deliveries-purge"] = {
    "task": "queueing.tasks.webhook_deliveries_purge_task",
    "schedule": timedelta(hours=1),
    "options": {"expires": 3600},
}
CELERY_BEAT_SCHEDULE["webhooks-due"] = {
    "task": "queueing.tasks.webhooks_due_task",
    "schedule": timedelta(seconds=FAIRQ_WEBHOOK_SWEEP_SECONDS),
    "options": {"expires": FAIRQ_WEBHOOK_SWEEP_SECONDS},
}
