"""`make demo`: one process serves the web app and runs a Celery worker with embedded beat
on an in-memory broker, against the simulated cluster, with synthetic load."""

from __future__ import annotations

from .clusters import _check_sim_nodes
from .dev import *  # noqa: F403
from .environment import BASE_DIR, env
from .logs import FAIRQ_LOG_FORMAT, logging_config

# The demo shows fairq's own 404, 403 and 500 pages (templates/), not Django's debug page
# (which lists every URL and overflows a phone): DEBUG is off unless DJANGO_DEBUG=1.
# Static files still come from whitenoise's finders (dev.py); a server error's traceback
# goes to the console log (LOGGING's root handler), not the browser.
DEBUG = env.bool("DJANGO_DEBUG", default=False)

# The h100 nodes in racks of two (rule A7: a job may keep its replicas in one rack; the
# demo's h100 GpuType names the level, queueing/services/demo.py).
FAIRQ_SIM_NODES = env("FAIRQ_SIM_NODES", default="4x8xh100@rack=2,4x8xa100,2x7xmig-1g-10gb,2x4xt4-shared")
_check_sim_nodes(FAIRQ_SIM_NODES)

# A host in the URL: without one kombu warns "No hostname was supplied" at each connect.
CELERY_BROKER_URL = "memory://localhost/"
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
# Webhook tries are on their own queue (FAIRQ_WEBHOOK_QUEUE, base.py), served by a second
# consumer in the demo process (rundemo), so a slow receiver never delays a scheduler
# cycle (docs/webhooks.md).

# The console keeps the banner `rundemo` prints (URL, logins, token) on screen: only
# warnings and errors go there; everything (the worker's and beat's INFO lines, requests)
# goes to FAIRQ_DEMO_LOG, which the banner names (default demo.log beside manage.py,
# gitignored).
FAIRQ_DEMO_LOG = env("FAIRQ_DEMO_LOG", default=str(BASE_DIR / "demo.log"))
LOGGING = logging_config(FAIRQ_LOG_FORMAT)
LOGGING["handlers"] = {
    "console": {**LOGGING["handlers"]["console"], "level": "WARNING"},
    # Rotated at 10 MB, two old files kept (demo.log.1, demo.log.2): a demo left running
    # for days must not fill the disk with INFO lines. One process writes it (rundemo
    # runs the web, worker and beat in one), as rotation needs.
    "file": {"class": "logging.handlers.RotatingFileHandler", "filename": FAIRQ_DEMO_LOG,
             "delay": True, "maxBytes": 10 * 1024 * 1024, "backupCount": 2,
             "formatter": FAIRQ_LOG_FORMAT, "filters": ["context"]},
}
LOGGING["root"]["handlers"] = ["console", "file"]
# The web server's request lines (Django's own "django.server" handler writes them to the
# console otherwise).
LOGGING["loggers"]["django.server"] = {"handlers": ["file"], "level": "INFO",
                                       "propagate": False}
