from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from queueing.services.demo import demo_clusters_seed, demo_history_seed, demo_seed


class Command(BaseCommand):
    help = ("Create the demo teams, users, GPU types, tiers and quotas, its three simulated "
            "clusters, and a few days of usage history when none is recorded (idempotent).")

    def handle(self, *args: Any, **options: Any) -> None:
        logins = demo_seed()
        clusters = demo_clusters_seed()
        rows = demo_history_seed(now=timezone.now())
        history = f", {rows} usage records of the last days" if rows else ""
        names = ", ".join(f"{c.name} (rank {c.cost_rank})" for c in clusters)
        self.stdout.write(self.style.SUCCESS(
            f"Demo data ready: {len(logins)} logins, clusters {names}{history}."))
