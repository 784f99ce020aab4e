"""The 100k scheduler cycle with 10 % of the queued jobs accepting two GPU types
(docs/scheduling.md, rules G1-G5), alternated with the same cycle as it is.

Question: what does it cost the plan of `bench_cycle.py --only 100k`'s cycle (100,000
queued and 10,000 running one-GPU jobs of 100 teams on 1,250 nodes × 8 h100) when one
queued job in ten accepts ("h100", "a100")?

How it works
  * One world is built as `bench_cycle.py` builds it (PostgreSQL: $DATABASE_URL; the
    bench empties the job tables of that database).
  * The scheduler's `plan_admissions` is wrapped: in the "two types" cycles the wrapper
    rewrites the cycle's snapshot before planning - every tenth queued job (by id)
    accepts ("h100", "a100"), and the snapshot gains 125 nodes × 8 a100, all held by
    1,000 running one-GPU a100 jobs (10 per team, no a100 quota rows: they borrow), so
    a job accepting a100 finds it full too and is tried on both types (the worst case:
    no replay of waits for it). The rewrite is outside the timings below; the snapshot
    builder that reads a job's accepted types from the database is not this bench's.
  * Cycles alternate plain, two, two, plain, ... each after `bench_cycle.churn`.
  * Per variant: the p50 of the plan's wall and CPU time (the process's, inside the
    wrapper: `plan_admissions` alone) and of the cycle's steps summed, less the rewrite.

Output: `BENCH <name> <value> <unit>`. Run:
`DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> .venv/bin/python
bench/bench_cycle_two_types.py [--cycles 12]`.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import bench_cycle as bc  # noqa: E402  (bench/ is sys.path[0])
from _common import bench, note  # noqa: E402

A100_NODES = 125


def two_types(snapshot: Any) -> Any:
    """The snapshot with every tenth queued job accepting ("h100", "a100") and a full
    a100 pool (see the module's docstring)."""
    from queueing.policy.snapshot import NodeState, RunningJob

    queued = tuple(replace(j, gpu_types=("h100", "a100")) if j.id % 10 == 0 else j
                   for j in snapshot.queued)
    nodes = tuple(NodeState(f"a100-{i}", "a100", 8, 0) for i in range(A100_NODES))
    teams = sorted({j.team for j in snapshot.queued})
    started = snapshot.now - timedelta(minutes=10)
    running = tuple(RunningJob(10_000_000 + k, teams[k % len(teams)], "a100", 1, 1, 200,
                               started_at=started, nodes=(f"a100-{k // 8}",))
                    for k in range(A100_NODES * 8))
    return replace(snapshot, queued=queued, nodes=snapshot.nodes + nodes,
                   running=snapshot.running + running)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=12)
    args = parser.parse_args()
    bc.setup()
    import queueing.services.scheduler as sched
    from queueing.policy.admission import plan_admissions
    from queueing.services.scheduler import scheduler_cycle

    plan_wall: dict[str, list[float]] = {"plain": [], "two": []}
    plan_cpu: dict[str, list[float]] = {"plain": [], "two": []}
    rewrite: list[float] = []
    counts: list[int] = []

    def wrapped(name: str) -> Any:
        def run(snapshot: Any) -> Any:
            if name == "two":
                t = time.perf_counter()
                snapshot = two_types(snapshot)
                rewrite.append(time.perf_counter() - t)
                counts.append(sum(1 for j in snapshot.queued if j.gpu_types))
            c, t = time.process_time(), time.perf_counter()
            plan = plan_admissions(snapshot)
            plan_wall[name].append(time.perf_counter() - t)
            plan_cpu[name].append(time.process_time() - c)
            return plan
        return run

    bc.use_cluster(f"{bc.BIG_RUNNING // 8}x8xh100")
    now = datetime.now(UTC)
    t = time.perf_counter()
    bc.build_world(now, teams=bc.BIG_TEAMS, queued=bc.BIG_QUEUED + bc.BIG_RUNNING,
                   nominal=100, borrowing=100, sizes=(1,), replicas=(1,))
    bc.start_running(now - timedelta(minutes=10), bc.BIG_RUNNING)
    bc.vacuum()
    note(f"built the world in {time.perf_counter() - t:.0f} s")
    scheduler_cycle(now=now)
    cycle: dict[str, list[float]] = {"plain": [], "two": []}
    loads = []
    for k in range(1, args.cycles + 1):
        name = ("plain", "two", "two", "plain")[k % 4]
        sched.plan_admissions = wrapped(name)
        at = now + timedelta(seconds=k)
        bc.churn(at, k)
        done = len(rewrite)
        r = scheduler_cycle(now=at)
        spent = sum(r.timings[s] for s in bc.STEPS) - sum(rewrite[done:])
        cycle[name].append(spent)
        gc.collect()
        loads.append(os.getloadavg()[0])
        note(f"cycle {k} {name}: plan {plan_wall[name][-1] * 1000:.0f} ms wall, "
             f"{plan_cpu[name][-1] * 1000:.0f} ms CPU; cycle {spent * 1000:.0f} ms; "
             f"load {loads[-1]:.2f}")
    for v in ("plain", "two"):
        bench(f"cycle_two_types_100k_{v}_p50", statistics.median(cycle[v]), "s")
        bench(f"cycle_two_types_100k_{v}_plan_p50", statistics.median(plan_wall[v]) * 1000, "ms")
        bench(f"cycle_two_types_100k_{v}_plan_cpu_p50",
              statistics.median(plan_cpu[v]) * 1000, "ms")
    note(f"jobs accepting two types per two-type cycle: {min(counts)}-{max(counts)}; "
         f"rewrite {statistics.median(rewrite) * 1000:.0f} ms (not counted); load average "
         f"{min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
