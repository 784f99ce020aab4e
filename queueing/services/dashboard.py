"""Reads for the web dashboard (docs/dashboard.md): the team's queue with positions and
wait reasons, running and recent jobs, capacity and allocation, standings over time, a
submit preview, and the quota board grid. Reads only; every state change goes through
the job, quota, membership and token services.

Every function runs a small, constant number of queries whatever the number of jobs: the
job lists are bounded and ride the `(team, status)` and `(status, tier, created_at)`
indexes. The one expensive read — the admission plan that gives queue positions — is
computed once for all queued jobs and cached for a few seconds (`QUEUE_PLAN_TTL`).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import F, QuerySet, Sum
from django.utils import timezone

from accounts.models import Team
from queueing.backends.base import NodeInfo
from queueing.cluster import cluster_view
from queueing.models import FairShareSnapshot, GpuType, Job, JobEvent, Quota
from queueing.policy.admission import plan_admissions
from queueing.policy.explain import explain_queued
from queueing.policy.fairshare import Standing
from queueing.policy.snapshot import QueuedJob
from queueing.policy.states import FINAL_STATES, HOLDING_STATES, JobState

from .queue_plan import queue_plan
from .usage import fairshare_standings

DONE_STATES = [*sorted(FINAL_STATES), JobState.PREEMPTED]


# The JSON columns a job list never shows.
_LIST_DEFER = ("command", "args", "env", "image")


@dataclass(frozen=True)
class QueueRow:
    job: Job
    position: int | None
    reason: str


def team_queue(*, team: Team, now: datetime, limit: int = 50) -> tuple[list[QueueRow], int]:
    """The team's queued jobs in queue order with position and wait reason (the first
    `limit`), and how many it has queued in all. Jobs queued since the plan was cached
    come last, without a position, until the next refresh."""
    plan = queue_plan(now=now)
    qs = Job.objects.filter(team=team, status=JobState.QUEUED)
    total = qs.count()
    ours = sorted((e.position, job_id) for job_id, e in plan.entries.items() if e.team == team.slug)
    ids = [job_id for _, job_id in ours[:limit]]
    found = qs.select_related("gpu_type", "tier").defer(*_LIST_DEFER).in_bulk(ids)
    jobs = [found[i] for i in ids if i in found]
    if len(jobs) < limit:
        # Queued after the plan was cached (or the plan is unavailable).
        jobs += list(qs.exclude(pk__in=ids).select_related("gpu_type", "tier")
                     .defer(*_LIST_DEFER).order_by("-tier__rank", "created_at", "id")
                     [: limit - len(jobs)])
    rows = []
    for j in jobs:
        reasons = plan.reasons(j.pk)
        rows.append(QueueRow(j, plan.position(j.pk), "; ".join(r["message"] for r in reasons)))
    return rows, total


# --- jobs ------------------------------------------------------------------------------------

def team_running(*, team: Team, limit: int = 50) -> list[Job]:
    return list(
        Job.objects.filter(team=team, status__in=sorted(HOLDING_STATES))
        .select_related("gpu_type", "tier").defer(*_LIST_DEFER)
        .order_by("started_at", "id")[:limit]
    )


def team_recent_done(*, team: Team, limit: int = 10) -> list[Job]:
    """The team's latest finished, cancelled and preempted jobs (newest first)."""
    return list(
        Job.objects.filter(team=team, status__in=DONE_STATES)
        .select_related("gpu_type", "tier").defer(*_LIST_DEFER, "placement")
        .order_by("-id")[:limit]
    )


def team_recent_preemptions(*, team: Team, now: datetime, hours: float = 24.0,
                            limit: int = 5) -> list[JobEvent]:
    """The team's jobs preempted in the last `hours` (newest first): a preempted job is
    requeued at once, so its status no longer says so; its "preempted" event does, with
    the preemptor and the rule in `data`. The time bound keeps the scan on the `at` index."""
    return list(
        JobEvent.objects.filter(kind=JobEvent.Kind.PREEMPTED, job__team=team,
                                at__gte=now - timedelta(hours=hours))
        .select_related("job").defer(*(f"job__{f}" for f in _LIST_DEFER))
        .order_by("-at", "-id")[:limit]
    )


