from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from queueing.services.demo import (
    demo_clusters_seed,
    demo_history_seed,
    demo_reservation_seed,
    demo_seed,
    demo_session_seed,
)


class Command(BaseCommand):
    help = ("Create the demo teams, users, GPU types, tiers and quotas, its three simulated "
            "clusters, a few days of finished jobs (usage and GPU activity) when no usage is "
            "recorded, GPU prices and two team budgets where none are set, dave's notebook "
            "session when he has none and alice's weekly booking of 8 h100 when there is none "
            "(idempotent).")

    def handle(self, *args: Any, **options: Any) -> None:
        logins = demo_seed()
        clusters = demo_clusters_seed()
        history = demo_history_seed(now=timezone.now())
        session = demo_session_seed(now=timezone.now())
        booking = demo_reservation_seed(now=timezone.now())
        names = ", ".join(f"{c.name} (rank {c.cost_rank})" for c in clusters)
        done = [f"{len(logins)} logins", f"clusters {names}"]
        if history.jobs:
            done.append(f"{history.jobs} finished jobs of the last days (usage, GPU activity)")
        if history.prices:
            done.append(f"{history.prices} GPU prices")
        if history.budgets:
            done.append(f"{history.budgets} team budgets")
        if session is not None:
            done.append(f"dave's notebook session {session}")
        if booking is not None:
            done.append(f"alice's weekly booking {booking} of 8 h100")
        self.stdout.write(self.style.SUCCESS(f"Demo data ready: {', '.join(done)}."))
