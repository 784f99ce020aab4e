"""Settings shared by every environment. Everything deployment-specific comes from the
environment (django-environ); a bad value fails at start-up, not at first use.

Django's own settings are here; fairq's (`FAIRQ_*`) are grouped by area in the modules
imported below, each setting with its default, its check and its reason beside it
(docs/deployment.md, "Settings", lists them all in one table)."""

from __future__ import annotations

from typing import Any

from . import api, bookings, clusters, history, logs, policy, scheduler, sessions, webhooks
from .api import *  # noqa: F403
from .auth import *  # noqa: F403
from .auth import FAIRQ_OIDC_ENABLED
from .bookings import *  # noqa: F403
from .clusters import *  # noqa: F403
from .environment import BASE_DIR, env
from .history import *  # noqa: F403
from .history import FAIRQ_HISTORY_STORAGE_BACKEND, FAIRQ_HISTORY_STORAGE_OPTIONS
from .kubernetes import *  # noqa: F403
from .logs import *  # noqa: F403
from .logs import FAIRQ_LOG_STORAGE_BACKEND, FAIRQ_LOG_STORAGE_OPTIONS
from .policy import *  # noqa: F403
from .scheduler import *  # noqa: F403
from .sessions import *  # noqa: F403
from .webhooks import *  # noqa: F403

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

LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

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
# Every periodic task, from the areas that own them.
CELERY_BEAT_SCHEDULE: dict[str, dict[str, Any]] = {
    **scheduler.beat, **policy.beat, **clusters.beat, **logs.beat, **webhooks.beat,
    **api.beat, **sessions.beat, **bookings.beat, **history.beat,
}

# Kept job logs (config/settings/logs.py; docs/deployment.md, "Log storage").
STORAGES["fairq-logs"] = {"BACKEND": FAIRQ_LOG_STORAGE_BACKEND,
                          "OPTIONS": FAIRQ_LOG_STORAGE_OPTIONS}
# The archive of pruned history (config/settings/history.py; docs/deployment.md,
# "History retention").
STORAGES["fairq-history"] = {"BACKEND": FAIRQ_HISTORY_STORAGE_BACKEND,
                             "OPTIONS": FAIRQ_HISTORY_STORAGE_OPTIONS}

# --- Login throttling and single sign-on (config/settings/auth.py) -------------------------
INSTALLED_APPS.append("axes")
MIDDLEWARE.insert(1, "accounts.client_ip.ClientIpMiddleware")  # before anything audits
MIDDLEWARE.append("axes.middleware.AxesMiddleware")  # after authentication
AUTHENTICATION_BACKENDS = [
    "accounts.backends.LoginThrottleBackend",
    "django.contrib.auth.backends.ModelBackend",
]
if FAIRQ_OIDC_ENABLED:
    AUTHENTICATION_BACKENDS.append("accounts.sso_backend.FairqOIDCBackend")

# --- API v1 (docs/api.md; config/settings/api.py) --------------------------------------------
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
                            "ClusterStateEnum": "queueing.selectors.clusters.CLUSTER_STATES",
                            "FlavorFallbackEnum": "queueing.models.FLAVOR_FALLBACK_CHOICES"},
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "queueing.api.schema.add_errors_and_idempotency",
    ],
})
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
