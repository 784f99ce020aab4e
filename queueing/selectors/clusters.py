"""The clusters as the API, the CLI, the web pages and /metrics read them
(docs/scheduling.md, "Clusters and spot capacity", rules K1-K8).

A `Cluster` row says what the cluster is (backend, labels, cost rank, enabled), whether
the scheduler reached it last (`unreachable_since`) and, disabled, whether it has
drained (rule K8: `drained_at`); its capacity is the
published cluster view's (queueing/selectors/cluster.py): the nodes whose
`NodeInfo.cluster` is its name, with `NodeInfo.spot` telling spot capacity apart. So a
web process never calls a cluster. With no `Cluster` row fairq runs on one implicit
cluster configured by settings: it is listed as one entry named "" (`implicit`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.db.models import Count, QuerySet, Sum
from django.utils import timezone

from queueing.backends.base import NodeInfo
from queueing.backends.simulated import SimulatedClusterError, parse_node_spec
from queueing.errors import NotFound
from queueing.memo import ttl_memo
from queueing.models import Cluster, ClusterBackendKind, Job, NodePool
from queueing.policy.states import HOLDING_STATES

from .cluster import cluster_view
from .gpu_share import DEVICE_SHARE, whole
from .lookups import gpu_types_by_slug


@dataclass
class GpuTypeCapacity:
    """One GPU type of one cluster: its nodes, GPUs and free GPUs as the cluster view
    reports them, the part of them on spot nodes (rule K4), and the GPUs fairq's jobs
    placed in the cluster hold."""

    gpu_type: str
    nodes: int = 0
    # GPUs (a MIG type: instances); a time-sliced or MPS type's nodes report slices,
    # counted here as GPUs (slices / slices per GPU: shared GPUs).
    capacity: int | float = 0
    free: int | float = 0
    spot_capacity: int | float = 0
    spot_free: int | float = 0
    held_by_jobs: int | float = 0

    @property
    def used(self) -> int | float:
        return self.capacity - self.free

    @property
    def percent_used(self) -> int:
        return round(100 * (self.capacity - self.free) / self.capacity) if self.capacity else 0


@dataclass
class ClusterSummary:
    """One cluster for the pages and the API: its row's facts and its capacity."""

    name: str
    backend: str
    labels: dict[str, str]
    enabled: bool
    cost_rank: int
    unreachable_since: datetime | None
    last_seen_at: datetime | None
    implicit: bool = False  # the settings' one cluster (no Cluster row exists)
    drained_at: datetime | None = None  # rule K8
    gpu_types: list[GpuTypeCapacity] = field(default_factory=list)
    nodes: list[NodeInfo] = field(default_factory=list)
    pools: list[NodePool] = field(default_factory=list)
    running_jobs: int = 0
    # Staff only (the API and pages hide them from others): how fairq reaches it.
    kubeconfig: str = ""
    context: str = ""
    in_cluster: bool = False
    sim_nodes: str = ""

    @property
    def reachable(self) -> bool:
        return self.unreachable_since is None

    @property
    def state(self) -> str:
        """Rule K8: `enabled`, `draining` (disabled; `running_jobs` still there) or
        `drained` (disabled, nothing left there)."""
        return _state(enabled=self.enabled, drained_at=self.drained_at)

    @property
    def draining(self) -> bool:
        return self.state == DRAINING

    @property
    def capacity(self) -> int | float:
        return whole(sum(g.capacity for g in self.gpu_types))

    @property
    def free(self) -> int | float:
        return whole(sum(g.free for g in self.gpu_types))

    @property
    def spot_capacity(self) -> int | float:
        return whole(sum(g.spot_capacity for g in self.gpu_types))


# Rule K8: a cluster's states as the API, the pages and the admin name them.
ENABLED, DRAINING, DRAINED = "enabled", "draining", "drained"
CLUSTER_STATES = (ENABLED, DRAINING, DRAINED)


def _state(*, enabled: bool, drained_at: datetime | None) -> str:
    if enabled:
        return ENABLED
    return DRAINING if drained_at is None else DRAINED


def cluster_state(cluster: Cluster) -> str:
    """Rule K8: `enabled`; `draining` - disabled, the scheduler still reads it for the
    jobs there and gives it no new work; `drained` - disabled, the scheduler found
    nothing left there (`drained_at`) and reads it no more."""
    return _state(enabled=cluster.enabled, drained_at=cluster.drained_at)


