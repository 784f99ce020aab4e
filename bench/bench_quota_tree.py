"""Quota tree benchmark (docs/scheduling.md, "Quotas in a tree", rules Q3-Q7).

Question: what does the quota tree cost one planning pass? A 100,000-queued pass
with 100 teams in a 3-level tree (4 divisions > 5 departments each > 5 teams each,
quota rows at every level, borrowing limits at the divisions and the teams, lending
limits at some departments and teams) against the very same jobs and team quotas
with no department (the flat ledger of rule Q1, the fast path). 2 GPU types of 250
8-GPU nodes, 60 % busy with low-tier jobs; queued jobs over 3 tiers; up to 32 victim
searches per pass.
  BENCH calibration_1M_loop        a plain 1M-iteration loop: the machine's speed now
  BENCH quota_tree_flat_p50 / _max seconds per pass, no department (5 passes)
  BENCH quota_tree_tree_p50 / _max seconds per pass, the 3-level tree (5 passes)
  BENCH quota_tree_*_cpu_p50       the same in CPU seconds of this process
  BENCH quota_tree_ratio           tree p50 / flat p50 (wall)
  BENCH quota_tree_tree_peak_alloc tracemalloc peak of one tree pass (MB)

Run: `.venv/bin/python bench/bench_quota_tree.py` from the repo root (about a minute).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
import tracemalloc
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note  # noqa: E402  (bench/ is sys.path[0])

from queueing.policy.admission import Plan, plan_admissions  # noqa: E402
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
TYPES = ("t0", "t1")
NODES_PER_TYPE, GPUS_PER_NODE = 250, 8
DIVISIONS, DEPARTMENTS, TEAMS = 4, 5, 5  # per level: 4 × 5 × 5 = 100 teams


def tree(divisions: int = DIVISIONS, departments: int = DEPARTMENTS, teams_per: int = TEAMS,
         capacity: dict[str, int] | None = None,
         ) -> tuple[dict[str, str | None], dict[tuple[str, str], QuotaLimit], list[str]]:
    """The parents, the quota rows of every level and the leaf teams. Per type of
    `capacity` (default: this bench's 2,000 GPUs of each of TYPES): each division its
    share of the type (borrowing limit a fifth of it), each department 90 % of its
    division's share split evenly (lending limit two thirds of it at every other one),
    each team 8/9 of its department's (borrowing limit half of it; lending limit half
    of it at every third). The default: 500/100, 90/60, 16/8/8."""
    cap = capacity or dict.fromkeys(TYPES, NODES_PER_TYPE * GPUS_PER_NODE)
    parent: dict[str, str | None] = {}
    quotas: dict[tuple[str, str], QuotaLimit] = {}
    teams: list[str] = []
    for d in range(divisions):
        div = f"div-{d}"
        parent[div] = None
        for t, c in cap.items():
            quotas[(div, t)] = QuotaLimit(c // divisions, c // divisions // 5, None)
        for e in range(departments):
            dept = f"{div}.dept-{e}"
            parent[dept] = div
            for t, c in cap.items():
                n = c // divisions * 9 // 10 // departments
                quotas[(dept, t)] = QuotaLimit(n, None, n * 2 // 3 if e % 2 else None)
            for k in range(teams_per):
                team = f"{dept}.team-{k}"
                parent[team] = dept
                teams.append(team)
                for t, c in cap.items():
                    n = max(1, c // divisions * 9 // 10 // departments * 8 // 9 // teams_per)
                    quotas[(team, t)] = QuotaLimit(n, max(1, n // 2),
                                                   max(1, n // 2) if k % 3 == 0 else None)
    return parent, quotas, teams


def snapshot(seed: int = 42) -> Snapshot:
    rnd = random.Random(seed)
    parent, quotas, teams = tree()
    nodes: list[NodeState] = []
    running: list[RunningJob] = []
    job_id = 1
    for t in TYPES:
        for i in range(NODES_PER_TYPE):
            name, used = f"{t}-{i:03d}", 0
            while used < GPUS_PER_NODE * 0.6:
                g = rnd.choice((1, 2, 4))
                if used + g > GPUS_PER_NODE:
                    break
                running.append(RunningJob(
                    id=job_id, team=rnd.choice(teams), gpu_type=t, gpus_per_replica=g,
                    replicas=1, tier_rank=rnd.choice((0, 0, 100)), preemptible=True,
                    started_at=NOW - timedelta(hours=rnd.uniform(0.1, 9)),
                    min_runtime_seconds=rnd.choice((0, 600)), nodes=(name,)))
                job_id += 1
                used += g
            nodes.append(NodeState(name, t, GPUS_PER_NODE, GPUS_PER_NODE - used))
    queued = tuple(
        QueuedJob(id=1_000_000 + i, team=rnd.choice(teams), gpu_type=rnd.choice(TYPES),
                  gpus_per_replica=rnd.choice((1, 1, 2, 4, 8)),
                  replicas=rnd.choice((1, 1, 1, 2, 4)), tier_rank=rnd.choice((0, 100, 100, 200)),
                  submitted_at=NOW - timedelta(seconds=rnd.uniform(0, 7 * 86400)))
        for i in range(100_000))
    usage = {t: rnd.expovariate(1 / 50.0) for t in teams}
    state = FairShareState(usage, {t: 1 / len(teams) for t in teams})
    return Snapshot(
        now=NOW, nodes=tuple(nodes), queued=queued, running=tuple(running), quotas=quotas,
        fair_share_state=state, priority_weights=PriorityWeights(),
        billing_weights=dict.fromkeys(TYPES, 1.0), interval_seconds=3.0,
        preemption=PreemptionSettings(max_per_team=20, max_searches=32),
        team_parent=parent)


def flat(s: Snapshot) -> Snapshot:
    """The same jobs and team rows, no department."""
    teams = {t for t, p in s.team_parent.items() if p is not None and
             not any(q == t for q in s.team_parent.values())}
    return replace(s, team_parent=dict.fromkeys(teams),
                   quotas={k: q for k, q in s.quotas.items() if k[0] in teams})


def passes(snapshots: dict[str, Snapshot], n: int = 5) -> dict[str, list[float]]:
    """`n` timed passes of each snapshot, interleaved (a loaded machine slows both
    alike), after one warm-up each."""
    for s in snapshots.values():
        plan_admissions(s)
    times: dict[str, list[float]] = {name: [] for name in snapshots}
    for _ in range(n):
        for name, s in snapshots.items():
            t, c = time.perf_counter(), time.process_time()
            plan_admissions(s)
            times[name].append(time.perf_counter() - t)
            times[f"{name}_cpu"] = [*times.get(f"{name}_cpu", []), time.process_time() - c]
    return times


def words(plan: Plan) -> str:
    reasons: dict[str, int] = {}
    for w in plan.waits.values():
        reasons[w.reason.value] = reasons.get(w.reason.value, 0) + 1
    return (f"{len(plan.admissions)} admitted, {len(plan.preemptions)} preempting, "
            f"waits {dict(sorted(reasons.items()))}")


def calibration() -> float:
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        x = 0
        for i in range(1_000_000):
            x += i
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    bench("calibration_1M_loop", calibration(), "s")
    t = time.perf_counter()
    s_tree = snapshot()
    s_flat = flat(s_tree)
    note(f"built the snapshots in {time.perf_counter() - t:.2f} s: {len(s_tree.running)} "
         f"running, {len(s_tree.queued)} queued, {len(s_flat.team_parent)} teams, "
         f"{len(s_tree.team_parent)} nodes in the tree")
    for name, s in (("flat", s_flat), ("tree", s_tree)):
        note(f"{name}: {words(plan_admissions(s))}")
    times = passes({"flat": s_flat, "tree": s_tree})
    for name in ("flat", "tree"):
        bench(f"quota_tree_{name}_p50", statistics.median(times[name]), "s")
        bench(f"quota_tree_{name}_max", max(times[name]), "s")
        bench(f"quota_tree_{name}_cpu_p50", statistics.median(times[f"{name}_cpu"]), "s")
    bench("quota_tree_ratio", statistics.median(times["tree"]) / statistics.median(times["flat"]),
          "x")
    tracemalloc.start()
    plan_admissions(s_tree)
    bench("quota_tree_tree_peak_alloc", tracemalloc.get_traced_memory()[1] / 2**20, "MB")
    tracemalloc.stop()


if __name__ == "__main__":
    main()
