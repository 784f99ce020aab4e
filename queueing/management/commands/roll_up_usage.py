"""`manage.py roll_up_usage`: add every usage record not yet in the reports page's
roll-up (after an import, or to catch up without the beat task)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand
from django.utils import timezone

from queueing.services.reports import usage_days_roll_up


class Command(BaseCommand):
    help = "Roll the usage records up into GPU-hours per UTC day, team and GPU type."

    def handle(self, *args: Any, **options: Any) -> None:
        total = 0
        while n := usage_days_roll_up(now=timezone.now()):
            total += n
        self.stdout.write(f"rolled up {total} usage record(s)")