def cluster_state_words(cluster: Cluster) -> str:
    """`cluster_state` for a page, with the jobs a draining cluster still holds ("draining:
    2 jobs still there"; one query then)."""
    state = cluster_state(cluster)
    if state != DRAINING:
        return state
    n = Job.objects.filter(cluster=cluster, status__in=sorted(HOLDING_STATES)).count()
    return f"{DRAINING}: {n} job{'s' if n != 1 else ''} still there"


def node_short_name(node: NodeInfo) -> str:
    """The node's own name: the policy may qualify it as "<cluster>/<node>" (CONTEXT's
    naming); pages show the cluster once, above its nodes."""
    prefix = f"{node.cluster}/"
    return node.name[len(prefix):] if node.cluster and node.name.startswith(prefix) \
        else node.name


def cluster_summaries(*, nodes: Iterable[NodeInfo] | None = None) -> tuple[list[ClusterSummary], str]:
    """Every cluster, lowest cost rank first (rule K2's order), then by name, with its
    capacity per GPU type from `nodes` (default: the published cluster view), and a
    sentence when the view is missing or stale. Nodes of no known cluster (a view
    published before the cluster rows, or the implicit cluster's) are listed under an
    implicit entry named "". Three queries, whatever the number of clusters."""
    error = ""
    if nodes is None:
        view = cluster_view()
        nodes, error = view.nodes(), view.stale(timezone.now())[:200]
    rows = list(Cluster.objects.all())
    by_name = {c.name: _summary(c) for c in rows}
    if not rows:
        by_name[""] = ClusterSummary(name="", backend="", labels={}, enabled=True,
                                     cost_rank=0, unreachable_since=None, last_seen_at=None,
                                     implicit=True)
    by_id = {c.pk: by_name[c.name] for c in rows}
    for pool in NodePool.objects.select_related("gpu_type").order_by("cluster_id", "name"):
        owner = by_id[pool.cluster_id]
        owner.pools.append(pool)
        _gpu_type(owner, pool.gpu_type.slug)  # a pool's type is listed, nodes or not
    per_gpu = {slug: t.units_per_device for slug, t in gpu_types_by_slug().items()}
    for node in nodes:
        summary = by_name.get(node.cluster)
        if summary is None:
            summary = by_name.setdefault("", ClusterSummary(
                name="", backend="", labels={}, enabled=True, cost_rank=0,
                unreachable_since=None, last_seen_at=None, implicit=True))
        summary.nodes.append(node)
        row = _gpu_type(summary, node.gpu_type)
        per = per_gpu.get(node.gpu_type, 1)
        row.nodes += 1
        row.capacity = whole(row.capacity + node.capacity / per)
        row.free = whole(row.free + node.free / per)
        if node.spot:
            row.spot_capacity = whole(row.spot_capacity + node.capacity / per)
            row.spot_free = whole(row.spot_free + node.free / per)
    # The jobs holding GPUs, per cluster (None: the implicit one) and GPU type.
    held = (Job.objects.filter(status__in=sorted(HOLDING_STATES))
            .values_list("cluster_id", "gpu_type__slug").order_by()
            .annotate(jobs=Count("id"), gpus=Sum(DEVICE_SHARE)))
    for cluster_id, gpu_type, jobs, gpus in held:
        summary = by_id.get(cluster_id) if cluster_id is not None else by_name.get("")
        if summary is not None:
            summary.running_jobs += int(jobs)
            row = _gpu_type(summary, gpu_type)
            row.held_by_jobs = whole(row.held_by_jobs + (gpus or 0))
    out = sorted(by_name.values(), key=lambda s: (s.implicit, s.cost_rank, s.name))
    for s in out:
        s.gpu_types.sort(key=lambda g: g.gpu_type)
        s.nodes.sort(key=lambda n: n.name)
    return out, error


def _summary(c: Cluster) -> ClusterSummary:
    return ClusterSummary(name=c.name, backend=c.backend, labels=dict(sorted((c.labels or {}).items())),
                          enabled=c.enabled, cost_rank=c.cost_rank,
                          unreachable_since=c.unreachable_since, last_seen_at=c.last_seen_at,
                          drained_at=c.drained_at, kubeconfig=c.kubeconfig,
                          context=c.context, in_cluster=c.in_cluster, sim_nodes=c.sim_nodes)


