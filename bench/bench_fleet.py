"""A fleet of 5,000 nodes: the baseline (docs/performance.md, "A fleet of 5,000 nodes").

Question: where does the pure planning pass (`plan_admissions` on a `Snapshot`, rules
O1, Q1-Q7, A1-A9, R1-R11, H1-H6) stand at ten times today's size, before any work on
it? Goals of that work: a full cycle p50 <= 1 s and p99 <= 3 s, worker RSS <= 2 GB,
time and memory growing at most linearly from 100k to 1M queued.

The world, the same at every size but the queue:
  * 5,000 nodes of 8 GPUs = 40,000 GPUs of 4 types: 1,250 nodes each of h100, a100 and
    l40s (whole GPUs, 85 % busy) and 1,250 nodes of a10, time-sliced 8 ways (rule H1:
    80,000 slices).
  * 150,000 running jobs. 40,000 GPUs cannot hold 150,000 jobs of whole GPUs, so the
    whole types hold what fits (13,676 jobs of 1-4 GPUs) and the rest are
    fractions (1-2 slices) on the time-sliced type, which they fill to the brim.
  * 1,000 teams in a 3-level tree (10 divisions x 10 departments x 10 teams), quota rows
    at every level and type, borrowing and lending limits (bench_quota_tree.tree).
  * N queued jobs (100k, 250k, 500k, 1M) of those teams over 3 tiers, types in
    equal parts per type.
  * Preemption (rules R1-R11) OFF in the timed passes: with it on, one pass with only
    1,000 queued took 129 s here (364 preemptions planned), so the sizes below could
    not be timed at all. Its cost is measured apart, on the first 100 queued
    of the same world (one pass, up to 32 victim searches; 1,000 would take minutes):
      BENCH fleet_preempt_<n>_plan   seconds of that pass, preemption on

Each size runs in a process of its own (ru_maxrss is a high-water mark):
  BENCH calibration_1M_loop      a plain 1M-iteration loop: the machine's speed now
  BENCH fleet_<n>_build          seconds to build the snapshot in memory (not timed by
                                 the goals: build_snapshot from PostgreSQL is not here)
  BENCH fleet_<n>_rss_snapshot   process RSS (MB) once the snapshot is built (/proc)
  BENCH fleet_<n>_plan_p50/_p99  seconds per pass (wall; p99 of few passes = the max;
                                 3 passes at 100k, 2 at 250k, 1 at 500k and 1M)
  BENCH fleet_<n>_plan_cpu_p50   the same in CPU seconds of this process
  BENCH fleet_<n>_peak_rss       process peak RSS (MB, getrusage), snapshot and passes
  BENCH fleet_<n>_peak_alloc     tracemalloc peak of one more pass (MB): what it adds
`--profile` runs the traced pass of the largest size under cProfile too (top 15 by
cumulative and by own time, on stderr); `--plot FILE.png` draws time and memory against queued size
from the figures of the run.

`--alternate` ("A fleet of 5,000 nodes: the pass"): per size, in one process on one
snapshot, the pass with every fleet shortcut off (`ref`: `fast_paths(False)`, the
reference paths the tests hold them to), on but the plan expanded only where read
(`unexpanded`), on but rule Q4's waits replayed per path (`prev`), and all on (`fast`),
in turn (`--modes` to choose; `--rounds` rounds), the plans asserted equal:
  BENCH fleet_<n>_ref_p50 / _prev_p50 / ...       wall seconds per pass
  BENCH fleet_<n>_ref_cpu_p50 / ...                the same in CPU seconds of this process
  BENCH fleet_<n>_ref_rss_grown / ...              MB the process's RSS grew by over the
                                                   pass (the mode's last plan freed first)
  BENCH fleet_<n>_fast_expand_cpu_p50 / ...        CPU seconds, after each pass, to expand
                                                   its plan (`Waits.expand`, the order's
                                                   ids: what the cycle's publish reads)
  BENCH fleet_<n>_fast_pass_and_expand_cpu_p50     the two together
  BENCH fleet_<n>_peak_rss                         the process's peak RSS (MB)
  BENCH fleet_<n>_load                         the 1-minute load average after the passes

The machine is shared (2 cores, other work on them): read the figures beside
calibration_1M_loop and the load average printed with it.

Run: `.venv/bin/python bench/bench_fleet.py [--profile] [--plot docs/fleet-baseline.png]`
from the repo root (about 20 minutes); `--sizes 100000` for one size.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note  # noqa: E402  (bench/ is sys.path[0])
from bench_admission import NOW, calibrate, rss_mb  # noqa: E402
from bench_quota_tree import tree, words  # noqa: E402

from queueing.policy.admission import Plan, plan_admissions  # noqa: E402
from queueing.policy.fairshare import FairShareState  # noqa: E402
from queueing.policy.priority import PriorityWeights  # noqa: E402
from queueing.policy.snapshot import (  # noqa: E402
    NodeState,
    PreemptionSettings,
    QueuedJob,
    RunningJob,
    Snapshot,
)

WHOLE = ("h100", "a100", "l40s")
SLICED, SLICES = "a10", 16
NODES_PER_TYPE, GPUS_PER_NODE = 1250, 8
RUNNING = 150_000
SIZES = (100_000, 250_000, 500_000, 1_000_000)
CAPACITY = {**dict.fromkeys(WHOLE, NODES_PER_TYPE * GPUS_PER_NODE),
            SLICED: NODES_PER_TYPE * GPUS_PER_NODE * SLICES}  # in units (slices)


def _whole_nodes(rnd: random.Random, teams: list[str], running: list[RunningJob]
                 ) -> list[NodeState]:
    """The whole-GPU types, each node filled to 85 % with low-tier jobs of 1-4 GPUs."""
    nodes = []
    for t in WHOLE:
        for i in range(NODES_PER_TYPE):
            name, used = f"{t}-{i:04d}", 0
            while used < GPUS_PER_NODE * 0.85:
                g = rnd.choice((1, 1, 2, 4))
                if used + g > GPUS_PER_NODE:
                    break
                running.append(RunningJob(
                    id=len(running) + 1, team=rnd.choice(teams), gpu_type=t,
                    gpus_per_replica=g, replicas=1, tier_rank=rnd.choice((0, 0, 100)),
                    started_at=NOW - timedelta(hours=rnd.uniform(0.1, 9)),
                    min_runtime_seconds=rnd.choice((0, 600)), nodes=(name,)))
                used += g
            nodes.append(NodeState(name, t, GPUS_PER_NODE, GPUS_PER_NODE - used))
    return nodes


def _sliced_nodes(rnd: random.Random, teams: list[str], running: list[RunningJob]
                  ) -> list[NodeState]:
    """The time-sliced type (rule H1), filled with fractions of 1-2 slices, GPU after
    GPU, until `RUNNING` jobs run in all."""
    nodes = []
    for i in range(NODES_PER_TYPE):
        name = f"{SLICED}-{i:04d}"
        free = [SLICES] * GPUS_PER_NODE
        for g in range(GPUS_PER_NODE):
            while len(running) < RUNNING and free[g] > 0:
                units = min(free[g], rnd.choice((1, 1, 1, 1, 1, 2)))
                free[g] -= units
                running.append(RunningJob(
                    id=len(running) + 1, team=rnd.choice(teams), gpu_type=SLICED,
                    gpus_per_replica=units, replicas=1, tier_rank=rnd.choice((0, 0, 100)),
                    started_at=NOW - timedelta(hours=rnd.uniform(0.1, 9)),
                    nodes=(name,), gpu_slots=(g,)))
        nodes.append(NodeState(name, SLICED, GPUS_PER_NODE * SLICES, sum(free),
                               slices_per_gpu=SLICES, gpu_free=tuple(free)))
    return nodes


def _queued(rnd: random.Random, teams: list[str], n: int) -> tuple[QueuedJob, ...]:
    """`n` jobs, a quarter of each type; on the sliced type 1, 2, 4 slices or a whole GPU."""
    jobs = []
    for i in range(n):
        t = rnd.choice((*WHOLE, SLICED))
        if t == SLICED:
            units, replicas = rnd.choice((1, 1, 2, 4, SLICES)), 1
        else:
            units, replicas = rnd.choice((1, 1, 2, 4, 8)), rnd.choice((1, 1, 1, 2, 4))
        jobs.append(QueuedJob(
            id=10_000_000 + i, team=rnd.choice(teams), gpu_type=t, gpus_per_replica=units,
            replicas=replicas, tier_rank=rnd.choice((0, 100, 100, 200)),
            submitted_at=NOW - timedelta(seconds=rnd.uniform(0, 7 * 86400))))
    return tuple(jobs)


def snapshot(queued: int, seed: int = 42, *, preempt: bool = False) -> Snapshot:
    rnd = random.Random(seed)
    parent, quotas, teams = tree(10, 10, 10, CAPACITY)
    running: list[RunningJob] = []
    nodes = _whole_nodes(rnd, teams, running) + _sliced_nodes(rnd, teams, running)
    usage = {t: rnd.expovariate(1 / 50.0) for t in teams}
    return Snapshot(
        now=NOW, nodes=tuple(nodes), queued=_queued(rnd, teams, queued),
        running=tuple(running), quotas=quotas,
        fair_share_state=FairShareState(usage, {t: 1 / len(teams) for t in teams}),
        priority_weights=PriorityWeights(),
        billing_weights={"h100": 4.0, "a100": 2.0, "l40s": 1.0, SLICED: 0.5},
        interval_seconds=3.0, preemption=PreemptionSettings(
            enabled=preempt, max_per_team=20, max_searches=32),
        units_per_gpu={SLICED: SLICES}, team_parent=parent)


def fast_paths(on: bool, classes: bool | None = None, expanded: bool | None = None,
               path: bool | None = None) -> None:
    """Every shortcut of the fleet's pass on or off (off: the reference paths the
    tests in tests/policy/test_fleet_fast_paths.py hold them to); `classes` apart when
    given: the lending waits replayed and a class's wait given at once ("Classes of equal
    jobs"); `expanded` apart when given: the plan expanded only where read ("The plan
    expanded only where read"); `path` apart when given: rule Q4's waits replayed while
    the team's path binds as it did ("The pass's per-job visits")."""
    from queueing.policy import admission, workspace
    from queueing.policy.stages import heads, nodes, pipeline, quota

    workspace.LIMITS_PER_TOP = nodes.PER_TYPE = quota.WORDS_KEPT = heads.LATER_SORTED = on
    admission._PER_TYPE = on
    admission._LANE_QUIET = 256 if on else 1 << 62
    heads.RESORT_QUIET = 2048 if on else 1 << 62
    admission._PER_CLASS = pipeline.LENDING_REPLAYED = on if classes is None else classes
    admission._EXPANDED_ON_READ = on if expanded is None else expanded
    admission._PATH_KEPT = on if path is None else path


