"""The cluster view: what web and API processes know of the cluster, without being a
cluster client (docs/kubernetes.md, "RBAC" and "What the web knows of the cluster").

The worker publishes it at the end of every scheduler cycle
(`queueing.services.cluster_view.cluster_view_publish`) into the shared cache: the nodes
with their capacity and free GPUs, the live workload names (rule R8 in "why it waits"),
and the teams whose namespace is not provisioned.
Web processes read it (`cluster_view`) for submit validation, dashboards, the queue plan
and the preview. It is as old as the last cycle (seconds while the worker runs);
`stale` says when it is older than FAIRQ_CLUSTER_VIEW_STALE_SECONDS.

The in-process simulated cluster is no cluster client: before a worker published
anything (tests, a fresh demo) it is read directly.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import Q
from django.utils import timezone

from queueing.backends.base import ClusterBackend, NodeInfo
from queueing.composition import backend_class, get_backend
from queueing.memo import ttl_memo
from queueing.models import Cluster, ClusterBackendKind, GpuType, NodePool
from queueing.policy.workspace import replicas_when_empty

VIEW_KEY = "fairq:cluster-view"  # written by services/cluster_view.py, read here


# --- the clusters (docs/clusters.md, rules K1-K8) -------------------------------------------

@dataclass(frozen=True, slots=True)
class PoolFacts:
    """A `NodePool` as the cycle uses it: the nodes of `gpu_type` carrying `node_labels`."""

    name: str
    gpu_type: str
    spot: bool
    node_labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClusterFacts:
    """A `Cluster` row as the cycle and the snapshot use it (a few rows, read every
    refresh of the active jobs: an edited label or rank counts at once)."""

    id: int
    name: str
    enabled: bool
    cost_rank: int
    labels: Mapping[str, str] = field(default_factory=dict)
    pools: tuple[PoolFacts, ...] = ()

    def carries(self, selector: Mapping[str, str]) -> bool:
        """Rule K3: every label of `selector` is one of this cluster's."""
        return all(self.labels.get(k) == v for k, v in selector.items())


def clusters_facts() -> dict[int, ClusterFacts]:
    """Every `Cluster` row (enabled or not: a running job's cluster may have been
    disabled since) by id, with its node pools; {} when there is none, the one implicit
    cluster of settings. Two queries."""
    rows = list(Cluster.objects.values_list("id", "name", "enabled", "cost_rank", "labels"))
    if not rows:
        return {}
    pools: dict[int, list[PoolFacts]] = {}
    for cluster_id, name, gpu_type, spot, labels in NodePool.objects.values_list(
            "cluster_id", "name", "gpu_type__slug", "spot", "node_labels"):
        pools.setdefault(cluster_id, []).append(
            PoolFacts(name, gpu_type, spot, _labels(labels)))
    return {pk: ClusterFacts(pk, name, enabled, cost_rank, _labels(labels),
                             tuple(pools.get(pk, ())))
            for pk, name, enabled, cost_rank, labels in rows}


def _labels(value: object) -> dict[str, str]:
    """A labels column as a flat dict of strings (a malformed one reads as no labels)."""
    if not isinstance(value, dict):
        return {}
    return {str(k): str(v) for k, v in value.items()}


def node_pool(cluster: ClusterFacts, *, gpu_type: str,
              labels: Mapping[str, str] | None = None) -> PoolFacts | None:
    """A node's pool (docs/clusters.md, "Node pools"): the cluster's pool of the node's
    GPU type whose `node_labels` the node carries, the one naming the most labels when
    several do; None when there is none. `labels`: the node's labels (None: the backend
    does not report them, and only a pool naming no labels matches)."""
    have = labels or {}
    fits = [p for p in cluster.pools if p.gpu_type == gpu_type
            and all(have.get(k) == v for k, v in p.node_labels.items())]
    return max(fits, key=lambda p: (len(p.node_labels), p.name), default=None)


