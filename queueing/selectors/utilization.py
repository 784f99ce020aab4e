"""Reads of GPU utilization (docs/scheduling.md, "Idle GPUs"): a job's per-attempt
summaries and series (the API's `utilization`, the job page's chart), idle flags for
badges, and the per-team gauges of /metrics."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import F

from queueing.models import AttemptUtilization, Job, UtilizationSample
from queueing.policy.states import HOLDING_STATES, JobState

# The job page and the API show at most this many minutes per attempt (the last ones).
SERIES_MAX_POINTS = 1440


def job_utilization(job: Job, *, series: bool = True) -> list[dict[str, Any]]:
    """Per attempt of `job` with readings, oldest first: `attempt`, `samples` (minutes),
    `sm_mean` and `sm_p95` (SM activity, percent), `mem_mean_bytes`, `mem_max_bytes`,
    `first_at`, `last_at`, `idle_since` (rule U2; null when not flagged) and, with
    `series`, `series`: [{"at", "sm", "mem_bytes"}] per minute (the last
    SERIES_MAX_POINTS kept)."""
    rows = list(AttemptUtilization.objects.filter(job=job).order_by("attempt"))
    points: dict[int, list[dict[str, Any]]] = defaultdict(list)
    if series and rows:
        for attempt in (r.attempt for r in rows):
            recent = list(UtilizationSample.objects.filter(job=job, attempt=attempt)
                          .order_by("-minute").values_list("minute", "sm", "mem_bytes")
                          [:SERIES_MAX_POINTS])
            points[attempt] = [{"at": at, "sm": round(sm, 2), "mem_bytes": mem}
                               for at, sm, mem in reversed(recent)]
    out = []
    for r in rows:
        item: dict[str, Any] = {
            "attempt": r.attempt, "samples": r.samples, "sm_mean": round(r.sm_mean, 2),
            "sm_p95": r.sm_p95, "mem_mean_bytes": r.mem_mean_bytes,
            "mem_max_bytes": r.mem_max_bytes, "first_at": r.first_at, "last_at": r.last_at,
            "idle_since": r.idle_since}
        if series:
            item["series"] = points.get(r.attempt, [])
        out.append(item)
    return out


def idle_since(job: Job) -> datetime | None:
    """When the job's current attempt was flagged idle (rule U2), None when it is not
    (or is not running)."""
    if job.state != JobState.RUNNING:
        return None
    return AttemptUtilization.objects.filter(job=job, attempt=job.attempt).values_list(
        "idle_since", flat=True).first()


def utilization_version(job: Job) -> str:
    """Changes whenever the job's utilization does (a new minute sampled, a flag): the
    last sample's minute of its current attempt, "" without one (for the API's ETag)."""
    last = AttemptUtilization.objects.filter(job=job, attempt=job.attempt).values_list(
        "last_at", flat=True).first()
    return "" if last is None else f"{last.timestamp():.0f}"


def idle_flags(jobs: Iterable[Job]) -> dict[int, datetime]:
    """Job id -> idle since, for those of `jobs` whose running attempt is flagged (one
    query: the dashboard's badges)."""
    running = {j.pk: j.attempt for j in jobs if j.state == JobState.RUNNING}
    if not running:
        return {}
    return {job_id: since for job_id, attempt, since in AttemptUtilization.objects.filter(
        job_id__in=running, idle_since__isnull=False).values_list(
        "job_id", "attempt", "idle_since")
        if running.get(job_id) == attempt and since is not None}


@dataclass(frozen=True, slots=True)
class TeamGpuUse:
    team: str
    allocated: int  # GPUs held by admitted and running jobs
    idle: int  # of them, GPUs of running jobs flagged idle (rule U2)
    measured: int  # GPUs of running jobs with a reading
    sm_mean: float  # their SM activity, GPU-weighted, percent (0 when none measured)


def team_gpu_use() -> list[TeamGpuUse]:
    """Per team with GPUs held: allocated, idle and measured GPUs and the GPU-weighted
    mean of the last minute's SM activity (two queries)."""
    allocated: dict[str, int] = defaultdict(int)
    for team, gpus, replicas in Job.objects.filter(
            status__in=[str(s) for s in HOLDING_STATES]).values_list(
            "team__slug", "gpus_per_replica", "replicas"):
        allocated[team] += gpus * replicas
    idle: dict[str, int] = defaultdict(int)
    measured: dict[str, int] = defaultdict(int)
    weighted: dict[str, float] = defaultdict(float)
    for team, gpus, replicas, sm, flagged in AttemptUtilization.objects.filter(
            job__status=JobState.RUNNING, attempt=F("job__attempt")).values_list(
            "job__team__slug", "job__gpus_per_replica", "job__replicas", "sm_last",
            "idle_since"):
        n = gpus * replicas
        measured[team] += n
        weighted[team] += sm * n
        if flagged is not None:
            idle[team] += n
    return [TeamGpuUse(team, allocated[team], idle[team], measured[team],
                       weighted[team] / measured[team] if measured[team] else 0.0)
            for team in sorted(allocated)]
