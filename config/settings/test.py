"""pytest: fast hashing, eager Celery, no scheduler kicks; PostgreSQL/Redis when their URLs
are set (CI), SQLite and local memory otherwise."""

from __future__ import annotations

import tempfile as _tempfile

from .base import *  # noqa: F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
CELERY_TASK_ALWAYS_EAGER = True
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = True
CELERY_BROKER_URL = "memory://"
FAIRQ_KICK_SCHEDULER = False
FAIRQ_CLUSTER_BACKEND = "simulated"
FAIRQ_SIM_NODES = "2x8xh100,2x8xa100,1x7xmig-1g-10gb"
# A stopped simulated job frees its GPUs at once (the graceful stop's tests set a time).
FAIRQ_SIM_STOP_SECONDS = 0.0
# No local `jupyter lab` per simulated session: the tests that want one start it.
FAIRQ_SIM_NOTEBOOKS = False
# Redis when REDIS_URL is set (CI), with a per-process key prefix so parallel runs and
# other users of the server never see each other's keys; local memory otherwise.
if REDIS_URL:  # noqa: F405
    import os as _os

    CACHES = {"default": {"BACKEND": "django_redis.cache.RedisCache",
                          "LOCATION": REDIS_URL,  # noqa: F405
                          "KEY_PREFIX": f"fairq-test-{_os.getpid()}"}}
else:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    # Kept job logs (services/logs.py) go to a directory of this test run.
    "fairq-logs": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                   "OPTIONS": {"location": _tempfile.mkdtemp(prefix="fairq-logs-test-")}},
    # The archive of pruned history (services/history.py), likewise.
    "fairq-history": {"BACKEND": "django.core.files.storage.FileSystemStorage",
                      "OPTIONS": {"location": _tempfile.mkdtemp(prefix="fairq-history-test-")}},
}
# The webhook tests' receiver listens on 127.0.0.1 (tests/webhooks/).
FAIRQ_WEBHOOK_ALLOW_PRIVATE = True
# The envtest fake kubelet serves no logs (every read is unanswered): stops do not wait
# for a read that never comes; the tests of that wait set it (test_k8s_logs_every_end.py).
FAIRQ_LOG_KEEP_RETRY_SECONDS = 0.0
