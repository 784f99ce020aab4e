"""Usage reads for the API and the command line: GPU-hours per time bucket, and the
usage records as the CSV `manage.py import_usage` reads. Callers scope teams to the
actor first."""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import chain
from typing import TextIO

from django.utils import timezone

from accounts.models import Team
from queueing.models import Job, UsageRecord
from queueing.policy.states import HOLDING_STATES
from queueing.selectors.gpu_share import GPU_SHARE, whole

IMPORT_COLUMNS = ("team", "gpu_type", "gpus", "start", "end")  # the usage CSV's header
BUCKETS: dict[str, timedelta] = {"hour": timedelta(hours=1), "day": timedelta(days=1)}
MAX_BUCKETS = 2000


@dataclass(frozen=True)
class UsageBucket:
    team: str
    gpu_type: str
    start: datetime
    gpu_hours: float
    weighted_gpu_hours: float


def _floor(t: datetime, bucket: str) -> datetime:
    t = t.replace(minute=0, second=0, microsecond=0)
    return t.replace(hour=0) if bucket == "day" else t


def usage_buckets(
    *, teams: Iterable[Team], start: datetime, end: datetime, bucket: str,
    now: datetime | None = None,
) -> list[UsageBucket]:
    """GPU-hours of `teams` per bucket and GPU type within [start, end): the charged
    attempt intervals (usage records) and, as fair-share counts them (rule F1), the
    attempts running now, up to `now`. An interval spanning several buckets is split
    across them by time (UTC bucket boundaries)."""
    now = now or timezone.now()
    step = BUCKETS[bucket]
    team_ids = [t.pk for t in teams]
    charged = (
        UsageRecord.objects.filter(team_id__in=team_ids, start__lt=end, end__gt=start)
        .values_list("team__slug", "gpu_type__slug", "gpus", "billing_weight", "start", "end")
        .iterator(chunk_size=2000)
    )
    running: list[tuple[str, str, float, float, datetime, datetime]] = [
        (team, gpu_type, share, weight, started or now, now)
        for team, gpu_type, share, weight, started in
        Job.objects.filter(team_id__in=team_ids, status__in=sorted(HOLDING_STATES),
                           started_at__isnull=False, started_at__lt=min(end, now))
        .annotate(share=GPU_SHARE)
        .values_list("team__slug", "gpu_type__slug", "share",
                     "gpu_type__billing_weight", "started_at")
    ]
    acc: dict[tuple[str, str, datetime], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for team, gpu_type, gpus, weight, r_start, r_end in chain(charged, running):
        lo, hi = max(r_start, start), min(r_end, end)
        b = _floor(lo, bucket)
        while b < hi:
            seconds = (min(hi, b + step) - max(lo, b)).total_seconds()
            if seconds > 0:
                cell = acc[(team, gpu_type, b)]
                cell[0] += gpus * seconds / 3600
                cell[1] += gpus * weight * seconds / 3600
            b += step
    return [
        UsageBucket(team, gpu_type, b, round(v[0], 6), round(v[1], 6))
        for (team, gpu_type, b), v in sorted(acc.items())
    ]


def usage_export_csv(*, out: TextIO, source: str | None = None) -> int:
    """Write the usage records as the CSV `usage_import_csv` reads (instants in UTC with
    an offset). `source` keeps only "import" or "scheduler" records. Returns the rows."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(IMPORT_COLUMNS)
    qs = UsageRecord.objects.order_by("start", "id")
    if source:
        qs = qs.filter(source=source)
    n = 0
    for team, gpu_type, gpus, start, end in qs.values_list(
        "team__slug", "gpu_type__slug", "gpus", "start", "end"
    ).iterator(chunk_size=10_000):
        writer.writerow([team, gpu_type, whole(gpus), _iso(start), _iso(end)])
        n += 1
    return n


def _iso(when: datetime) -> str:
    return when.astimezone(UTC).isoformat()
