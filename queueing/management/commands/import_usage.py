"""`manage.py import_usage FILE.csv`: historical GPU usage from another scheduler
(docs/scheduling.md, rule F1). All or nothing: bad rows are listed with their line numbers
and nothing is imported."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from queueing.services.usage import UsageImportError, usage_import_csv


class Command(BaseCommand):
    help = ("Import usage from a CSV with the columns team, gpu_type, gpus, start, end "
            "(ISO 8601 instants with an offset; '-' reads standard input). All or nothing.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file")

    def handle(self, *args: Any, **options: Any) -> None:
        path = options["file"]
        try:
            if path == "-":
                import sys

                n = usage_import_csv(stream=sys.stdin, now=timezone.now())
            else:
                with open(path, newline="", encoding="utf-8-sig") as f:
                    n = usage_import_csv(stream=f, now=timezone.now())
        except OSError as exc:
            raise CommandError(f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise CommandError(f"{path} is not UTF-8 text ({exc.reason} at byte "
                               f"{exc.start}); nothing imported") from None
        except UsageImportError as exc:
            raise CommandError(f"{path}: {exc}") from None
        self.stdout.write(f"imported {n} usage record(s) from {path}")
