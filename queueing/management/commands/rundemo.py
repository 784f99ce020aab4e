"""One process for `make demo`: the web app in a thread (uvicorn serving config/asgi.py,
so a notebook session opens with its WebSockets, as the web pods' `/sessions/` does), a
Celery worker with embedded beat on the in-memory broker in the main thread, the
simulated cluster."""

from __future__ import annotations

import os
import threading
import time
import warnings
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser

from accounts.models import ApiToken
from accounts.services import token_issue
from queueing.models import Cluster
from queueing.services.demo import DEMO_PASSWORD, TEAMS


class Command(BaseCommand):
    help = "Serve the demo: web app, in-process worker and beat, simulated cluster."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
        parser.add_argument("--host", default=os.environ.get("HOST", "127.0.0.1"))

    def handle(self, *args: Any, **options: Any) -> None:
        if not settings.CELERY_BROKER_URL.startswith("memory://"):
            self.stderr.write("rundemo wants the demo settings (config.settings.demo).")
        host, port = options["host"], options["port"]
        alice = get_user_model().objects.get(username="alice")
        ApiToken.objects.filter(user=alice, name="demo").delete()
        key = token_issue(user=alice, name="demo").key

        web = _web_server(host, port)
        threading.Thread(target=web.run, name="web", daemon=True).start()
        while not web.started:  # the banner below once the port is bound
            time.sleep(0.05)
        url = f"http://{host}:{port}/"
        people = sorted({u for *_, ppl in TEAMS for u, _ in ppl})
        self.stdout.write(self.style.SUCCESS(f"\nfairq demo is up: {url}\n"))
        self.stdout.write(f"  logins (password '{DEMO_PASSWORD}'): admin (staff), "
                          + ", ".join(people))
        self.stdout.write(f"  API token for alice (team vision): {key}")
        for c in Cluster.objects.filter(enabled=True):
            self.stdout.write(f"  cluster {c.name} (cost rank {c.cost_rank}): {c.sim_nodes}")
        self.stdout.write(f"  try: curl -H 'Authorization: Token {key}' {url}api/v1/fairshare/")
        self.stdout.write("  more tokens: .venv/bin/python manage.py issue_token USERNAME")
        log_file = getattr(settings, "FAIRQ_DEMO_LOG", "")
        if log_file:
            self.stdout.write(f"  log: {_shown(log_file)} (this console shows warnings and "
                              "errors only)")
        self.stdout.write("")

        from celery import beat
        from celery.exceptions import SecurityWarning
        from celery.signals import setup_logging, worker_ready

        from config.celery import app

        # The banner above stays on screen: Celery leaves LOGGING (config/settings/demo.py:
        # INFO to the log file, warnings to the console) as it is (a receiver of
        # `setup_logging` tells it so), prints no banner of its own (`--quiet`), and does
        # not warn about root: a demo run as root (a container) is one process serving
        # itself, its tasks JSON only (CELERY_ACCEPT_CONTENT; with pickle Celery refuses root).
        setup_logging.connect(_keep_django_logging, weak=False)
        warnings.filterwarnings("ignore", category=SecurityWarning,
                                message=r"You're running the worker with superuser")

        # Celery beat in this process, started once the worker consumes: beat embedded
        # with `--beat` publishes to an in-memory queue the solo worker never reads.
        def start_beat(**_: Any) -> None:
            threading.Thread(target=beat.Service(app).start, name="beat", daemon=True).start()

        worker_ready.connect(start_beat, weak=False)
        # Webhook tries (docs/webhooks.md) on their own consumer: the solo worker below
        # runs the scheduler cycles, which never wait for a receiver.
        webhooks = app.WorkController(
            app=app, hostname="webhooks@demo", pool_cls="solo",
            queues=[settings.FAIRQ_WEBHOOK_QUEUE], without_heartbeat=True,
            without_mingle=True, without_gossip=True, loglevel="INFO")
        threading.Thread(target=webhooks.start, name="webhooks", daemon=True).start()
        app.worker_main([
            "--quiet", "worker", "--pool=solo", "--loglevel=INFO", "--without-gossip",
            "--without-mingle", "--without-heartbeat", "-Q", app.conf.task_default_queue,
        ])


def _web_server(host: str, port: int) -> Any:
    """uvicorn serving settings.ASGI_APPLICATION (config/asgi.py: Django over ASGI, and
    the notebook proxy's WebSockets), found the way Django finds WSGI_APPLICATION. Its
    logging is LOGGING's (no dictConfig of its own): request lines to the demo log,
    warnings to the console. Signals stay the worker's (main thread)."""
    import uvicorn
    from django.utils.module_loading import import_string

    application = import_string(settings.ASGI_APPLICATION)

    return uvicorn.Server(uvicorn.Config(
        application, host=host, port=port, log_config=None, lifespan="on",
        ws="websockets-sansio", ws_max_size=64 * 1024 * 1024, server_header=False))


def _keep_django_logging(**_: Any) -> None:
    """Celery's `setup_logging` signal: with a receiver, Celery configures no logging."""


def _shown(path: str) -> str:
    """The log file as the banner names it: relative to the current directory if in it."""
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel
