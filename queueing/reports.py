"""Read-only reports for the API, the CLI and /metrics: usage per time bucket, cluster
capacity, queue depth. Selectors: no writes; callers scope teams to the actor first."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import chain

from django.db.models import Count, F, Sum
from django.utils import timezone

from accounts.models import Team

from .cluster import cluster_view
from .models import GpuType, Job, UsageRecord
from .policy.states import HOLDING_STATES, JobState

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
    running: list[tuple[str, str, int, float, datetime, datetime]] = [
        (team, gpu_type, gpus_per_replica * replicas, weight, started or now, now)
        for team, gpu_type, gpus_per_replica, replicas, weight, started in
        Job.objects.filter(team_id__in=team_ids, status__in=sorted(HOLDING_STATES),
                           started_at__isnull=False, started_at__lt=min(end, now))
        .values_list("team__slug", "gpu_type__slug", "gpus_per_replica", "replicas",
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


@dataclass(frozen=True)
class Capacity:
    gpu_type: str
    nodes: int
    capacity: int
    allocated: int  # as the cluster reports it
    free: int
    held_by_jobs: int  # GPUs fairq has admitted or running on this type
    queued_demand: int  # GPUs asked for by queued jobs


def cluster_capacity() -> list[Capacity]:
    nodes = cluster_view().nodes()  # the published view: web processes call no cluster
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for n in nodes:
        cell = per[n.gpu_type]
        cell[0] += 1
        cell[1] += n.capacity
        cell[2] += n.allocated
        cell[3] += n.free
    held = _gpus_by_type(Job.objects.filter(status__in=list(HOLDING_STATES)))
    queued = _gpus_by_type(Job.objects.filter(status=JobState.QUEUED))
    types = sorted(set(per) | set(GpuType.objects.values_list("slug", flat=True)))
    return [
        Capacity(t, per[t][0], per[t][1], per[t][2], per[t][3], held.get(t, 0), queued.get(t, 0))
        for t in types
    ]


def _gpus_by_type(qs: object) -> dict[str, int]:
    rows = qs.values("gpu_type__slug").annotate(  # type: ignore[attr-defined]
        gpus=Sum(F("gpus_per_replica") * F("replicas")))
    return {r["gpu_type__slug"]: int(r["gpus"] or 0) for r in rows}


def queue_depth() -> list[tuple[str, str, int]]:
    """(team, tier, queued jobs) for every pair with queued jobs."""
    rows = (Job.objects.filter(status=JobState.QUEUED)
            .values_list("team__slug", "tier__slug").annotate(n=Count("id")).order_by())
    return [(team, tier, n) for team, tier, n in rows]


def gpus_allocated_by_type() -> dict[str, int]:
    """GPUs held by admitted or running jobs, per GPU type."""
    return _gpus_by_type(Job.objects.filter(status__in=list(HOLDING_STATES)))
