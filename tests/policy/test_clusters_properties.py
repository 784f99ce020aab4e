"""Rules K1, K4, K7 over random snapshots of several clusters with spot pools
(hypothesis): no admission or preemption spans two clusters, no job without `spot_ok`
lands on a spot node, a job lands only in a cluster it allows, node capacity holds, and
the same snapshot gives the same plan."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from queueing.policy.admission import plan_admissions
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)

from .clusters_world import NO_AGE, NOW

CLUSTERS = ("a", "b", "c")
TYPES = ("h100", "a100")


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    rnd = random.Random(draw(st.integers(0, 2**32)))
    nodes: list[NodeState] = []
    free: dict[str, int] = {}
    for cluster in CLUSTERS[: draw(st.integers(1, 3))]:
        for gt in TYPES:
            for spot in (False, True):
                for i in range(rnd.choice((0, 1, 2, 3))):
                    cap = rnd.choice((4, 8))
                    name = f"{cluster}/{'s' if spot else 'n'}-{gt}-{i}"
                    nodes.append(NodeState(name, gt, cap, cap, cluster=cluster, spot=spot))
                    free[name] = cap
    if not nodes:
        nodes.append(NodeState("a/n-h100-0", "h100", 8, 8, cluster="a"))
        free["a/n-h100-0"] = 8
    by_pool: dict[tuple[str, str, bool], list[str]] = defaultdict(list)
    for n in nodes:
        by_pool[(n.cluster, n.gpu_type, n.spot)].append(n.name)
    running: list[RunningJob] = []
    for job_id in range(1, rnd.randrange(0, 14) + 1):
        (cluster, gt, spot), names = rnd.choice(sorted(by_pool.items()))
        g = rnd.choice((1, 2, 4))
        room = [n for n in names if free[n] >= g]
        if not room:
            continue
        n = rnd.choice(room)
        free[n] -= g
        running.append(RunningJob(
            id=job_id, team=rnd.choice("xyz"), gpu_type=gt, gpus_per_replica=g, replicas=1,
            tier_rank=rnd.choice((0, 100)), preemptible=rnd.random() < 0.8,
            started_at=NOW - timedelta(minutes=rnd.randrange(1, 600)), nodes=(n,),
            cluster=cluster))
    nodes = [NodeState(n.name, n.gpu_type, n.capacity, free[n.name], cluster=n.cluster,
                       spot=n.spot) for n in nodes]
    queued = []
    for k in range(rnd.randrange(1, 25)):
        allowed = None
        if rnd.random() < 0.4:
            allowed = frozenset(rnd.sample(CLUSTERS, rnd.randrange(1, 3)))
        queued.append(QueuedJob(
            id=100 + k, team=rnd.choice("xyz"), gpu_type=rnd.choice(TYPES),
            gpus_per_replica=rnd.choice((1, 2, 4, 8)), replicas=rnd.choice((1, 1, 2, 3)),
            tier_rank=rnd.choice((0, 100, 200)),
            submitted_at=NOW - timedelta(seconds=rnd.randrange(10_000)), clusters=allowed,
            spot_ok=rnd.random() < 0.5))
    quotas = {(t, gt): QuotaLimit(nominal=rnd.choice((0, 4, 8)),
                                  borrowing_limit=rnd.choice((None, 8, 16)))
              for t in "xyz" for gt in TYPES}
    return Snapshot(now=NOW, nodes=tuple(nodes), queued=tuple(queued), running=tuple(running),
                    quotas=quotas, priority_weights=NO_AGE,
                    cluster_ranks={c: rnd.randrange(3) for c in CLUSTERS},
                    preemption=PreemptionSettings(lost_per_wait=None))


@settings(max_examples=150, deadline=None)
@given(snapshots())
def test_no_admission_spans_two_clusters_nor_puts_a_job_without_spot_ok_on_spot(
        snap: Snapshot) -> None:
    plan = plan_admissions(snap)
    node = {n.name: n for n in snap.nodes}
    queued = {q.id: q for q in snap.queued}
    used: dict[str, int] = defaultdict(int)
    for a in plan.admissions:
        q = queued[a.job_id]
        clusters = {node[n].cluster for n in a.placement}
        assert clusters == {a.cluster}  # rule K1
        assert len({node[n].spot for n in a.placement}) == 1  # one kind
        assert q.spot_ok or not any(node[n].spot for n in a.placement)  # rule K4
        assert q.clusters is None or a.cluster in q.clusters  # rule K3
        assert all(node[n].gpu_type == q.gpu_type for n in a.placement)
        for n in a.placement:
            used[n] += q.gpus_per_replica
    running = {r.id: r for r in snap.running}
    for p in plan.preemptions:
        q = queued[p.preemptor_id]
        assert {node[n].cluster for n in p.placement} == {p.cluster}
        assert {running[v.job_id].cluster for v in p.victims} == {p.cluster}  # rule K7
        assert q.spot_ok or not any(node[n].spot for n in p.placement)
        assert q.clusters is None or p.cluster in q.clusters
    for n, gpus in used.items():
        assert gpus <= node[n].free
    assert plan_admissions(snap) == plan
