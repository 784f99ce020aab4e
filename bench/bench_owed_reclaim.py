"""Owed claims in `bench/bench_throughput.py`'s world, as a pure pass (docs/performance.md,
"A fleet of 5,000 nodes: admissions per second", "Why a cycle decided for minutes").

The world of the throughput bench after a cycle recorded a large batch of ends: 5,000
nodes x 8 h100 (whole GPUs, one type, one cluster), 200 teams in a flat forest each with
a quota of 200 GPUs borrowing up to the whole cluster, `--running` one-GPU jobs of the
three tiers held unevenly by the teams (a team's share drawn as a random weight
squared, so about a quarter of the teams borrow), the rest of the GPUs free, and 50,000
queued one-GPU jobs of random teams and tiers. Once the free GPUs are admitted, every
queued job of a team below its nominal quota is an owed claim (rule R11) whose GPUs are
held by borrowers: it searches for victims whatever the search budget (a product
decision: a team within its quota gets its GPUs within a cycle plus grace).

  BENCH owed_reclaim_<running>k_off_cpu       the pass with preemption off, CPU seconds
  BENCH owed_reclaim_<running>k_on_cpu        with preemption on
  BENCH owed_reclaim_<running>k_before_cpu    with preemption on, every one-GPU claim's
                                              search building and weighing its levels
                                              (`preemption._ONE = False`, `--before`)
  BENCH owed_reclaim_<running>k_unkept_cpu    with preemption on, every one-GPU claim's
                                              level set up per search and rule R11's
                                              borrowed GPUs summed again per preemption
                                              (`preemption._KEPT = owed._KEPT = False`,
                                              `--unkept`)
  BENCH owed_reclaim_<running>k_general_cpu   with preemption on, every one-GPU claim
                                              asking CPU or memory (rule A6) building and
                                              weighing its levels
                                              (`preemption._ONE_A6 = False`, `--general`)
  BENCH owed_reclaim_<running>k_preemptions   preemptions the pass planned
  BENCH owed_reclaim_<running>k_ms_per_preemption CPU per planned preemption (preemption on)
  BENCH calibration_1M_loop                   the machine's speed now (load beside)

`--before` runs the pass with `preemption._ONE = False` between the two, in the same
process, and asserts its plan equals the one with preemption on. `--unkept` runs
"unkept" and "on" alternated `--repeats` times after "off" (each line once per run), and
asserts their plans equal; `--general` the same with "general". `--memory`: the nodes
report CPU and memory as the simulated cluster's do (12 CPUs and 128 GiB a GPU) and
every job asks 64 GiB, as the throughput bench's (the names get `_a6`); `--queued N`
queued jobs instead of 50,000 (the names get `_<N>kq`).

Run: `.venv/bin/python bench/bench_owed_reclaim.py [--running 25000] [--seed 1] [--profile]
[--before] [--unkept [--repeats 2]] [--memory [--general]] [--queued 50000]`
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note  # noqa: E402  (bench/ is sys.path[0])
from bench_admission import calibrate  # noqa: E402

from queueing.policy import preemption  # noqa: E402
from queueing.policy.admission import plan_admissions  # noqa: E402
from queueing.policy.snapshot import (  # noqa: E402
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)
from queueing.policy.stages import owed  # noqa: E402

NODES, GPUS, TEAMS, NOMINAL, QUEUED = 5000, 8, 200, 200, 50_000
TIERS = (0, 100, 200)


# `--memory`: what the simulated cluster's nodes report (12 CPUs and 128 GiB a GPU, rule
# A6) and the memory every job of the throughput bench asks.
CPU_PER_GPU, MEMORY_PER_GPU, JOB_MEMORY = 12_000, 128 * 2**30, 64 * 2**30


def world(running: int, seed: int, *, preempt: bool, memory: bool = False,
          queued_n: int = QUEUED) -> Snapshot:
    rnd = random.Random(seed)
    mem = JOB_MEMORY if memory else None
    now = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)
    teams = [f"team-{k}" for k in range(TEAMS)]
    weights = [rnd.random() ** 2 for _ in teams]
    names = [f"sim-h100-{i:04d}" for i in range(NODES)]
    free = dict.fromkeys(names, GPUS)
    held: list[RunningJob] = []
    for j in range(running):
        node = names[j // GPUS]
        free[node] -= 1
        held.append(RunningJob(1_000_000 + j, rnd.choices(teams, weights)[0], "h100", 1, 1,
                               rnd.choice(TIERS),
                               started_at=now - timedelta(seconds=rnd.uniform(0, 20)),
                               nodes=(node,), memory_bytes=mem))
    queued = tuple(QueuedJob(i, rnd.choice(teams), "h100", 1, 1, rnd.choice(TIERS),
                             now - timedelta(seconds=rnd.uniform(0, 3600)), memory_bytes=mem)
                   for i in range(queued_n))

    def node(n: str) -> NodeState:
        if not memory:
            return NodeState(n, "h100", GPUS, free[n])
        used = GPUS - free[n]
        return NodeState(n, "h100", GPUS, free[n], cpu_free=GPUS * CPU_PER_GPU,
                         memory_free=GPUS * MEMORY_PER_GPU - used * JOB_MEMORY,
                         cpu_allocatable=GPUS * CPU_PER_GPU,
                         memory_allocatable=GPUS * MEMORY_PER_GPU)

    return Snapshot(now=now, nodes=tuple(node(n) for n in names),
                    queued=queued, running=tuple(held),
                    quotas={(t, "h100"): QuotaLimit(NOMINAL, NODES * GPUS) for t in teams},
                    preemption=PreemptionSettings(enabled=preempt))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--running", type=int, default=25_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--before", action="store_true")
    ap.add_argument("--unkept", action="store_true")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--queued", type=int, default=QUEUED)
    ap.add_argument("--general", action="store_true")
    args = ap.parse_args()
    calibrate()
    k = f"{args.running // 1000}k"
    if args.queued != QUEUED:
        k += f"_{args.queued // 1000}kq"
    if args.memory:
        k += "_a6"
    plans = {}
    modes = ["off", "before", "on"] if args.before else ["off", "on"]
    if args.unkept:
        modes = ["off"] + ["unkept", "on"] * args.repeats
    if args.general:
        modes = ["off"] + ["general", "on"] * args.repeats
    for mode in modes:
        preempt = mode != "off"
        s = world(args.running, args.seed, preempt=preempt, memory=args.memory,
                  queued_n=args.queued)
        prof = cProfile.Profile() if args.profile and preempt else None
        preemption._ONE = mode != "before"
        preemption._KEPT = owed._KEPT = mode != "unkept"
        preemption._ONE_A6 = mode != "general"
        t, wall = time.process_time(), time.perf_counter()
        if prof is not None:
            prof.enable()
        plan = plans[mode] = plan_admissions(s)
        if prof is not None:
            prof.disable()
        cpu, wall = time.process_time() - t, time.perf_counter() - wall
        preemption._ONE = preemption._KEPT = owed._KEPT = preemption._ONE_A6 = True
        bench(f"owed_reclaim_{k}_{mode}_cpu", cpu, "s")
        bench(f"owed_reclaim_{k}_{mode}_wall", wall, "s")
        note(f"load average {Path('/proc/loadavg').read_text().split()[0]}")
        for a, b in (("unkept", "on"), ("general", "on")):
            if mode in (a, b) and {a, b} <= plans.keys():
                assert plans[a] == plans[b], "the plans differ"
        if mode in ("before", "unkept", "general"):
            if prof is not None:
                pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(20)
            continue
        note(f"preemption {mode}: {len(plan.admissions)} admitted, "
             f"{len(plan.preemptions)} preemptions")
        if preempt:
            bench(f"owed_reclaim_{k}_preemptions", len(plan.preemptions), "preemptions")
            if plan.preemptions:
                bench(f"owed_reclaim_{k}_ms_per_preemption", 1000 * cpu / len(plan.preemptions),
                      "ms")
        if prof is not None:
            pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(20)
    if args.before:
        assert plans["before"] == plans["on"], "the plans differ"
        note("plans equal with and without `preemption._ONE`")
    if args.unkept:
        note("plans equal with and without `preemption._KEPT`, `owed._KEPT`")
    if args.general:
        note("plans equal with and without `preemption._ONE_A6`")
    calibrate()


if __name__ == "__main__":
    main()
