"""`make demo`: one process serves the web app and runs a Celery worker with embedded beat
on an in-memory broker, against the simulated cluster, with synthetic load."""

from __future__ import annotations

from .dev import *  # noqa: F403
from .dev import env

CELERY_BROKER_URL = "memory://"
# The demo's beat keeps its schedule in memory: no database scheduler, no shelve file.
CELERY_BEAT_SCHEDULER = "celery.beat:Scheduler"
FAIRQ_CLUSTER_BACKEND = "simulated"
FAIRQ_DEMO_LOAD = env.bool("FAIRQ_DEMO_LOAD", default=True)
FAIRQ_SIM_DEFAULT_SECONDS = env.float("FAIRQ_SIM_DEFAULT_SECONDS", default=20.0)
CELERY_BEAT_SCHEDULE = {
    **CELERY_BEAT_SCHEDULE,  # noqa: F405
    "demo-load": {"task": "queueing.tasks.demo_load_task", "schedule": 5.0,
                  "options": {"expires": 10}},
}
