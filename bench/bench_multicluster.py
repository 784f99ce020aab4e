"""Admission across several clusters and spot pools (docs/scheduling.md, rules K1-K7;
the several-cluster goal: "an admission pass over 5 clusters, 10,000 GPUs, 100,000 queued jobs under
1 s").

Times the PURE POLICY, `plan_admissions(snapshot)`, on a snapshot built in memory (no
database), like bench_admission.py's `cycle_100k`:
  - 5 clusters (cost ranks 0, 0, 1, 1, 2), 1,250 nodes of 8 GPUs = 10,000 GPUs over 4
    GPU types; the last cluster ("cloud-spot") has half its nodes in spot pools;
  - about 65 % of the GPUs busy with 5,000+ running jobs of 1-2 GPUs, each in its
    node's cluster;
  - 100,000 queued jobs of 1,000 teams over 3 tiers, 1-8 GPUs × 1-4 replicas: 20 % pinned
    to one cluster, 10 % selecting two, the lowest tier (and 10 % of the others, as
    allow_spot) may use spot nodes.
Lines:
  BENCH calibration_1M_loop               a plain 1M-iteration loop: the machine's speed now
  BENCH multicluster_plan_100k_p50 / _p95 / _min   seconds per pass (9 passes)
  BENCH multicluster_plan_100k_cpu_p50 / _cpu_min  the same in CPU seconds of the process
  BENCH multicluster_plan_100k_peak_alloc tracemalloc peak of one pass (MB)
  BENCH multicluster_plan_100k_admitted   admissions of one pass (the same every pass)
Goal: p50 under 1 s.

Run: `.venv/bin/python bench/bench_multicluster.py` from the repo root (about a minute).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
import tracemalloc
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note  # noqa: E402  (bench/ is sys.path[0])

from queueing.policy.admission import plan_admissions  # noqa: E402
from queueing.policy.fairshare import FairShareState  # noqa: E402
from queueing.policy.priority import PriorityWeights  # noqa: E402
from queueing.policy.snapshot import (  # noqa: E402
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
CLUSTERS = {"onprem-a": 0, "onprem-b": 0, "cloud-east": 1, "cloud-west": 1, "cloud-spot": 2}
TYPES = ("h100", "a100", "l40s", "t4")
NODES_PER_CLUSTER = 250  # 5 × 250 × 8 = 10,000 GPUs
GPUS_PER_NODE = 8
TEAMS = 1000
QUEUED = 100_000
PASSES = 9


def snapshot_multicluster(seed: int = 42) -> Snapshot:
    rnd = random.Random(seed)
    nodes: list[NodeState] = []
    running: list[RunningJob] = []
    job_id = 1
    for cluster in CLUSTERS:
        for i in range(NODES_PER_CLUSTER):
            gt = TYPES[i % len(TYPES)]
            spot = cluster == "cloud-spot" and i % 2 == 1
            name = f"{cluster}/{'spot' if spot else 'node'}-{i:03d}"
            used = 0
            while used < GPUS_PER_NODE * 0.65:
                g = rnd.choice((1, 1, 2))
                tier = 0 if spot else rnd.choice((0, 0, 100))
                running.append(RunningJob(
                    id=job_id, team=f"team-{rnd.randrange(TEAMS)}", gpu_type=gt,
                    gpus_per_replica=g, replicas=1, tier_rank=tier, preemptible=True,
                    started_at=NOW - timedelta(hours=rnd.uniform(0.1, 9)),
                    min_runtime_seconds=rnd.choice((0, 600)), nodes=(name,), cluster=cluster))
                job_id += 1
                used += g
            nodes.append(NodeState(name, gt, GPUS_PER_NODE, GPUS_PER_NODE - used,
                                   cluster=cluster, spot=spot))
    names = sorted(CLUSTERS)
    queued = []
    for i in range(QUEUED):
        tier = rnd.choice((0, 100, 100, 200))
        r = rnd.random()
        clusters = None
        if r < 0.2:
            clusters = frozenset((rnd.choice(names),))
        elif r < 0.3:
            clusters = frozenset(rnd.sample(names, 2))
        queued.append(QueuedJob(
            id=1_000_000 + i, team=f"team-{rnd.randrange(TEAMS)}", gpu_type=rnd.choice(TYPES),
            gpus_per_replica=rnd.choice((1, 1, 2, 4, 8)), replicas=rnd.choice((1, 1, 1, 2, 4)),
            tier_rank=tier, submitted_at=NOW - timedelta(seconds=rnd.uniform(0, 7 * 86400)),
            clusters=clusters, spot_ok=tier == 0 or rnd.random() < 0.1))
    quotas = {(f"team-{k}", t): QuotaLimit(nominal=2, borrowing_limit=6, lending_limit=None)
              for k in range(TEAMS) for t in TYPES}
    usage = {f"team-{k}": rnd.expovariate(1 / 50.0) for k in range(TEAMS)}
    state = FairShareState(usage, {f"team-{k}": 1 / TEAMS for k in range(TEAMS)})
    return Snapshot(
        now=NOW, nodes=tuple(nodes), queued=tuple(queued), running=tuple(running),
        quotas=quotas, fair_share_state=state, priority_weights=PriorityWeights(),
        billing_weights={t: 1.0 + i for i, t in enumerate(TYPES)}, interval_seconds=3.0,
        preemption=PreemptionSettings(max_per_team=20, max_searches=32),
        cluster_ranks=CLUSTERS,
    )


def calibrate() -> None:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        x = 0
        for i in range(1_000_000):
            x += i
        best = min(best, time.perf_counter() - t)
    bench("calibration_1M_loop", best, "s")


def main() -> None:
    calibrate()
    t = time.perf_counter()
    snap = snapshot_multicluster()
    note(f"built the snapshot in {time.perf_counter() - t:.2f} s: {len(snap.queued)} queued, "
         f"{len(snap.running)} running, {len(snap.nodes)} nodes in {len(CLUSTERS)} clusters, "
         f"{sum(n.capacity for n in snap.nodes)} GPUs ({sum(n.free for n in snap.nodes)} free, "
         f"{sum(n.capacity for n in snap.nodes if n.spot)} spot)")
    times, cpu = [], []
    plan = None
    for _ in range(PASSES):
        t, c = time.perf_counter(), time.process_time()
        plan = plan_admissions(snap)
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
    assert plan is not None
    node = {n.name: n for n in snap.nodes}
    queued = {q.id: q for q in snap.queued}
    for a in plan.admissions:  # rules K1, K4 hold in the timed plan too
        assert {node[n].cluster for n in a.placement} == {a.cluster}
        assert queued[a.job_id].spot_ok or not any(node[n].spot for n in a.placement)
    per_cluster = Counter(a.cluster for a in plan.admissions)
    on_spot = sum(1 for a in plan.admissions if node[a.placement[0]].spot)
    reasons = Counter(str(w.reason) for w in plan.waits.values())
    note(f"one pass: {len(plan.admissions)} admitted ({dict(sorted(per_cluster.items()))}; "
         f"{on_spot} on spot nodes), {len(plan.preemptions)} preemptions, "
         f"{len(plan.waits)} waiting; waits by reason {dict(sorted(reasons.items()))}")
    tracemalloc.start()
    plan_admissions(snap)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    times.sort()
    bench("multicluster_plan_100k_p50", statistics.median(times), "s")
    bench("multicluster_plan_100k_p95", times[min(len(times) - 1, round(0.95 * (len(times) - 1)))],
          "s")
    bench("multicluster_plan_100k_min", times[0], "s")
    # CPU time of the process: on a machine shared with other work (the 2-core box the
    # figures in docs come from runs at load 6-9) the wall time mostly measures waiting.
    bench("multicluster_plan_100k_cpu_p50", statistics.median(cpu), "s")
    bench("multicluster_plan_100k_cpu_min", min(cpu), "s")
    bench("multicluster_plan_100k_peak_alloc", peak / 2**20, "MB")
    bench("multicluster_plan_100k_admitted", len(plan.admissions), "jobs")


if __name__ == "__main__":
    main()