# `--alternate`'s passes: every shortcut off; all on but the plan expanded only where
# read; all on but rule Q4's waits replayed per path (the pass before it); all on.
MODES: dict[str, tuple[bool, bool | None, bool | None, bool | None]] = {
    "ref": (False, None, None, None), "unexpanded": (True, None, False, None),
    "prev": (True, None, None, False), "fast": (True, None, None, None)}


def alternate(n: int, repeats: int, modes: list[str]) -> None:
    """The pass in each of `modes` (of `MODES`), in turn, on one snapshot of `n`
    queued; per mode also what the process's RSS grew by over its pass (MB, its
    plan of the round before freed first) and the CPU to expand its plan after it."""
    snap = snapshot(n)
    k = n // 1000
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in modes}
    grown: dict[str, list[float]] = {name: [] for name in modes}
    read: dict[str, list[float]] = {name: [] for name in modes}
    plans: dict[str, Plan] = {}
    for _ in range(repeats):
        for name in modes:
            fast_paths(*MODES[name])
            plans.pop(name, None)
            gc.collect()
            r = rss_now()
            t, c = time.perf_counter(), time.process_time()
            plans[name] = plan_admissions(snap)
            times[name].append((time.perf_counter() - t, time.process_time() - c))
            grown[name].append(rss_now() - r)
            # What the cycle's publish reads first (step 6): every wait, the order.
            c = time.process_time()
            plans[name].waits.expand()  # type: ignore[attr-defined]
            tuple(plans[name].order)
            read[name].append(time.process_time() - c)
    fast_paths(True)
    for name in modes:
        assert plans[name] == plans[modes[-1]], f"{name} changed the plan"
    note(f"{n} queued: {words(plans[modes[-1]])}; passes " + "; ".join(
        f"{name} " + ", ".join(f"{w:.2f}/{c:.2f}" for w, c in got)
        for name, got in times.items()) + " s (wall/CPU)")
    for name, got in times.items():
        bench(f"fleet_{k}k_{name}_p50", statistics.median(w for w, _c in got), "s")
        bench(f"fleet_{k}k_{name}_cpu_p50", statistics.median(c for _w, c in got), "s")
        bench(f"fleet_{k}k_{name}_rss_grown", statistics.median(grown[name]), "MB")
        bench(f"fleet_{k}k_{name}_expand_cpu_p50", statistics.median(read[name]), "s")
        bench(f"fleet_{k}k_{name}_pass_and_expand_cpu_p50", statistics.median(
            c + e for (_w, c), e in zip(got, read[name], strict=True)), "s")
    bench(f"fleet_{k}k_peak_rss", rss_mb(), "MB")
    bench(f"fleet_{k}k_load", os.getloadavg()[0], "")


