"""`manage.py history_prune [--dry-run]`: archive, then delete, the finished jobs, usage
records and utilization samples older than their retention (docs/deployment.md,
"History retention"), as the hourly beat task does; print per table what went (or,
with --dry-run, what would go: nothing is written)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from queueing.services.history import history_prune, retention


class Command(BaseCommand):
    help = "Archive, then delete, history older than its retention (FAIRQ_*_RETENTION_DAYS)."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--dry-run", action="store_true",
                            help="Print what would be archived and deleted; change nothing.")

    def handle(self, *args: Any, **options: Any) -> None:
        dry = bool(options["dry_run"])
        for name, days in retention().items():
            self.stdout.write(f"{name}={days:g}" + (" (kept for ever)" if days <= 0 else ""))
        self.stdout.write(f"archive storage: {settings.STORAGES['fairq-history']['BACKEND']}")
        result = history_prune(now=timezone.now(), dry_run=dry,
                               actor_label="manage.py history_prune")
        if result.skipped:
            raise CommandError("another history prune is running; nothing done")
        if not result.tables:
            self.stdout.write("nothing to prune")
        for table, t in result.tables.items():
            span = f"{t.days[0]}..{t.days[-1]}" if t.days else "-"
            if dry:
                self.stdout.write(f"{table}: would archive and delete {t.rows} row(s) "
                                  f"of {len(set(t.days))} day(s) ({span})")
            else:
                self.stdout.write(f"{table}: archived {t.archived}, deleted {t.deleted} "
                                  f"row(s) of {len(set(t.days))} day(s) ({span})")
                for name in t.files:
                    self.stdout.write(f"  {name}")
        if result.run is not None:
            self.stdout.write(f"recorded as history prune run {result.run.pk}")