def job_page(*, jobs: QuerySet[Job], before: int | None, status: str | None,
             size: int = 50) -> tuple[list[Job], int | None]:
    """One page of `jobs`, newest first, keyset-paginated by id (no COUNT, no OFFSET):
    the page and the id to pass as `before` for the next one (None on the last page)."""
    if status:
        jobs = jobs.filter(status=status)
    if before is not None:
        jobs = jobs.filter(pk__lt=before)
    page = list(jobs.defer(*_LIST_DEFER, "placement").order_by("-id")[: size + 1])
    more = len(page) > size
    page = page[:size]
    return page, (page[-1].pk if more and page else None)


# --- capacity and standings ----------------------------------------------------------------

@dataclass
class CapacityRow:
    gpu_type: str
    capacity: int = 0
    allocated: int = 0
    nodes: int = 0
    guaranteed: int = 0  # sum of nominal quotas
    by_team: dict[str, int] = field(default_factory=dict)

    @property
    def percent(self) -> int:
        return round(100 * self.allocated / self.capacity) if self.capacity else 0

    @property
    def overcommitted(self) -> bool:
        return self.guaranteed > self.capacity


def cluster_nodes() -> tuple[list[NodeInfo], str]:
    """The nodes of the published cluster view (queueing/cluster.py), and a sentence when
    it is missing or stale (the page shows it instead of failing)."""
    view = cluster_view()
    return view.nodes(), view.stale(timezone.now())[:200]


def allocation_by_team() -> dict[tuple[str, str], int]:
    """GPUs held (admitted or running) per (team slug, GPU type slug)."""
    rows = (
        Job.objects.filter(status__in=sorted(HOLDING_STATES))
        .values("team__slug", "gpu_type__slug")
        .annotate(gpus=Sum(models_total_gpus()))
    )
    return {(r["team__slug"], r["gpu_type__slug"]): int(r["gpus"] or 0) for r in rows}


def models_total_gpus() -> Any:
    return F("gpus_per_replica") * F("replicas")


def capacity(*, nodes: list[NodeInfo] | None = None) -> tuple[list[CapacityRow], str]:
    """Capacity, allocation and guaranteed (nominal) quota per GPU type, with each team's
    allocation."""
    error = ""
    if nodes is None:
        nodes, error = cluster_nodes()
    rows: dict[str, CapacityRow] = {}
    for slug in GpuType.objects.values_list("slug", flat=True):
        rows[slug] = CapacityRow(slug)
    for n in nodes:
        row = rows.setdefault(n.gpu_type, CapacityRow(n.gpu_type))
        row.capacity += n.capacity
        row.allocated += n.allocated
        row.nodes += 1
    for (team, gpu), gpus in allocation_by_team().items():
        rows.setdefault(gpu, CapacityRow(gpu)).by_team[team] = gpus
    for r in Quota.objects.values("gpu_type__slug").annotate(n=Sum("nominal")):
        rows.setdefault(r["gpu_type__slug"], CapacityRow(r["gpu_type__slug"])).guaranteed = int(
            r["n"] or 0)
    return sorted(rows.values(), key=lambda r: r.gpu_type), error


def standings(*, now: datetime) -> list[Standing]:
    """Every team's standing, highest factor first."""
    return sorted(fairshare_standings(now=now).values(), key=lambda s: (-s.factor, s.team))


_HISTORY_KEY = "fairq:web:usage-history"
HISTORY_TTL = 60.0  # seconds; snapshots are taken every FAIRQ_FAIRSHARE_SNAPSHOT_SECONDS


