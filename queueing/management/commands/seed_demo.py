from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from queueing.services.demo import demo_seed


class Command(BaseCommand):
    help = "Create the demo teams, users, GPU types, tiers and quotas (idempotent)."

    def handle(self, *args: Any, **options: Any) -> None:
        logins = demo_seed()
        self.stdout.write(self.style.SUCCESS(f"Demo data ready: {len(logins)} logins."))