def rss_now() -> float:
    """The process's resident set now (MB). Not ru_maxrss: a high-water mark, and one a
    child started by fork and exec inherits from its parent."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def p99(times: list[float]) -> float:
    """The 99th percentile (nearest rank); with fewer than 100 passes, the slowest."""
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def profile(snap: Snapshot) -> None:
    """One pass under cProfile: the top 15 by cumulative and by own time, on stderr."""
    prof = cProfile.Profile()
    prof.enable()
    plan_admissions(snap)
    prof.disable()
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).strip_dirs().sort_stats(key).print_stats(15)
        print(f"# --- cProfile, {len(snap.queued)} queued, by {key} ---\n{out.getvalue()}",
              file=sys.stderr, flush=True)


def one_size(n: int, repeats: int, with_profile: bool) -> dict[str, float]:
    """Build the world with `n` queued, time `repeats` passes, trace one, profile one."""
    t = time.perf_counter()
    snap = snapshot(n)
    built = time.perf_counter() - t
    k = n // 1000
    out = {"queued": n, "build": built, "rss_snapshot": rss_now()}
    note(f"{n} queued: built in {built:.1f} s; {len(snap.running)} running, "
         f"{len(snap.nodes)} nodes, {len(snap.team_parent)} teams in the tree, "
         f"{len(snap.quotas)} quota rows")
    walls, cpus = [], []
    for _ in range(repeats):
        t, c = time.perf_counter(), time.process_time()
        plan = plan_admissions(snap)
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
    note(f"{n} queued: {words(plan)}; passes {', '.join(f'{w:.2f}' for w in walls)} s")
    out.update(plan_p50=statistics.median(walls), plan_p99=p99(walls),
               plan_cpu_p50=statistics.median(cpus))
    out["peak_rss"] = rss_mb()
    tracemalloc.start()  # with the profile, at the largest size: one slow pass, not two
    if with_profile:
        profile(snap)
    else:
        plan_admissions(snap)
    out["peak_alloc"] = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    bench(f"fleet_{k}k_build", built, "s")
    bench(f"fleet_{k}k_rss_snapshot", out["rss_snapshot"], "MB")
    for key in ("plan_p50", "plan_p99", "plan_cpu_p50"):
        bench(f"fleet_{k}k_{key}", out[key], "s")
    bench(f"fleet_{k}k_peak_alloc", out["peak_alloc"], "MB")
    bench(f"fleet_{k}k_peak_rss", out["peak_rss"], "MB")
    return out


def preempt_pass(n: int) -> None:
    """One pass with preemption on, the first `n` queued of the same world."""
    snap = snapshot(n, preempt=True)
    t = time.perf_counter()
    plan = plan_admissions(snap)
    bench(f"fleet_preempt_{n}_plan", time.perf_counter() - t, "s")
    note(f"{n} queued, preemption on: {words(plan)}")


def plot(rows: list[dict[str, float]], path: str) -> None:
    """Time and memory against queued size, beside the goals and a line through 0 and
    the first size's figure (linear growth)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [r["queued"] / 1000 for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    for key, label in (("plan_p50", "pass p50 (wall)"), ("plan_p99", "pass p99 (slowest, wall)"),
                       ("plan_cpu_p50", "pass p50 (CPU of the process)")):
        ax1.plot(x, [r[key] for r in rows], "o-", label=label)
    ax1.plot(x, [rows[0]["plan_p50"] * v / x[0] for v in x], ":", c="grey",
             label="linear from 100k")
    ax1.axhline(1.0, c="green", ls="--", lw=1, label="goal p50 1 s (whole cycle)")
    ax1.axhline(3.0, c="red", ls="--", lw=1, label="goal p99 3 s (whole cycle)")
    ax1.set(xlabel="queued jobs (thousands)", ylabel="seconds", title="plan_admissions")
    ax1.legend(fontsize=8)
    for key, label in (("peak_rss", "process peak RSS"), ("rss_snapshot", "RSS, snapshot"),
                       ("peak_alloc", "traced peak of one pass")):
        ax2.plot(x, [r[key] for r in rows], "o-", label=label)
    ax2.plot(x, [rows[0]["peak_rss"] * v / x[0] for v in x], ":", c="grey",
             label="linear from 100k")
    ax2.axhline(2048, c="red", ls="--", lw=1, label="goal RSS 2 GB")
    ax2.set(xlabel="queued jobs (thousands)", ylabel="MB", title="memory")
    ax2.legend(fontsize=8)
    fig.suptitle("fairq at 5,000 nodes / 40,000 GPUs / 150,000 running / 1,000 teams "
                 "(pure pass, shared 2-core machine)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    note(f"plot: {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    ap.add_argument("--profile", action="store_true", help="cProfile the largest size")
    ap.add_argument("--plot", help="PNG of time and memory against queued size")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: one size
    ap.add_argument("--preempt", type=int, help=argparse.SUPPRESS)  # a child: R1-R11 on
    ap.add_argument("--alternate-one", type=int, help=argparse.SUPPRESS)  # a child
    ap.add_argument("--repeats", type=int, default=5, help=argparse.SUPPRESS)
    ap.add_argument("--alternate", action="store_true",
                    help="each size: the pass with the shortcuts off and on, in turn")
    ap.add_argument("--modes", nargs="*", default=list(MODES), choices=list(MODES),
                    help="--alternate's passes (default: all; the last is the reference "
                         "the others' plans are asserted equal to)")
    ap.add_argument("--rounds", type=int, help="--alternate's rounds per size "
                    "(default: 3 at 100k, 2 at 250k, 1 above)")
    args = ap.parse_args()
    if args.alternate:
        calibrate()
        for n in args.sizes:
            rounds = args.rounds or min(args.repeats, {100_000: 3, 250_000: 2}.get(n, 1))
            out = subprocess.run(
                [sys.executable, __file__, "--alternate-one", str(n), "--repeats",
                 str(rounds), "--modes", *args.modes],
                check=True, stdout=subprocess.PIPE, text=True).stdout
            print(out, end="", flush=True)
        return
    if args.alternate_one:
        alternate(args.alternate_one, args.repeats, args.modes)
        return
    if args.one:
        print(json.dumps(one_size(args.one, args.repeats, args.profile)), flush=True)
        return
    if args.preempt:
        preempt_pass(args.preempt)
        return
    calibrate()
    rows = []
    # Each in a process of its own, so the parent stays small: ru_maxrss, the peaks
    # below, starts from the parent's high-water mark in a forked child.
    subprocess.run([sys.executable, __file__, "--preempt", "100"], check=True)
    for n in args.sizes:
        cmd = [sys.executable, __file__, "--one", str(n),
               "--repeats", str({100_000: 3, 250_000: 2}.get(n, 1))]
        if args.profile and n == max(args.sizes):
            cmd.append("--profile")
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
        lines = out.splitlines()
        print("\n".join(line for line in lines if line.startswith("BENCH")), flush=True)
        rows.append(json.loads(lines[-1]))
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