def _snapshot_series(*, now: datetime, days: float, max_points: int
                     ) -> tuple[list[int], dict[str, list[float | None]]]:
    """The snapshots of the last `days`, thinned to `max_points`, as columns; cached for
    HISTORY_TTL seconds (they change once per snapshot interval)."""
    key = f"{_HISTORY_KEY}:{days}:{max_points}"
    cached: tuple[list[int], dict[str, list[float | None]]] | None = cache.get(key)
    if cached is not None:
        return cached
    qs = FairShareSnapshot.objects.filter(at__gte=now - timedelta(days=days), at__lt=now)
    ids = list(qs.order_by("at").values_list("id", flat=True))
    step = max(1, -(-len(ids) // max_points))
    keep = ids[::-1][::step][::-1]  # thin from the newest backwards: the last one stays
    rows = list(FairShareSnapshot.objects.filter(pk__in=keep).order_by("at")
                .values_list("at", "standings"))
    teams = sorted({t for _, data in rows for t in data})
    series: dict[str, list[float | None]] = {t: [] for t in teams}
    times: list[int] = []
    for at, data in rows:
        times.append(int(at.timestamp()))
        for t in teams:
            v = data.get(t)
            series[t].append(float(v[0]) if v else None)
    cache.set(key, (times, series), timeout=HISTORY_TTL)
    return times, series


def usage_history(*, now: datetime, days: float = 7.0,
                  current: list[Standing] | None = None,
                  max_points: int = 168) -> dict[str, Any]:
    """Decayed GPU-hours per team over time, for the chart: the standings snapshots of the
    last `days` (thinned to at most `max_points`) plus the current standings as the last
    point. {"t": [unix seconds], "series": {team: [gpu-hours or None]}, "start": the
    left end of the x axis, "snapshots": how many snapshots are drawn}."""
    snap_times, snap_series = _snapshot_series(now=now, days=days, max_points=max_points)
    current = current if current is not None else standings(now=now)
    teams = sorted(set(snap_series) | {s.team for s in current})
    times = list(snap_times)
    blank: list[float | None] = [None] * len(times)
    series = {t: list(snap_series.get(t, blank)) for t in teams}
    times.append(int(now.timestamp()))
    now_usage = {s.team: s.usage for s in current}
    for t in teams:
        series[t].append(round(now_usage[t], 6) if t in now_usage else None)
    # The x axis starts at the first snapshot, or an hour back when there is none yet.
    start = min(times[0], int(now.timestamp()) - 3600)
    return {"t": times, "series": series, "start": start, "snapshots": len(snap_times)}


# --- submit preview --------------------------------------------------------------------------

@dataclass(frozen=True)
class Preview:
    position: int | None
    queued: int  # queued jobs now, before this one
    admitted_next: bool
    reason: str
    error: str = ""


def submit_preview(*, team: Team, gpu_type: GpuType, gpus_per_replica: int, replicas: int,
                   tier_rank: int, now: datetime) -> Preview:
    """Where a job would stand if submitted now: the same snapshot and policy as the next
    cycle, with the job added to the queue in memory (nothing is written)."""
    from dataclasses import replace

    from .scheduler import build_snapshot

    view = cluster_view(now=now)
    if view.published_at is None and view.error:
        return Preview(None, 0, False, "", error=view.error[:200])
    try:
        snapshot = build_snapshot(backend=view, now=now, live_workloads=set(view.workloads))
    except Exception as exc:
        return Preview(None, 0, False, "", error=str(exc)[:200])
    probe_id = -1  # no real job has a negative id
    probe = QueuedJob(id=probe_id, team=team.slug, gpu_type=gpu_type.slug,
                      gpus_per_replica=gpus_per_replica, replicas=replicas,
                      tier_rank=tier_rank, submitted_at=now)
    snapshot = replace(snapshot, queued=(*snapshot.queued, probe))
    plan = plan_admissions(snapshot)
    by_id = {q.id: q for q in snapshot.queued}
    order = [by_id[i] for i in plan.order if i in by_id] if plan.order else list(snapshot.queued)
    seen = {q.id for q in order}
    order += [q for q in snapshot.queued if q.id not in seen]
    wait = plan.waits.get(probe_id)
    admitted = any(a.job_id == probe_id for a in plan.admissions)
    exp = explain_queued(probe_id, order, wait_code=str(wait.reason) if wait else None,
                         wait_message=wait.message if wait else None, admitted_next=admitted)
    if exp is None:
        return Preview(None, len(snapshot.queued) - 1, admitted, "")
    return Preview(exp.position, exp.queued - 1, admitted,
                   "; ".join(r.message for r in exp.reasons))


def team_submit_defaults(*, team: Team) -> dict[str, Any]:
    """Initial values of the submit form: the team's last job's image, command, arguments,
    GPU type, size and tier (not its environment); otherwise the GPU type of its largest
    quota and the default tier."""
    last = (Job.objects.filter(team=team).select_related("gpu_type", "tier")
            .order_by("-id").first())
    if last is not None:
        return {"image": last.image, "command": shlex.join(last.command or []),
                "args": shlex.join(last.args or []), "gpu_type": last.gpu_type.slug,
                "gpus": last.gpus_per_replica, "replicas": last.replicas,
                "tier": last.tier.slug, "max_runtime_seconds": last.max_runtime_seconds}
    quota = Quota.objects.filter(team=team).select_related("gpu_type").order_by(
        "-nominal", "gpu_type__slug").first()
    return {"gpu_type": quota.gpu_type.slug if quota else None, "gpus": 1, "replicas": 1,
            "tier": settings.FAIRQ_DEFAULT_TIER}


# --- quota board -----------------------------------------------------------------------------

@dataclass
class QuotaCell:
    team: Team
    gpu_type: GpuType
    quota: Quota | None
    allocated: int


@dataclass
class QuotaBoard:
    gpu_types: list[GpuType]
    rows: list[tuple[Team, list[QuotaCell], Standing | None]]
    capacity: list[CapacityRow]  # one per GPU type, in the order of `gpu_types`
    warnings: list[str]
    error: str = ""


def overcommit_warnings(rows: list[CapacityRow]) -> list[str]:
    return [
        f"Guaranteed {r.gpu_type} quotas ({r.guaranteed} GPUs) exceed the cluster's "
        f"{r.capacity} {r.gpu_type} GPUs: not every team can get its nominal quota at once."
        for r in rows if r.overcommitted
    ]


def quota_board(*, now: datetime) -> QuotaBoard:
    """Teams × GPU types: each quota beside the team's allocation and decayed usage."""
    gpu_types = list(GpuType.objects.order_by("slug"))
    teams = list(Team.objects.order_by("slug"))
    quotas = {(q.team_id, q.gpu_type_id): q for q in Quota.objects.all()}
    alloc = allocation_by_team()
    by_team = {s.team: s for s in fairshare_standings(now=now).values()}
    cap, error = capacity()
    rows = []
    for team in teams:
        cells = [QuotaCell(team, g, quotas.get((team.pk, g.pk)), alloc.get((team.slug, g.slug), 0))
                 for g in gpu_types]
        rows.append((team, cells, by_team.get(team.slug)))
    by_type = {c.gpu_type: c for c in cap}
    columns = [by_type.get(g.slug, CapacityRow(g.slug)) for g in gpu_types]
    return QuotaBoard(gpu_types, rows, columns, overcommit_warnings(cap), error)


def quota_cell(*, team: Team, gpu_type: GpuType) -> QuotaCell:
    quota = Quota.objects.filter(team=team, gpu_type=gpu_type).first()
    held = Job.objects.filter(team=team, gpu_type=gpu_type, status__in=sorted(HOLDING_STATES))
    allocated = held.aggregate(n=Sum(models_total_gpus()))["n"] or 0
    return QuotaCell(team, gpu_type, quota, int(allocated))


def team_quotas(*, team: Team) -> list[QuotaCell]:
    alloc = allocation_by_team()
    quotas = {q.gpu_type_id: q for q in Quota.objects.filter(team=team)}
    return [QuotaCell(team, g, quotas.get(g.pk), alloc.get((team.slug, g.slug), 0))
            for g in GpuType.objects.order_by("slug")
            if g.pk in quotas or alloc.get((team.slug, g.slug))]
