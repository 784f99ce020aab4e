"""`manage.py export_costs [FILE.csv] --month 2026-10`: cost per team (or department) and
day or month as finance's CSV (the columns of GET /api/v1/costs/?format=csv)."""

from __future__ import annotations

import sys
from datetime import UTC, date, datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from accounts.models import Team
from queueing.instants import InstantError, parse_instant
from queueing.selectors.costs import PERIODS, by_department, cost_buckets, costs_write_csv, month_range


class Command(BaseCommand):
    help = ("Write cost per team and period as CSV (rules C1-C4, spot GPU-hours and cost "
            "apart); '-' = stdout. The range: --month YYYY-MM, or --from/--to ISO 8601 "
            "instants (default: this UTC month).")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", nargs="?", default="-")
        parser.add_argument("--month", help="a UTC calendar month, YYYY-MM")
        parser.add_argument("--from", dest="start", help="ISO 8601 instant with an offset")
        parser.add_argument("--to", dest="end", help="ISO 8601 instant with an offset")
        parser.add_argument("--period", choices=PERIODS, default="day")
        parser.add_argument("--group", choices=["team", "department"], default="team")
        parser.add_argument("--team", action="append", help="only this team (repeatable)")

    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        start, end = self._range(options, now)
        teams = Team.objects.all()
        if options["team"]:
            teams = teams.filter(slug__in=options["team"])
            missing = set(options["team"]) - set(teams.values_list("slug", flat=True))
            if missing:
                raise CommandError(f"no such team(s): {', '.join(sorted(missing))}")
        buckets = cost_buckets(teams=teams, start=start, end=end, period=options["period"],
                               now=now)
        if options["group"] == "department":
            buckets = by_department(buckets)
        path = options["file"]
        if path == "-":
            costs_write_csv(out=sys.stdout, buckets=buckets)
            return
        try:
            with open(path, "w", newline="", encoding="utf-8") as f:
                n = costs_write_csv(out=f, buckets=buckets)
        except OSError as exc:
            raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from None
        self.stdout.write(f"exported {n} cost row(s) to {path}")

    @staticmethod
    def _range(options: dict[str, Any], now: datetime) -> tuple[datetime, datetime]:
        if options["month"]:
            if options["start"] or options["end"]:
                raise CommandError("--month or --from/--to, not both")
            try:
                first = datetime.strptime(options["month"], "%Y-%m").replace(tzinfo=UTC).date()
            except ValueError:
                raise CommandError(f"bad --month {options['month']!r}: use YYYY-MM") from None
            return month_range(first)
        try:
            start = parse_instant(options["start"]) if options["start"] else None
            end = parse_instant(options["end"]) if options["end"] else now
        except InstantError as exc:
            raise CommandError(f"bad --from/--to: {exc}") from None
        if start is None:
            start = month_range(date(now.year, now.month, 1))[0]
        if start >= end:
            raise CommandError("--from must be before --to")
        return start, end