def node_of_cluster(node: NodeInfo, *, cluster: str, facts: ClusterFacts) -> NodeInfo:
    """A cluster's node as fairq reports it (the fleet, the published view): its
    cluster's name, its pool's name (rule C4), and spot when the backend says so or its
    pool is a spot pool (docs/clusters.md, "Node pools")."""
    pool = node_pool(facts, gpu_type=node.gpu_type, labels=node.labels)
    return replace(node, cluster=cluster, spot=node.spot or bool(pool and pool.spot),
                   pool=pool.name if pool else "")


@dataclass(frozen=True, slots=True)
class Reachability:
    """Rule K5: whether the scheduler could read a cluster at its last cycle."""

    cluster: str
    reachable: bool
    unreachable_since: datetime | None = None
    last_seen_at: datetime | None = None
    error: str = ""

    def to_list(self) -> list[Any]:
        return [self.cluster, self.reachable,
                self.unreachable_since.isoformat() if self.unreachable_since else None,
                self.last_seen_at.isoformat() if self.last_seen_at else None, self.error]

    @classmethod
    def from_list(cls, raw: list[Any]) -> Reachability:
        def at(i: int) -> datetime | None:
            return datetime.fromisoformat(raw[i]) if len(raw) > i and raw[i] else None

        return cls(str(raw[0]), bool(raw[1]), at(2), at(3),
                   str(raw[4]) if len(raw) > 4 and raw[4] else "")


def clusters_reachability() -> list[Reachability]:
    """Rule K5, per cluster the scheduler reads (enabled, or disabled and still draining:
    rule K8), from the database (what it recorded at its last cycle): for metrics and
    pages of any process. [] with no `Cluster` row."""
    return [Reachability(name, since is None, since, seen)
            for name, since, seen in Cluster.objects.filter(
                Q(enabled=True) | Q(drained_at__isnull=True)).values_list(
                "name", "unreachable_since", "last_seen_at")]


