"""Stage 2, flavor assignment: the pools of nodes (one GPU type, one cluster, spot or
not: rules K1, K4) a job may use (rule K3), in rule K2's order, and which of them hold
its gang at all, their nodes empty (rules A4, A6, A7)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from queueing.policy.snapshot import QueuedJob, Topology, TopologyMode
from queueing.policy.workspace import Capacity

from .waits import CODE, IN_ONE_DOMAIN, WaitReason

if TYPE_CHECKING:
    from .state import Pass, Step, Try

_NO_FIT = CODE[WaitReason.NO_FIT]


def pools_for(p: Pass, job: QueuedJob, gpu_type: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Rules K3, K4: the pools of `gpu_type` the job may use (its clusters; spot nodes
    only when `spot_ok`) and the others, each in pool-key order."""
    k = (gpu_type, job.clusters, job.spot_ok)
    sets = p.pool_sets.get(k)
    if sets is None:
        info = p.pool_info
        every = p.cap.pools_of_type.get(gpu_type, ())
        allowed = tuple(q for q in every
                        if (job.clusters is None or info[q][1] in job.clusters)
                        and (job.spot_ok or not info[q][2]))
        sets = p.pool_sets[k] = (allowed, tuple(q for q in every if q not in allowed))
    return sets


def k2_order(p: Pass, pools: tuple[str, ...], job_id: int) -> tuple[str, ...]:
    """Rule K2: the lowest cluster rank first, then the cluster with the most free GPUs
    of the type, then its name; within a cluster spot nodes first (rule K4: a job that
    may use them prefers them). A nominated preemptor (rule A5) first tries the pool its
    preemption planned. Memoized until the capacity changes."""
    cap, info, ranks = p.cap, p.pool_info, p.snapshot.cluster_ranks
    planned = p.snapshot.nominated_placement.get(job_id) if p.nominated else None
    if not planned:
        seen_order = p.k2_seen.get(pools)
        if seen_order is not None and seen_order[0] == cap.changes:
            return seen_order[1]
    first_pool = cap.node_pool.get(planned[0], "") if planned else ""
    free = {q: cap.cluster_free(q) for q in pools}
    ordered = tuple(sorted(pools, key=lambda q: (
        q != first_pool, ranks.get(info[q][1], 0), -free[q], info[q][1], not info[q][2])))
    if not planned:
        p.k2_seen[pools] = (cap.changes, ordered)
    return ordered


def static_of(p: Pass, t: Try) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...],
                                         tuple[int, int, int]]:
    """Rules K1, K3, K4, A4: the pools the try may use, the others, of the first those
    that hold the gang when empty, and when none does the wait (`holding`). Static for
    the pass (what empty nodes hold): memoized per static key."""
    static = p.statics.get(t.skey)
    if static is None:
        job = t.job
        pools, excluded = pools_for(p, job, t.gt)
        static = p.statics[t.skey] = (pools, excluded, *holding(
            p.cap, job, pools, excluded, job.gpus_per_replica, job.replicas, t.cpu, t.mem,
            job.topology))
    return static


def assign(p: Pass, t: Try) -> Step | None:
    """Rules A4, K1, K3, K4: the try's pools - the wait when none it may use holds its
    gang even empty (a node too small for one replica first), else None with the pools
    that do (`fitting`) and the others (`excluded`) set on the try."""
    if t.job.gpus_per_replica > p.largest.get(t.gt, 0):
        p.raw[t.job.id] = (_NO_FIT, t.index, 0, 0)
        return (_NO_FIT, 0, 0, "")
    _pools, t.excluded, t.fitting, unheld = static_of(p, t)
    if not t.fitting:
        p.raw[t.job.id] = (unheld[0], t.index, unheld[1], unheld[2])
        return (*unheld, "")
    t.pool = t.fitting[0]
    return None


def unheld_anywhere(p: Pass, t: Try) -> tuple[int, int, int] | None:
    """Rules A4, K1, K3: the wait of a try no pool it may use holds even with its nodes
    empty (as `static_of` finds it), or None."""
    if t.job.gpus_per_replica > p.largest.get(t.gt, 0):
        return (_NO_FIT, 0, 0)
    static = static_of(p, t)
    return None if static[2] else static[3]


def never_holds(cap: Capacity, pool: str, gpus: int, replicas: int, cpu: int, memory: int,
                 topology: Topology | None) -> tuple[int, int] | None:
    """Rules A4, A6, A7 on one pool (rule K1): None when its nodes, empty, hold the gang;
    else (the most replicas they hold, `IN_ONE_DOMAIN` when it is one domain that
    cannot)."""
    if gpus > cap.pool_largest.get(pool, 0):
        return (0, 0)
    if (replicas > 1 or cpu or memory) and replicas > (
            slots := cap.slots_when_empty(pool, gpus, cpu, memory)):
        return (slots, 0)
    if topology is not None and topology.mode is TopologyMode.REQUIRED and replicas > (
            slots := cap.domain_slots_when_empty(pool, topology.level, gpus, cpu, memory)):
        return (slots, IN_ONE_DOMAIN)
    return None


def holding(cap: Capacity, job: QueuedJob, pools: tuple[str, ...], excluded: tuple[str, ...],
             gpus: int, replicas: int, cpu: int, memory: int, topology: Topology | None,
             ) -> tuple[tuple[str, ...], tuple[int, int, int]]:
    """Rules A4, K1, K3: the `pools` whose empty nodes hold the gang; when none does, the
    wait as (reason code, replicas held, flag): `cluster` when the job names clusters
    none of which has nodes of its type, or when an `excluded` pool would hold it; else
    `gang_does_not_fit`."""
    fitting, fail = holding_pools(cap, pools, gpus, replicas, cpu, memory, topology)
    if fitting:
        return fitting, (0, 0, 0)
    if (job.clusters is not None and not pools) or any(
            never_holds(cap, p, gpus, replicas, cpu, memory, topology) is None
            for p in excluded):
        return (), (CODE[WaitReason.CLUSTER], 0, 0)
    if fail is None:
        return (), (CODE[WaitReason.NO_FIT], 0, 0)
    return (), (CODE[WaitReason.NO_FIT], fail[0], fail[1])


def holding_pools(cap: Capacity, pools: tuple[str, ...], gpus: int, replicas: int, cpu: int,
                   memory: int, topology: Topology | None,
                   ) -> tuple[tuple[str, ...], tuple[int, int] | None]:
    """Rule K1: the `pools` whose nodes, empty, hold the whole gang, and for none the
    failure (`never_holds`) of the one that holds the most replicas."""
    fitting: list[str] = []
    worst: tuple[int, int] | None = None
    for p in pools:
        fail = never_holds(cap, p, gpus, replicas, cpu, memory, topology)
        if fail is None:
            fitting.append(p)
        elif worst is None or fail[0] > worst[0]:
            worst = fail
    return tuple(fitting), worst

