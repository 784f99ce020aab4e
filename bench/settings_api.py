"""Settings of the API bench's gunicorn (bench/bench_api.py): the test settings (no
Celery broker, no scheduler kicks: the web path alone) with production's persistent
database connections; the cache (rate limits) is Redis when REDIS_URL is set, as in
production (bench_api.py sets it when a local Redis answers)."""

from __future__ import annotations

import os

from config.settings.test import *  # noqa: F403

DEBUG = False
CONN_MAX_AGE = 60
DATABASES["default"]["CONN_MAX_AGE"] = 60  # noqa: F405

# The Django floor of bench_api.py swaps the URLs for bench/floor_app.py.
ROOT_URLCONF = os.environ.get("FAIRQ_BENCH_URLCONF", ROOT_URLCONF)  # noqa: F405

# One cache for all of gunicorn's workers: the test settings' prefix carries the process
# id (one per test process), which here would give every worker its own rate limits and
# its own copy of the shared plan. The workers' parent is the gunicorn master: one prefix
# per bench run, shared by its workers.
if CACHES["default"]["BACKEND"] == "django_redis.cache.RedisCache":  # noqa: F405
    CACHES["default"]["KEY_PREFIX"] = f"fairq-bench-{os.getppid()}"  # noqa: F405
