"""`manage.py fairshare [--json] [--at ISO-8601] [--recompute]`: the fair-share standings
like Slurm's `sshare` (docs/scheduling.md, rules F1-F4)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone

from queueing.instants import InstantError, parse_instant
from queueing.selectors.fairshare import (
    fairshare_standings_at,
    half_life_hours,
    standing_as_dict,
    standings_sorted,
)
from queueing.services.fairshare import fairshare_recompute


def _instant(value: str) -> datetime:
    """`--at`, read like the API's `?at=` (in UTC; an offset required)."""
    try:
        return parse_instant(value)
    except InstantError as exc:
        raise CommandError(f"--at {value!r}: {exc}") from None


class Command(BaseCommand):
    help = ("Print every team's fair-share standing (team, parent, weight, share S, decayed "
            "usage, U, F) as of now or --at, like Slurm's sshare.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON (the API's fields).")
        parser.add_argument("--at", help="ISO 8601 instant with an offset (default: now).")
        parser.add_argument(
            "--recompute", action="store_true",
            help="Recompute every team's accumulator from the raw usage records first "
                 "(repair; scans the whole history) and report how far they were off.")

    def handle(self, *args: Any, **options: Any) -> None:
        now = timezone.now()
        at = _instant(options["at"]) if options["at"] else now
        recompute = None
        if options["recompute"]:
            recompute = fairshare_recompute(now=now)
        standings = standings_sorted(fairshare_standings_at(at=at, now=now))
        if options["json"]:
            doc: dict[str, Any] = {
                "as_of": at.isoformat(),
                "half_life_hours": half_life_hours(),
                "teams": [standing_as_dict(s) for s in standings],
            }
            if recompute is not None:
                doc["recompute"] = {"teams": recompute.teams, "seconds": recompute.seconds,
                                    "max_abs_diff": recompute.max_abs_diff,
                                    "max_rel_diff": recompute.max_rel_diff}
            self.stdout.write(json.dumps(doc, indent=2))
            return
        if recompute is not None:
            self.stdout.write(
                f"recomputed {recompute.teams} accumulators from the raw usage in "
                f"{recompute.seconds:.3f} s; largest difference from the stored ones "
                f"{recompute.max_abs_diff:.6g} GPU-h (relative {recompute.max_rel_diff:.3g})")
        self.stdout.write(f"as_of {at.isoformat()}  (half-life {half_life_hours():g} h)")
        header = (f"{'team':<24} {'parent':<16} {'weight':>8} {'share S':>9} "
                  f"{'usage GPU-h':>13} {'U':>9} {'F':>9}")
        self.stdout.write(header)
        self.stdout.write("-" * len(header))
        for s in standings:
            depth = 0
            p = s.parent
            by_team = {x.team: x for x in standings}
            while p is not None and p in by_team and depth < 32:
                depth += 1
                p = by_team[p].parent
            name = (" " * depth + s.team)[:24]
            self.stdout.write(
                f"{name:<24} {s.parent or '-':<16} {s.weight:>8g} {s.share:>9.4f} "
                f"{s.usage:>13.3f} {s.normalized_usage:>9.4f} {s.factor:>9.4f}"
                + ("" if s.active else "  (inactive)"))
