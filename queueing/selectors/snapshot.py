"""Step 2 of the cycle (queueing/services/scheduler.py): everything the policy needs,
read once into its `Snapshot`. The cycle builds it from its backend; web processes, for
the cached queue plan (queueing/selectors/queue_plan.py), from the published cluster
view. Reads only.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db.models import Count, Max

from queueing.backends.base import ClusterBackend
from queueing.models import GpuType, Job, JobEvent, Quota
from queueing.policy.fairshare import FairShareState
from queueing.policy.settings import PolicySettings
from queueing.policy.snapshot import (
    NodeState,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
    Topology,
    TopologyMode,
)
from queueing.policy.states import HOLDING_STATES, JobState

from .cluster import ClusterView
from .fairshare import (
    entry_penalty_interval_seconds,
    fairshare_standings,
    half_life_hours,
    priority_weights,
)
from .preemption import nominated_preemptors, preemption_policy, preemption_settings

log = logging.getLogger(__name__)


def policy_settings() -> PolicySettings:
    """The one settings object of the policy (queueing/policy/settings.py) as the service
    runs it: its defaults overridden by the FAIRQ_* settings, billing weights per GPU type
    from the database. What the simulator takes to replay this service."""
    return PolicySettings(
        half_life_hours=half_life_hours(),
        interval_seconds=entry_penalty_interval_seconds(),
        cycle_seconds=float(settings.FAIRQ_CYCLE_INTERVAL_SECONDS),
        priority=priority_weights(),
        billing_weights=dict(GpuType.objects.values_list("slug", "billing_weight")),
        preemption=preemption_policy(),
    )


def unprovisioned_teams(backend: ClusterBackend | ClusterView) -> set[str]:
    """Teams with queued jobs whose namespace is not provisioned (FAIRQ_K8S_PROVISION=
    separate): their jobs stay out of the plan and wait with that reason. A backend
    without the notion (the simulated cluster) provisions nothing."""
    ask = getattr(backend, "unprovisioned_teams", None)
    if ask is None:
        return set()
    teams = set(Job.objects.filter(status=JobState.QUEUED)
                .values_list("team__slug", flat=True).distinct())
    return set(ask(teams)) if teams else set()


def build_snapshot(*, backend: ClusterBackend | ClusterView, now: datetime,
                   live_workloads: set[str] | None = None,
                   unprovisioned: set[str] | None = None,
                   odd_rows: dict[int, Exception] | None = None) -> Snapshot:
    """Step 2: everything the policy needs, read once (a handful of queries). Web
    processes pass the published `ClusterView` as the backend
    (queueing/selectors/cluster.py).

    A job row the policy cannot take (a placement that is not a list of node names, no
    GPUs) is left out and reported in `odd_rows` (job id -> why), never raised: the
    cycle fails those jobs, other callers just do without them."""
    odd = odd_rows if odd_rows is not None else {}
    if unprovisioned is None:
        unprovisioned = unprovisioned_teams(backend)
    if live_workloads is None:
        live_workloads = (set(backend.workloads) if isinstance(backend, ClusterView)
                          else {s.name for s in backend.statuses(now=now)})
    holding = []
    for h in Job.objects.filter(status__in=list(HOLDING_STATES)).values(
            "id", "team__slug", "gpu_type__slug", "gpus_per_replica", "replicas",
            "tier__rank", "tier__preemptible", "tier__min_runtime_seconds", "started_at",
            "placement", "submitted_to_backend_at", "cpu_millicores", "memory_bytes",
            "attempt", "max_runtime_seconds"):
        try:
            h["placement"] = _placement(h["placement"])
            _check_size(h)
        except ValueError as exc:
            odd[h["id"]] = exc
            continue
        holding.append(h)
    # Rule R3: how often each job holding GPUs was preempted before (only a job past its
    # first attempt can have been).
    preempted = dict(
        JobEvent.objects.order_by().filter(kind=JobEvent.Kind.PREEMPTED,
                                job_id__in=[h["id"] for h in holding if h["attempt"] > 1])
        .values_list("job_id").annotate(n=Count("id")).values_list("job_id", "n")
    ) if any(h["attempt"] > 1 for h in holding) else {}
    # The cluster counts what it runs; jobs admitted but not yet submitted hold their
    # planned placement on top of that.
    pending_alloc: dict[str, int] = defaultdict(int)
    pending_cpu: dict[str, int] = defaultdict(int)
    pending_memory: dict[str, int] = defaultdict(int)
    for h in holding:
        if h["submitted_to_backend_at"] is None:
            for node in h["placement"]:
                pending_alloc[node] += h["gpus_per_replica"]
                pending_cpu[node] += h["cpu_millicores"] or 0
                pending_memory[node] += h["memory_bytes"] or 0
    nodes = tuple(
        NodeState(n.name, n.gpu_type, n.capacity,
                  max(0, n.capacity - n.allocated - pending_alloc[n.name]),
                  cpu_free=_minus(n.cpu_free, pending_cpu[n.name]),
                  memory_free=_minus(n.memory_free, pending_memory[n.name]),
                  topology=n.topology, cpu_allocatable=n.cpu_millicores,
                  memory_allocatable=n.memory_bytes)
        for n in backend.nodes()
    )
    running = tuple(
        RunningJob(
            id=h["id"], team=h["team__slug"], gpu_type=h["gpu_type__slug"],
            gpus_per_replica=h["gpus_per_replica"], replicas=h["replicas"],
            tier_rank=h["tier__rank"], preemptible=h["tier__preemptible"],
            started_at=h["started_at"], min_runtime_seconds=h["tier__min_runtime_seconds"],
            nodes=tuple(h["placement"]), cpu_millicores=h["cpu_millicores"],
            memory_bytes=h["memory_bytes"], preemptions=preempted.get(h["id"], 0),
            max_runtime_seconds=h["max_runtime_seconds"],
        )
        for h in holding
    )
    queued_rows = []
    for q in Job.objects.filter(status=JobState.QUEUED).exclude(
            team__slug__in=unprovisioned).values(
            "id", "team__slug", "gpu_type__slug", "gpus_per_replica", "replicas",
            "tier__rank", "created_at", "cpu_millicores",
            "memory_bytes", "topology_level", "topology_mode", "attempt",
            "max_runtime_seconds"):
        try:
            _check_size(q)
        except ValueError as exc:
            odd[q["id"]] = exc
            continue
        queued_rows.append(q)
    # Rule R9: a requeued job's wait counts from its last return to the queue.
    requeued_ids = [q["id"] for q in queued_rows if q["attempt"] > 1]
    requeued_at = dict(
        JobEvent.objects.order_by().filter(kind=JobEvent.Kind.TRANSITION,
                                           to_status=JobState.QUEUED, job_id__in=requeued_ids)
        .values_list("job_id").annotate(last=Max("at")).values_list("job_id", "last")
    ) if requeued_ids else {}
    queued = tuple(
        QueuedJob(id=q["id"], team=q["team__slug"], gpu_type=q["gpu_type__slug"],
                  gpus_per_replica=q["gpus_per_replica"], replicas=q["replicas"],
                  tier_rank=q["tier__rank"], submitted_at=q["created_at"],
                  queued_at=requeued_at.get(q["id"]),
                  cpu_millicores=q["cpu_millicores"], memory_bytes=q["memory_bytes"],
                  topology=topology_of(q["topology_level"], q["topology_mode"]),
                  max_runtime_seconds=q["max_runtime_seconds"])
        for q in queued_rows
    )
    if odd:
        log.warning("snapshot: left out %d job rows the policy cannot take: %s", len(odd),
                    ", ".join(str(pk) for pk in sorted(odd)[:20]))
    quotas = {
        (q["team__slug"], q["gpu_type__slug"]): QuotaLimit(
            q["nominal"], q["borrowing_limit"], q["lending_limit"])
        for q in Quota.objects.values("team__slug", "gpu_type__slug", "nominal",
                                      "borrowing_limit", "lending_limit")
    }
    standings = fairshare_standings(now=now)
    interval = entry_penalty_interval_seconds()
    return Snapshot(
        now=now, nodes=nodes, queued=queued, running=running, quotas=quotas,
        fair_share={team: s.factor for team, s in standings.items()},
        fair_share_state=FairShareState.from_standings(standings),
        priority_weights=priority_weights(),
        billing_weights=dict(GpuType.objects.values_list("slug", "billing_weight")),
        interval_seconds=interval,
        # Rule R8 must see the workloads the cluster lists: the cycle's own, or for the
        # web (explain, dashboard, preview) the ones the last cycle published.
        nominated=nominated_preemptors(now=now, live_workloads=live_workloads),
        preemption=preemption_settings(now=now),
    )


def _minus(free: int | None, pending: int) -> int | None:
    return None if free is None else max(0, free - pending)


def topology_of(level: str, mode: str) -> Topology | None:
    """A job row's topology request (rule A7); None when it asks none. A mode the policy
    does not know (a row older than the validation) counts as `preferred`: it never
    makes a job wait for ever."""
    if not level:
        return None
    try:
        return Topology(level, TopologyMode(mode))
    except ValueError:
        return Topology(level, TopologyMode.PREFERRED)


def _placement(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
        raise ValueError(f"placement is not a list of node names: {type(value).__name__}")
    return value


def _check_size(row: Mapping[str, Any]) -> None:
    for name in ("gpus_per_replica", "replicas"):
        n = row[name]
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"{name} is {n!r}")