@dataclass(frozen=True)
class ClusterView:
    """A copy of the cluster as the worker last saw it. `published_at` None: nothing was
    published (then `error` says why and `nodes` is empty). With several clusters
    (docs/clusters.md) `node_list` is every reachable cluster's nodes, each with its
    `cluster` (a draining one's too: its real capacity and use), `clusters` says which
    clusters could be read (rule K5) and `closed` which take no new work (rule K8: the
    plan's `Snapshot.closed_clusters`). What new work may use - the submit checks, rule
    P1's cluster size, the arrays' window, the start estimates - is `open_nodes`."""

    node_list: tuple[NodeInfo, ...] = ()
    workloads: frozenset[str] = frozenset()
    unprovisioned: frozenset[str] = frozenset()
    published_at: datetime | None = None
    error: str = ""
    clusters: tuple[Reachability, ...] = ()
    closed: frozenset[str] = frozenset()

    def nodes(self) -> list[NodeInfo]:
        return list(self.node_list)

    def open_nodes(self) -> list[NodeInfo]:
        """Rule K8, as the plan applies it (`Snapshot.open_nodes`): the nodes new work
        may be placed on - every node but those of a closed cluster."""
        closed = self.closed
        return [n for n in self.node_list if not closed or n.cluster not in closed]

    def unprovisioned_teams(self, teams: Iterable[str]) -> set[str]:
        return set(teams) & self.unprovisioned

    def total_gpus(self) -> float:
        """GPUs on the nodes new work may use (the cluster size rule P1's size factor
        divides by, as the plan counts it: rule K8), in GPU-equivalents: a node of a
        type with several slices or MIG instances per GPU counts its units / S (rule
        H4)."""
        per_gpu = dict(GpuType.objects.filter(slices_per_gpu__gt=1)
                       .values_list("slug", "slices_per_gpu"))
        return sum(n.capacity / per_gpu.get(n.gpu_type, 1) if per_gpu else n.capacity
                   for n in self.open_nodes())

    def largest_node_gpus(self) -> dict[str, int]:
        """Per GPU type, the GPUs of its largest node new work may use (rule K8)."""
        sizes: dict[str, int] = {}
        for n in self.open_nodes():
            sizes[n.gpu_type] = max(sizes.get(n.gpu_type, 0), n.capacity)
        return sizes

    def largest_node_cpu_memory(self) -> dict[str, tuple[int | None, int | None]]:
        """Per GPU type, the most CPU (millicores) and memory (bytes) one of its nodes new
        work may use can allocate; None for one no such node of the type reports (rules
        A6, K8)."""
        out: dict[str, tuple[int | None, int | None]] = {}
        for n in self.open_nodes():
            cpu, memory = out.get(n.gpu_type, (None, None))
            if n.cpu_millicores is not None:
                cpu = max(cpu or 0, n.cpu_millicores)
            if n.memory_bytes is not None:
                memory = max(memory or 0, n.memory_bytes)
            out[n.gpu_type] = (cpu, memory)
        return out

    def age_seconds(self, now: datetime) -> float | None:
        return None if self.published_at is None else (now - self.published_at).total_seconds()

    def stale(self, now: datetime) -> str:
        """"" when fresh; else a sentence for the page."""
        if self.published_at is None:
            return self.error
        age = self.age_seconds(now) or 0.0
        if age > settings.FAIRQ_CLUSTER_VIEW_STALE_SECONDS:
            return (f"the cluster view is {age:.0f} s old: the scheduler has not finished a "
                    "cycle since (is the worker running?)")
        return ""

    def to_dict(self) -> dict[str, Any]:
        return {"nodes": [[n.name, n.gpu_type, n.capacity, n.allocated, n.cpu_millicores,
                           n.cpu_allocated, n.memory_bytes, n.memory_allocated,
                           dict(n.topology), n.spot, n.cluster, n.pool]
                          for n in self.node_list],
                "workloads": sorted(self.workloads), "unprovisioned": sorted(self.unprovisioned),
                "published_at": self.published_at.isoformat() if self.published_at else None,
                "clusters": [c.to_list() for c in self.clusters],
                "closed": sorted(self.closed)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ClusterView:
        at = raw.get("published_at")
        return cls(node_list=tuple(_node_from_list(n) for n in raw.get("nodes") or ()),
                   workloads=frozenset(raw.get("workloads") or ()),
                   unprovisioned=frozenset(raw.get("unprovisioned") or ()),
                   published_at=datetime.fromisoformat(at) if at else None,
                   clusters=tuple(Reachability.from_list(c) for c in raw.get("clusters") or ()),
                   closed=frozenset(str(c) for c in raw.get("closed") or ()))


def _node_from_list(n: list[Any]) -> NodeInfo:
    """One node of `ClusterView.to_dict`; a view published before CPU, memory and
    topology were (4 fields) reads as "not known", before spot and cluster (9) as on-demand
    capacity of the only cluster, before its pool (11) as in no pool."""
    def opt(i: int) -> int | None:
        return None if len(n) <= i or n[i] is None else int(n[i])

    topology = n[8] if len(n) > 8 and isinstance(n[8], dict) else {}
    return NodeInfo(str(n[0]), str(n[1]), int(n[2]), int(n[3]),
                    cpu_millicores=opt(4), cpu_allocated=opt(5) or 0,
                    memory_bytes=opt(6), memory_allocated=opt(7) or 0,
                    topology={str(k): str(v) for k, v in topology.items()},
                    spot=bool(n[9]) if len(n) > 9 else False,
                    cluster=str(n[10]) if len(n) > 10 and n[10] else "",
                    pool=str(n[11]) if len(n) > 11 and n[11] else "")


def cluster_view_of(backend: ClusterBackend, *, now: datetime,
                    workloads: Iterable[str] | None = None,
                    unprovisioned: Iterable[str] = (),
                    clusters: Iterable[Reachability] = (),
                    closed: Iterable[str] = ()) -> ClusterView:
    nodes = tuple(backend.nodes())
    if workloads is None:
        workloads = [s.name for s in backend.statuses(now=now)]
    return ClusterView(node_list=nodes, workloads=frozenset(workloads),
                       unprovisioned=frozenset(unprovisioned), published_at=now,
                       clusters=tuple(clusters), closed=frozenset(closed))


def _merged_view(rows: list[Cluster], *, now: datetime) -> ClusterView:
    """The in-process clusters of `rows` as one view, as the worker would publish it
    (a disabled one, still draining, closed: rule K8)."""
    facts = clusters_facts()
    nodes: list[NodeInfo] = []
    workloads: set[str] = set()
    for row in rows:
        backend = get_backend(row)
        nodes.extend(node_of_cluster(n, cluster=row.name, facts=facts[row.pk])
                     for n in backend.nodes())
        workloads |= {s.name for s in backend.statuses(now=now)}
    return ClusterView(node_list=tuple(nodes), workloads=frozenset(workloads),
                       published_at=now,
                       clusters=tuple(Reachability(r.name, True) for r in rows),
                       closed=frozenset(r.name for r in rows if not r.enabled))


def cluster_view(*, now: datetime | None = None) -> ClusterView:
    """The last published view (never a call to the cluster, except to the in-process
    simulated one before anything was published)."""
    raw = cache.get(VIEW_KEY)
    if raw is not None:
        return ClusterView.from_dict(raw)
    # The clusters the cycle reads: enabled, or disabled and still draining (rule K8).
    rows = list(Cluster.objects.filter(Q(enabled=True) | Q(drained_at__isnull=True))
                .order_by("cost_rank", "name"))
    if rows and all(r.backend == ClusterBackendKind.SIMULATED for r in rows):
        # Several in-process clusters (the demo): theirs, each node with its cluster.
        try:
            return _merged_view(rows, now=now or timezone.now())
        except Exception as exc:
            return ClusterView(error=str(exc)[:200])
    if not rows and backend_class().in_process:
        try:
            return cluster_view_of(get_backend(), now=now or timezone.now())
        except Exception as exc:  # a page says why instead of failing
            return ClusterView(error=str(exc)[:200])
    return ClusterView(error="the scheduler has not published a view of the cluster yet "
                             "(is the worker running?)")


class _NotPublished(Exception):
    """Raised, not returned, so the memo keeps no "unknown" answer."""


@ttl_memo(5)
def _largest_node_sizes() -> dict[str, int]:
    view = cluster_view()
    if view.published_at is None and view.error:
        raise _NotPublished(view.error)
    return view.largest_node_gpus()


@ttl_memo(5)
def _largest_node_cpu_memory() -> dict[str, tuple[int | None, int | None]]:
    view = cluster_view()
    if view.published_at is None and view.error:
        raise _NotPublished(view.error)
    return view.largest_node_cpu_memory()


def largest_node_cpu_memory(gpu_type: str) -> tuple[int | None, int | None] | None:
    """The most CPU (millicores) and memory (bytes) a node of `gpu_type` can allocate,
    each None when no node says (rule A6), from the cluster view like
    `largest_node_gpus`; None when no view was published yet."""
    try:
        return _largest_node_cpu_memory().get(gpu_type, (None, None))
    except _NotPublished:
        return None


def largest_node_gpus(gpu_type: str) -> int | None:
    """GPUs on the largest node of `gpu_type` (0 when the cluster has none), from the
    cluster view (kept 5 s in each process, queueing/memo.py); None when no view was
    published yet (nothing is known)."""
    try:
        return _largest_node_sizes().get(gpu_type, 0)
    except _NotPublished:
        return None


@dataclass(frozen=True, slots=True)
class GangRoom:
    """Rules A3, K1, K4, K8 at submit: the most replicas of one size the nodes new work
    may use hold when empty, in the one pool (a cluster, spot or not) that holds the most;
    `cluster` and `spot` say which ("" for the one implicit cluster), `gpus` its GPUs;
    `largest_node` the GPUs of the largest node of all the pools the job may use."""

    replicas: int
    cluster: str
    spot: bool
    gpus: int
    largest_node: int = 0


@ttl_memo(5)
def _open_pools() -> tuple[dict[str, dict[tuple[str, bool], tuple[int, ...]]], frozenset[str],
                           frozenset[str]]:
    """Per GPU type, per pool (cluster, spot) of the nodes new work may use (rule K8), the
    GPUs of each node; the clusters the scheduler could not read at its last cycle (rule
    K5: their nodes are not in the view, so nothing is known of them); and the clusters
    with a node in the view."""
    view = cluster_view()
    if view.published_at is None and view.error:
        raise _NotPublished(view.error)
    pools: dict[str, dict[tuple[str, bool], list[int]]] = {}
    for n in view.open_nodes():
        pools.setdefault(n.gpu_type, {}).setdefault((n.cluster, n.spot), []).append(n.capacity)
    unread = frozenset(c.cluster for c in view.clusters if not c.reachable)
    return ({gt: {k: tuple(sizes) for k, sizes in by_pool.items()}
             for gt, by_pool in pools.items()}, unread,
            frozenset(n.cluster for n in view.node_list))


def gang_room(gpu_type: str, gpus: int, *, clusters: frozenset[str] | None,
              spot_ok: bool, expected: frozenset[str] = frozenset()) -> GangRoom | None:
    """The most replicas of `gpus` GPUs of `gpu_type` one pool the job may use holds when
    its nodes are empty (`sum(capacity // gpus)`, rule A3's count; one cluster and one
    kind, rules K1, K4; `clusters` None: any), from the published cluster view (kept 5 s
    per process). None when nothing is known: no view published yet, or a cluster the
    job may use could not be read (rule K5) or, of `expected` (the enabled clusters it
    may use, as the database has them), has no node in the view at all. GPUs only: CPU,
    memory and topology (rules A6, A7) are checked apart or left to the plan's wait."""
    try:
        return _gang_room(gpu_type, gpus, clusters, spot_ok, expected)
    except _NotPublished:
        return None


@ttl_memo(5)
def _gang_room(gpu_type: str, gpus: int, clusters: frozenset[str] | None, spot_ok: bool,
               expected: frozenset[str]) -> GangRoom | None:
    """`gang_room`, kept 5 s per process per shape on top of the 5 s of the pools it
    reads (a change reaches submit within 10 s; a fleet of 1,000 nodes took 0.36 ms a
    call unkept)."""
    pools, unread, seen = _open_pools()
    if unread and (clusters is None or clusters & unread):
        return None
    if expected - seen:
        return None
    best, largest = GangRoom(0, "", False, 0), 0
    for (cluster, spot), sizes in sorted(pools.get(gpu_type, {}).items()):
        if (clusters is not None and cluster not in clusters) or (spot and not spot_ok):
            continue
        largest = max(largest, *sizes)
        held = sum(replicas_when_empty(size, gpus) for size in sizes)  # rule A3
        if held > best.replicas:
            best = GangRoom(held, cluster, spot, sum(sizes))
    return replace(best, largest_node=largest)


def cluster_nodes() -> tuple[list[NodeInfo], frozenset[str], str]:
    """The nodes of the published cluster view (a draining cluster's too), the clusters
    that take no new work (rule K8: `ClusterView.closed`), and a sentence when the view
    is missing or stale (a page shows it instead of failing)."""
    view = cluster_view()
    return view.nodes(), view.closed, view.stale(timezone.now())[:200]
