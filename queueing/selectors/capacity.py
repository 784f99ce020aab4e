"""Capacity per GPU type and the GPUs jobs hold: one implementation of each, for the
dashboard, the quota board, the API's /capacity/ and /metrics."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field

from django.db.models import F, Sum

from accounts.models import Team
from queueing.backends.base import NodeInfo
from queueing.models import GpuType, Job, JobArray
from queueing.policy.quota_tree import ROOT, QuotaTree
from queueing.policy.snapshot import QuotaLimit
from queueing.policy.states import HOLDING_STATES, JobState

from .cluster import cluster_nodes
from .gpu_share import DEVICE_SHARE, whole


@dataclass
class CapacityRow:
    """One GPU type as the cluster and fairq each see it, in its devices (GPUs; a MIG
    type's instances). Shared GPUs: a time-sliced or MPS type's nodes report slices, so
    its GPUs are slices / `slices_per_gpu`, and a fraction holds its share of one GPU
    (0.25); `capacity_slices` and `allocated_slices` say the slices."""

    gpu_type: str
    nodes: int = 0
    capacity: int | float = 0
    allocated: int | float = 0  # as the cluster reports it
    free: int | float = 0
    held_by_jobs: int | float = 0  # GPUs of admitted and running jobs
    # GPUs asked for by queued jobs that accept this type only.
    queued_demand: int | float = 0
    # GPUs asked for by queued jobs that accept this type or others ("any of": such a job
    # counts under each type it accepts, so summing this over types counts it again per
    # type; it runs on one of them, docs/api.md "Several GPU types").
    queued_any_of: int | float = 0
    guaranteed: int = 0  # sum of nominal quotas
    by_team: dict[str, int | float] = field(default_factory=dict)  # GPUs held per team
    sharing: str = "exclusive"
    slices_per_gpu: int = 1
    capacity_slices: int = 0  # a time-sliced or MPS type's: its nodes' slices
    allocated_slices: int = 0
    # Per node of the type, by name: {name, gpu_type, capacity, allocated, free, draining}
    # (rule E3's "largest free block" is the largest `free` of a node not draining).
    by_node: list[dict[str, object]] = field(default_factory=list)
    # Rule K8: the part of `capacity` on draining clusters' nodes (real, in use by the
    # jobs still there, but no new work goes there).
    draining_capacity: int = 0

    @property
    def packs_slices(self) -> bool:
        return self.sharing in ("time-sliced", "mps")

    @property
    def percent(self) -> int:
        return round(100 * self.allocated / self.capacity) if self.capacity else 0

    @property
    def open_capacity(self) -> int | float:
        """The GPUs new work may use (rule K8): those of no draining cluster."""
        return self.capacity - self.draining_capacity

    @property
    def overcommitted(self) -> bool:
        return self.guaranteed > self.open_capacity


def _gpus_by(statuses: Collection[str], *, team: Team | None = None,
             gpu_type: GpuType | None = None) -> dict[tuple[str, str, str], int | float]:
    """GPUs (replicas × GPUs per replica; a fraction's share of one GPU, shared GPUs)
    of the jobs in `statuses`, per (status, team slug, GPU type slug): one grouped
    query."""
    qs = Job.objects.filter(status__in=sorted(statuses))
    if team is not None:
        qs = qs.filter(team=team)
    if gpu_type is not None:
        qs = qs.filter(gpu_type=gpu_type)
    rows = (qs.values("status", "team__slug", "gpu_type__slug").order_by()
            .annotate(gpus=Sum(DEVICE_SHARE)))
    return {(r["status"], r["team__slug"], r["gpu_type__slug"]): whole(r["gpus"] or 0)
            for r in rows}


def _queued_by_types() -> dict[tuple[str, ...], int | float]:
    """GPUs asked for by queued jobs (rows, and the members of arrays not yet written as
    rows: docs/scheduling.md "Arrays"), per tuple of the GPU types they accept (one type:
    a tuple of one). One grouped query over the queued rows, one over the arrays."""
    out: dict[tuple[str, ...], int | float] = defaultdict(int)
    rows = (Job.objects.filter(status=JobState.QUEUED)
            .values("gpu_type__slug", "gpu_types").order_by()
            .annotate(gpus=Sum(DEVICE_SHARE)))
    for r in rows:
        types = tuple(dict.fromkeys(str(t) for t in r["gpu_types"] or [])) or (
            r["gpu_type__slug"],)
        out[types] = whole(out[types] + whole(r["gpus"] or 0))
    arrays = list(JobArray.objects.filter(rest_cancelled_at__isnull=True,
                                          materialized__lt=F("count"))
                  .values_list("count", "materialized", "spec"))
    if arrays:
        slugs = dict(GpuType.objects.values_list("pk", "slug"))
        for count, materialized, spec in arrays:
            gpus = int(spec.get("gpus_per_replica") or 1) * int(spec.get("replicas") or 1)
            types = tuple(dict.fromkeys(str(t) for t in spec.get("gpu_types") or [])) or (
                slugs.get(spec.get("gpu_type_id"), "?"),)
            out[types] = whole(out[types] + (count - materialized) * gpus)
    return dict(out)


def gpus_held(*, team: Team | None = None,
              gpu_type: GpuType | None = None) -> dict[tuple[str, str], int | float]:
    """GPUs held by admitted and running jobs per (team slug, GPU type slug), optionally
    of one team or GPU type."""
    out: dict[tuple[str, str], int | float] = defaultdict(int)
    for (_, t, g), gpus in _gpus_by(HOLDING_STATES, team=team, gpu_type=gpu_type).items():
        out[(t, g)] = whole(out[(t, g)] + gpus)
    return dict(out)


def gpus_held_by_type() -> dict[str, int | float]:
    """GPUs held by admitted and running jobs, per GPU type."""
    out: dict[str, int | float] = defaultdict(int)
    for (_, g), gpus in gpus_held().items():
        out[g] = whole(out[g] + gpus)
    return dict(out)


def capacity_by_gpu_type(*, nodes: list[NodeInfo] | None = None,
                         closed: frozenset[str] = frozenset(),
                         held_only: bool = False) -> tuple[list[CapacityRow], str]:
    """Every GPU type (known to fairq or on a node), sorted: its nodes, capacity and
    allocation as the cluster reports them (a draining cluster's nodes too, their part
    in `draining_capacity`: rule K8), the GPUs jobs hold (per team) and ask for, and the
    guaranteed (nominal) quota. `nodes` default to the published cluster view, `closed`
    to its closed clusters; the sentence says when that is missing or stale.

    `held_only`: without what the queue asks for and the guaranteed quotas
    (`queued_demand` and `guaranteed` stay 0): the dashboard's card shows neither, and
    summing the queue is a read of every queued job (100,000 rows: 0.6 s at 1,000,000
    jobs, docs/performance.md)."""
    error = ""
    if nodes is None:
        nodes, closed, error = cluster_nodes()
    rows = {slug: CapacityRow(slug, sharing=sharing, slices_per_gpu=per)
            for slug, sharing, per in GpuType.objects.values_list("slug", "sharing",
                                                                  "slices_per_gpu")}

    def row(gpu_type: str) -> CapacityRow:
        return rows.setdefault(gpu_type, CapacityRow(gpu_type))

    for n in nodes:
        r = row(n.gpu_type)
        # Shared GPUs: a time-sliced or MPS node reports slices; shown as GPUs.
        per = r.slices_per_gpu if r.packs_slices else 1
        r.nodes += 1
        r.capacity = whole(r.capacity + n.capacity / per)
        r.allocated = whole(r.allocated + n.allocated / per)
        r.free = whole(r.free + n.free / per)
        if r.packs_slices:
            r.capacity_slices += n.capacity
            r.allocated_slices += n.allocated
        draining = bool(closed) and n.cluster in closed
        if draining:
            r.draining_capacity += n.capacity // per
        r.by_node.append({"name": n.name, "gpu_type": n.gpu_type,
                          "capacity": whole(n.capacity / per),
                          "allocated": whole(n.allocated / per), "free": whole(n.free / per),
                          "draining": draining})
    # An admitted or running job counts under the type it holds (`Job.gpu_type`: the
    # type its attempt was admitted on, whichever of its accepted types that is).
    for (_, team, gpu), gpus in _gpus_by(HOLDING_STATES).items():
        r = row(gpu)
        r.held_by_jobs = whole(r.held_by_jobs + gpus)
        r.by_team[team] = whole(r.by_team.get(team, 0) + gpus)
    if not held_only:
        # A queued job of one type counts under it; one of several types under each of
        # them, apart ("any of"): it has no type until the plan admits it.
        for types, gpus in _queued_by_types().items():
            if len(types) == 1:
                r = row(types[0])
                r.queued_demand = whole(r.queued_demand + gpus)
            else:
                for gpu in types:
                    r = row(gpu)
                    r.queued_any_of = whole(r.queued_any_of + gpus)
        for gpu_type, nominal in guaranteed_by_type().items():
            row(gpu_type).guaranteed = nominal
    for r in rows.values():
        r.by_node.sort(key=lambda n: str(n["name"]))
    return sorted(rows.values(), key=lambda r: r.gpu_type), error


def guaranteed_by_type() -> dict[str, int]:
    """The nominals the fleet has given per GPU type: its top-level teams' and
    departments' (a department's own row, or its teams' sum; docs/scheduling.md, "Quotas
    in a tree: what admins write and see"), so a team's quota is not counted again in
    its department's."""
    parents: dict[str, str | None] = {}
    rows = {}
    # One query: each team with each of its quota rows (none: one line of NULLs).
    for team, parent, gpu_type, nominal in Team.objects.values_list(
            "slug", "parent__slug", "quotas__gpu_type__slug", "quotas__nominal"):
        parents[team] = parent
        if gpu_type is not None:
            rows[(team, gpu_type)] = QuotaLimit(nominal, None, None)
    tree = QuotaTree(parents, rows, {})  # no capacity: the root's own part is -(given)
    return {g: -tree.own[(ROOT, g)] for g in sorted(tree.types)}


def overcommit_warnings(rows: list[CapacityRow]) -> list[str]:
    return [
        f"Guaranteed {r.gpu_type} quotas ({r.guaranteed} GPUs) exceed the cluster's "
        f"{r.open_capacity} {r.gpu_type} GPUs"
        + (f" that take new work ({r.draining_capacity} more are on draining clusters, "
           "rule K8)" if r.draining_capacity else "")
        + ": not every team can get its nominal quota at once."
        for r in rows if r.overcommitted
    ]
