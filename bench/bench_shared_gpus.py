"""Shared GPUs benchmark (docs/scheduling.md, "Shared GPUs", rules H1-H3).

Question: how long does one pure planning pass take when a GPU type is time-sliced and
its queue is mostly fractions? Goal: under 1 s for 10,000 queued jobs on 1,000 GPUs.

  * 125 nodes × 8 GPUs of a time-sliced type, 4 slices per GPU (4,000 slices), half the
    GPUs already shared by running quarters and halves, a tenth held whole.
  * 10,000 queued jobs of 50 teams: 70 % one slice, 20 % two, 10 % one whole GPU.
    BENCH shared_plan_10k_p50 / _max   seconds per `plan_admissions` (5 passes)
    BENCH shared_plan_10k_admitted     admissions of one pass
  * The same with 1,000 nodes (8,000 GPUs, 32,000 slices) and 100,000 queued.
    BENCH shared_plan_100k_p50 / _max

Run: `.venv/bin/python bench/bench_shared_gpus.py` (no database).
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from queueing.policy.admission import plan_admissions
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    RunningJob,
    Snapshot,
)

NOW = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
S = 4
TYPE = "ts-a10"


def world(nodes: int, queued: int, seed: int = 7) -> Snapshot:
    rnd = random.Random(seed)
    node_states: list[NodeState] = []
    running: list[RunningJob] = []
    rid = 10_000_000
    for k in range(nodes):
        name = f"ts-{k:04d}"
        free = [S] * 8
        for i in range(8):
            r = rnd.random()
            if r < 0.1:
                free[i] = 0
                running.append(RunningJob(rid, f"t{rid % 50}", TYPE, S, 1, 0, nodes=(name,),
                                          gpu_slots=(i,), started_at=NOW - timedelta(hours=1)))
                rid += 1
            elif r < 0.6:
                for units in rnd.choice([(1,), (2,), (1, 1), (2, 1), (1, 1, 1)]):
                    free[i] -= units
                    running.append(RunningJob(rid, f"t{rid % 50}", TYPE, units, 1, 0,
                                              nodes=(name,), gpu_slots=(i,),
                                              started_at=NOW - timedelta(hours=1)))
                    rid += 1
        node_states.append(NodeState(name, TYPE, 8 * S, sum(free), slices_per_gpu=S,
                                     gpu_free=tuple(free)))
    jobs = []
    for j in range(queued):
        r = rnd.random()
        units = 1 if r < 0.7 else 2 if r < 0.9 else S
        jobs.append(QueuedJob(j + 1, f"t{j % 50}", TYPE, units, 1, 100,
                              NOW - timedelta(seconds=queued - j)))
    return Snapshot(now=NOW, nodes=tuple(node_states), queued=tuple(jobs),
                    running=tuple(running), preemption=PreemptionSettings(enabled=False),
                    units_per_gpu={TYPE: S})


def bench(name: str, snap: Snapshot, passes: int = 5) -> None:
    times = []
    admitted = 0
    for _ in range(passes):
        t = time.perf_counter()
        plan = plan_admissions(snap)
        times.append(time.perf_counter() - t)
        admitted = len(plan.admissions)
    print(f"BENCH {name}_p50 {statistics.median(times):.4f} s")
    print(f"BENCH {name}_max {max(times):.4f} s")
    print(f"BENCH {name}_admitted {admitted} jobs")


def main() -> None:
    bench("shared_plan_10k", world(125, 10_000))
    bench("shared_plan_100k", world(1000, 100_000), passes=3)


if __name__ == "__main__":
    main()
