"""Fair-share writes (docs/scheduling.md, rule F1): the full recompute of every team's
accumulator from the raw usage records, and the standings snapshots the charts read.
Both scan or store history: for repair, audit, the command line and a periodic task,
never a scheduling cycle. The reads are in queueing/selectors/fairshare.py.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction

from queueing.models import FairShareAccumulator, FairShareSnapshot
from queueing.policy.fairshare import Accumulator
from queueing.selectors.fairshare import (
    fairshare_standings,
    fairshare_standings_at,
    half_life_hours,
    raw_decayed_usage,
)


@dataclass(frozen=True, slots=True)
class RecomputeResult:
    teams: int
    max_abs_diff: float  # between the accumulators before and the recompute, GPU-hours
    max_rel_diff: float
    seconds: float
    written: bool


def fairshare_recompute(*, now: datetime, write: bool = True) -> RecomputeResult:
    """Rule F1 from scratch: every team's accumulator recomputed from the raw usage
    records as of `now`, compared with the stored one and (with `write`) replaced.

    Runs in one transaction holding every accumulator row lock, so a usage record
    charged meanwhile waits and is added on top of the recomputed value.
    """
    t0 = time.perf_counter()
    h = half_life_hours()
    with transaction.atomic():
        # Locked in team order, the order usage_import_csv locks them in: no deadlock.
        stored = {a.team_id: a for a in
                  FairShareAccumulator.objects.select_for_update().order_by("team_id")}
        raw = raw_decayed_usage(at=now)
        max_abs = max_rel = 0.0
        for team_id in set(stored) | set(raw):
            old = stored.get(team_id)
            before = Accumulator(old.value, old.as_of).at(now, h) if old is not None else 0.0
            after = raw.get(team_id, 0.0)
            diff = abs(before - after)
            max_abs = max(max_abs, diff)
            if max(abs(before), abs(after)) > 0:
                max_rel = max(max_rel, diff / max(abs(before), abs(after)))
        if write:
            _accumulators_set(stored, raw, now)
            FairShareAccumulator.objects.bulk_create(
                [FairShareAccumulator(team_id=t, value=v, as_of=now)
                 for t, v in raw.items() if t not in stored],
                batch_size=1000,
            )
    return RecomputeResult(teams=len(set(stored) | set(raw)), max_abs_diff=max_abs,
                           max_rel_diff=max_rel, seconds=time.perf_counter() - t0,
                           written=write)


def _accumulators_set(stored: Mapping[int, FairShareAccumulator], raw: Mapping[int, float],
                      now: datetime) -> None:
    """Set every stored accumulator to its recomputed value as of `now`: one UPDATE per
    team, sent as one batch (`executemany`, pipelined by psycopg), on every database.
    (`bulk_update`'s CASE chains took 2.4 s for 1,003 teams on PostgreSQL, this 0.5 s;
    an `unnest` of PostgreSQL's own 35 ms, not worth a second path in an operator's
    command: docs/performance.md, "PostgreSQL's own statements against portable
    ones".)"""
    if not stored:
        return
    table = connection.ops.quote_name(FairShareAccumulator._meta.db_table)
    with connection.cursor() as cur:
        cur.executemany(f"UPDATE {table} SET value = %s, as_of = %s WHERE team_id = %s",
                        [(raw.get(team_id, 0.0), now, team_id) for team_id in stored])


# --- snapshots ----------------------------------------------------------------------------

def _round(x: float) -> float:
    return float(f"{x:.6g}")


def fairshare_snapshot_take(*, now: datetime, at: datetime | None = None) -> FairShareSnapshot:
    """Store the standings at `now` as one row (for charts) and drop rows older than
    FAIRQ_FAIRSHARE_SNAPSHOT_RETENTION_DAYS. Taking two at the same instant keeps one.
    With `at` (before `now`): the standings as they were then, from the raw usage
    records (`fairshare_standings_at`), stored at `at` — history filled in afterwards
    (the demo's seeded days)."""
    if at is not None and at < now:
        standings = fairshare_standings_at(at=at, now=now)
    else:
        standings, at = fairshare_standings(now=now), now
    data = {
        t: [_round(s.usage), _round(s.normalized_usage), _round(s.share), _round(s.factor)]
        for t, s in sorted(standings.items())
    }
    with transaction.atomic():
        snap, _ = FairShareSnapshot.objects.update_or_create(
            at=at, defaults={"half_life_hours": half_life_hours(), "standings": data})
        keep = timedelta(days=float(settings.FAIRQ_FAIRSHARE_SNAPSHOT_RETENTION_DAYS))
        FairShareSnapshot.objects.filter(at__lt=now - keep).delete()
    return snap
