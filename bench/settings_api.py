"""Settings of the API bench's gunicorn (bench/bench_api.py): the test settings (no
Celery broker, no scheduler kicks: the web path alone) with production's persistent
database connections."""

from __future__ import annotations

from config.settings.test import *  # noqa: F403

DEBUG = False
CONN_MAX_AGE = 60
DATABASES["default"]["CONN_MAX_AGE"] = 60  # noqa: F405
