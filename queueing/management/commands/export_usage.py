"""`manage.py export_usage [FILE.csv]`: the usage records as the CSV `import_usage` reads."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from queueing.selectors.usage import usage_export_csv


class Command(BaseCommand):
    help = "Write every usage record as CSV (team, gpu_type, gpus, start, end); '-' = stdout."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", nargs="?", default="-")
        parser.add_argument("--source", choices=["import", "scheduler"], default=None)

    def handle(self, *args: Any, **options: Any) -> None:
        path = options["file"]
        if path == "-":
            usage_export_csv(out=sys.stdout, source=options["source"])
            return
        try:
            with open(path, "w", newline="", encoding="utf-8") as f:
                n = usage_export_csv(out=f, source=options["source"])
        except OSError as exc:
            raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from None
        self.stdout.write(f"exported {n} usage record(s) to {path}")