def _gpu_type(summary: ClusterSummary, gpu_type: str) -> GpuTypeCapacity:
    for row in summary.gpu_types:
        if row.gpu_type == gpu_type:
            return row
    row = GpuTypeCapacity(gpu_type)
    summary.gpu_types.append(row)
    return row


def cluster_get(*, name: str) -> Cluster:
    """The cluster named `name`; NotFound (404) otherwise."""
    cluster = Cluster.objects.filter(name=name).first()
    if cluster is None:
        raise NotFound(f"cluster {name[:40]!r} not found")
    return cluster


def node_pool_get(*, cluster: Cluster, name: str) -> NodePool:
    pool = NodePool.objects.select_related("cluster", "gpu_type") \
        .filter(cluster=cluster, name=name).first()
    if pool is None:
        raise NotFound(f"node pool {name[:63]!r} of cluster {cluster.name} not found")
    return pool


@dataclass(frozen=True)
class SubmitClusterFacts:
    """What rule K3's submit check needs of one cluster, kept a few seconds per process
    (queueing/memo.py): a submit naming no cluster reads none of it."""

    name: str
    enabled: bool
    labels: dict[str, str]
    gpu_types: frozenset[str]  # of its pools, its simulated nodes and its published nodes


@ttl_memo(5)
def submit_cluster_facts() -> dict[str, SubmitClusterFacts]:
    """Every cluster by name with the GPU types it has nodes of: declared by its node
    pools or its `sim_nodes`, or seen on its nodes in the published cluster view (any of
    them: the submit check refuses only what no source knows of). Empty with no
    `Cluster` rows."""
    rows = list(Cluster.objects.all())
    if not rows:
        return {}
    types: dict[str, set[str]] = {c.name: set() for c in rows}
    names = {c.pk: c.name for c in rows}
    for cluster_id, slug in NodePool.objects.values_list("cluster_id", "gpu_type__slug"):
        types[names[cluster_id]].add(slug)
    for c in rows:
        if c.backend == ClusterBackendKind.SIMULATED and c.sim_nodes:
            # Refused when saved; an older row's error is the scheduler's to report.
            with contextlib.suppress(SimulatedClusterError):
                types[c.name].update(p.gpu_type for p in parse_node_spec(c.sim_nodes))
    try:
        published = cluster_view().node_list
    except Exception:  # a view that cannot be read knows nothing more
        published = ()
    for node in published:
        if node.cluster in types:
            types[node.cluster].add(node.gpu_type)
    return {c.name: SubmitClusterFacts(c.name, c.enabled, dict(c.labels or {}),
                                 frozenset(types[c.name])) for c in rows}


@ttl_memo(5)
def _cluster_names() -> dict[int, str]:
    return dict(Cluster.objects.values_list("pk", "name"))


def clusters_configured() -> bool:
    """Whether any `Cluster` row exists (a per-process memo of a few seconds): pages skip
    the per-cluster reads of an installation running on its one implicit cluster."""
    return bool(_cluster_names())


def cluster_name(cluster_id: int | None) -> str | None:
    """The name of the cluster with this id (a job's `cluster_id` or
    `requested_cluster_id`), from a per-process memo: a page of jobs reads no cluster
    row. None for None."""
    if cluster_id is None:
        return None
    name = _cluster_names().get(cluster_id)
    if name is None:  # created since the memo was filled
        name = Cluster.objects.filter(pk=cluster_id).values_list("name", flat=True).first()
    return name


def cluster_choices() -> list[tuple[str, str]]:
    """(name, label) of the enabled clusters, for the submit form's cluster choice."""
    return [(c.name, c.name + (f" ({', '.join(f'{k}={v}' for k, v in sorted(c.labels.items()))})"
                               if c.labels else ""))
            for c in Cluster.objects.filter(enabled=True)]


def node_pools_of(*, cluster: Cluster) -> QuerySet[NodePool]:
    """The cluster's node pools by name, each with its GPU type."""
    return cluster.pools.select_related("gpu_type").order_by("name")
