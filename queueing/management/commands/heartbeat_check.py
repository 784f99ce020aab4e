"""`manage.py heartbeat_check worker|beat`: the liveness probe of the worker and beat pods.

Exits 0 when this pod's heartbeat for the role (queueing/health.py) is younger than
FAIRQ_SCHEDULER_STALE_CYCLES cycle intervals, 1 otherwise (stale, or never touched:
the probe's initialDelaySeconds covers start-up). The worker touches it after every
scheduler tick it ran, beat after every tick it sent (config/celery.py)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueing.health import ROLES, heartbeat_age, heartbeat_path, heartbeat_stale_after_seconds


class Command(BaseCommand):
    help = "Exit non-zero when this pod's worker or beat heartbeat is stale."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("role", choices=ROLES)

    def handle(self, *args: Any, **options: Any) -> None:
        role = options["role"]
        age, limit = heartbeat_age(role), heartbeat_stale_after_seconds()
        if age is None:
            raise CommandError(f"{role}: no heartbeat yet ({heartbeat_path(role)})")
        if age > limit:
            raise CommandError(f"{role}: last heartbeat {age:.0f}s ago (limit {limit:g}s)")
        self.stdout.write(f"{role}: last heartbeat {age:.1f}s ago (limit {limit:g}s)")
