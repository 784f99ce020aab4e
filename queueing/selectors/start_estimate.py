"""Rule P4 for the queue as it is: each queued job's estimated start, from the cached
queue plan's order (rule P2), the cluster view's free GPUs and the running jobs' ends."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from queueing.models import Job
from queueing.policy.start_estimate import Holding, Waiting, estimate_starts
from queueing.policy.states import JobState

from .active_jobs import PACKED_SHARING
from .cluster import cluster_view
from .queue_plan import queue_plan_for


@dataclass(frozen=True)
class Start:
    """Where a queued job stands (rule P2), why it waits first (rule P3) and when it may
    start (rule P4; None: no estimate)."""

    position: int
    reason: dict[str, str] | None
    estimated_start: datetime | None


# Rule H1: the columns that say a job's replica in its type's units (node capacities are).
_UNITS = ("gpu_slices", "gpu_type__sharing", "gpu_type__slices_per_gpu")


def units(gpus_per_replica: int, gpu_slices: int, sharing: str, slices_per_gpu: int) -> int:
    """Rule H1: one replica in its type's units: a fraction's slices, whole GPUs of a
    time-sliced or MPS type x its slices per GPU, devices elsewhere."""
    if sharing in PACKED_SHARING:
        return gpu_slices or gpus_per_replica * slices_per_gpu
    return gpus_per_replica


def queue_start_estimates(*, now: datetime, job_ids: Collection[int] = ()
                          ) -> tuple[dict[int, Start], str]:
    """(job id -> its `Start`, error): every job of the queue plan, made afresh when one
    of `job_ids` is missing from the cached one. The error is the
    plan's (the cluster did not answer): then there are none.
    Four reads whatever the queue's length: the plan (cached), the queued jobs, the
    running jobs, and the cluster view (cached). GPUs held outside fairq are not seen."""
    plan = queue_plan_for(job_ids=job_ids, now=now)  # queued since the plan: as P3 does
    if plan.error:
        return {}, plan.error
    positions = plan.positions()
    view = cluster_view(now=now)
    holding = Job.objects.filter(status__in=[JobState.ADMITTED, JobState.RUNNING])
    if view.closed:  # rule K8: a draining cluster's GPUs, held or freed, no queued job gets
        holding = holding.exclude(cluster__name__in=sorted(view.closed))
    held = holding.values_list(
        "gpu_type__slug", "gpus_per_replica", "replicas", "started_at", "max_runtime_seconds",
        *_UNITS)
    running = [Holding(gpu_type=t, gpus=units(g, *shape) * r,
                       # Admitted, not started yet: its clock starts about now.
                       ends_at=None if limit is None else (started or now) + timedelta(seconds=limit))
               for t, g, r, started, limit, *shape in held]
    # Free: the cluster's GPUs less those fairq's jobs hold, from the same rows as the
    # releases (the cluster's own `allocated` lags a cancel by up to a cycle, and would
    # count a stopped job's GPUs twice: held, and never released).
    free: dict[str, int] = {}
    for n in view.open_nodes():
        free[n.gpu_type] = free.get(n.gpu_type, 0) + n.capacity
    for h in running:
        free[h.gpu_type] = free.get(h.gpu_type, 0) - h.gpus
    free = {t: max(0, n) for t, n in free.items()}
    rows = {pk: (t, units(g, *shape) * r, limit, () if shape[1] in PACKED_SHARING
                 else tuple(types or ()))
            for pk, t, g, r, limit, types, *shape in
            Job.objects.filter(pk__in=list(positions), status=JobState.QUEUED).values_list(
                "id", "gpu_type__slug", "gpus_per_replica", "replicas",
                "max_runtime_seconds", "gpu_types", *_UNITS)}
    # Rule G5: a job of several types starts on the first of them to have room; a queued
    # job's first listed type is the one it is planned from (its `gpu_type` may still
    # name where an earlier attempt ran).
    queued = [Waiting(id=pk, gpu_type=rows[pk][3][0] if rows[pk][3] else rows[pk][0],
                      gpus=rows[pk][1], max_runtime_seconds=rows[pk][2],
                      gpu_types=rows[pk][3])
              for pk in sorted(rows, key=lambda pk: (positions[pk], pk))]
    starts = estimate_starts(now=now, free=free, running=running, queued=queued)
    out = {}
    for pk, position in positions.items():
        reasons = plan.reasons(pk)
        out[pk] = Start(position, reasons[0] if reasons else None, starts.get(pk))
    return out, ""
