"""`manage.py wait_for_migrations [--timeout S]`: return once every migration is applied.

The init container of fairq's pods (platform/k8s/base): a new release's web, worker and
beat pods start only after its `fairq-migrate-<tag>` Job has migrated the database, so new
code never runs on the old schema. Exits 0 when nothing is pending (at once on a re-run),
1 when migrations are still pending or the database unreachable after --timeout seconds.
It never migrates: exactly one Job per release does."""

from __future__ import annotations

import time
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueing.health import pending_migrations


class Command(BaseCommand):
    help = "Wait until the database has every migration applied (never applies any)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--timeout", type=float, default=600.0,
                            help="give up after this many seconds (default 600)")
        parser.add_argument("--interval", type=float, default=3.0,
                            help="seconds between checks (default 3)")

    def handle(self, *args: Any, **options: Any) -> None:
        timeout, interval = float(options["timeout"]), float(options["interval"])
        if timeout < 0 or interval <= 0:
            raise CommandError("--timeout must be >= 0 and --interval > 0")
        deadline = time.monotonic() + timeout
        last = ""
        while True:
            try:
                pending = pending_migrations()
                state = (f"{len(pending)} migration(s) pending, first {pending[0]}"
                         if pending else "")
            except Exception as exc:  # the database may come up after this pod
                pending, state = ["?"], f"database not reachable: {type(exc).__name__}: {exc}"
            if not pending:
                self.stdout.write("migrations: all applied")
                return
            if state != last:
                self.stdout.write(f"waiting: {state}")
                last = state
            if time.monotonic() >= deadline:
                raise CommandError(f"gave up after {timeout:g}s: {state}")
            time.sleep(interval)
