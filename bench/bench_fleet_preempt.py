"""A fleet of 5,000 nodes with preemption on (docs/performance.md, "A fleet of 5,000
nodes: preemption").

Question: what does a planning pass cost with preemption (rules R1-R11) on, in
bench_fleet.py's world (5,000 nodes, 150,000 running: 13,676 whole-GPU jobs and
136,324 fractions on the time-sliced `a10`, 1,000 teams in a 10x10x10 tree), and how much
does the victim search by nearness levels (`preemption._INDEX`: `_Levels`,
`_take_per_replica_by_level`) save against the reference search that builds, sorts and
weighs every candidate of the type (`_INDEX = False`), and what does weighing only the
nodes whose GPUs a whole-GPU claim's candidates can empty (`preemption._BOUND`:
`_packed_bounds`) save against weighing every node the levels reach (`_BOUND = False`,
"before")?

Per size, one process builds the world once (the first `n` queued of bench_fleet's
world, preemption on) and runs the pass with the reference search and with the indexed
one in turn (alternated: reference, before, indexed, reference, before, indexed, ...),
checking that the plans are equal (admissions, preemptions, every wait):
  BENCH calibration_1M_loop                 a plain 1M-iteration loop: the machine now
  BENCH fleet_preempt_<n>_plan_reference    seconds of the pass, reference search (p50)
  BENCH fleet_preempt_<n>_plan_before       seconds of the pass, indexed, `_BOUND` off
  BENCH fleet_preempt_<n>_plan              seconds of the pass, indexed search (p50)
  BENCH fleet_preempt_<n>_plan[_reference]_cpu   the same in CPU seconds of the process
  BENCH fleet_preempt_<n>_preemptions       preemptions planned
  BENCH fleet_preempt_<n>_owed_served       of them made for owed claims (rule R11)
  BENCH fleet_preempt_<n>_owed_waiting      owed claims left waiting (their search found
                                            nothing: "it is owed ... but")
  BENCH fleet_preempt_<n>_searches          victim searches run in the pass
  BENCH fleet_preempt_<n>_load              the 1-minute load average after the passes
`--switch one`: "before" is the indexed search with `preemption._ONE = False` instead
(every one-GPU claim builds and weighs its levels; docs/performance.md, "Owed claims'
searches kept across a pass").
The reference is run only up to `--reference-max` queued (default 1,000), "before" and
the searches count up to `--before-max` (default 3,000): beyond, one such pass takes
minutes.

Run: `.venv/bin/python bench/bench_fleet_preempt.py [--sizes 100 1000 10000 100000]
[--repeats 2]` from the repo root.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note  # noqa: E402  (bench/ is sys.path[0])
from bench_admission import calibrate  # noqa: E402
from bench_fleet import snapshot  # noqa: E402
from bench_quota_tree import words  # noqa: E402

from queueing.policy import preemption  # noqa: E402
from queueing.policy.admission import Plan, plan_admissions  # noqa: E402
from queueing.policy.snapshot import Snapshot  # noqa: E402

SIZES = (100, 1_000, 10_000, 100_000)


def timed(snap: Snapshot, indexed: bool, bound: bool = True,
          one: bool = True) -> tuple[float, float, Plan]:
    """(wall seconds, CPU seconds of this process, the plan) of one pass."""
    kept = preemption._INDEX, preemption._BOUND, preemption._ONE
    preemption._INDEX, preemption._BOUND, preemption._ONE = indexed, bound, one
    try:
        t, c = time.perf_counter(), time.process_time()
        plan = plan_admissions(snap)
        return time.perf_counter() - t, time.process_time() - c, plan
    finally:
        preemption._INDEX, preemption._BOUND, preemption._ONE = kept


def searches(snap: Snapshot) -> int:
    """The victim searches of one pass (counted by wrapping `find_victims`)."""
    from queueing.policy.stages import preempt

    count = 0
    plain = preempt.find_victims

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal count
        count += 1
        return plain(*args, **kwargs)  # type: ignore[arg-type]

    preempt.find_victims = counted  # type: ignore[assignment]
    try:
        plan_admissions(snap)
    finally:
        preempt.find_victims = plain
    return count


def one_size(n: int, repeats: int, reference: bool, before: bool,
             switch: str = "bound") -> None:
    t = time.perf_counter()
    snap = snapshot(n, preempt=True)
    note(f"{n} queued: built in {time.perf_counter() - t:.1f} s; "
         f"load average {os.getloadavg()[0]:.1f}")
    fast: list[float] = []
    slow: list[float] = []
    fast_cpu: list[float] = []
    slow_cpu: list[float] = []
    old: list[float] = []
    old_cpu: list[float] = []
    plan = None
    for _ in range(repeats):
        if reference:
            took, cpu, ref = timed(snap, indexed=False)
            slow.append(took)
            slow_cpu.append(cpu)
        if before:
            took, cpu, was = timed(snap, indexed=True, bound=switch != "bound",
                                   one=switch != "one")
            old.append(took)
            old_cpu.append(cpu)
        took, cpu, plan = timed(snap, indexed=True)
        fast.append(took)
        fast_cpu.append(cpu)
        if reference:
            assert plan == ref, "the indexed search's plan differs from the reference's"
            assert plan.waits.items() == ref.waits.items()
        if before:
            assert plan == was, f"the switch {switch} changed the plan"
            assert plan.waits.items() == was.waits.items()
    assert plan is not None
    note(f"{n} queued, preemption on: {words(plan)}; passes: indexed "
         f"{', '.join(f'{x:.2f}' for x in fast)} s"
         + (f", reference {', '.join(f'{x:.2f}' for x in slow)} s (plans equal)"
            if reference else "")
         + (f", before {', '.join(f'{x:.2f}' for x in old)} s (plans equal)"
            if before else ""))
    k = f"fleet_preempt_{n}"
    if reference:
        bench(f"{k}_plan_reference", statistics.median(slow), "s")
        bench(f"{k}_plan_reference_cpu", statistics.median(slow_cpu), "s")
    if before:
        bench(f"{k}_plan_before", statistics.median(old), "s")
        bench(f"{k}_plan_before_cpu", statistics.median(old_cpu), "s")
    bench(f"{k}_plan", statistics.median(fast), "s")
    bench(f"{k}_plan_cpu", statistics.median(fast_cpu), "s")
    owed_waiting = sum(1 for w in plan.waits.values()
                       if "(rule R11), but" in w.message)
    bench(f"{k}_preemptions", len(plan.preemptions), "preemptions")
    bench(f"{k}_owed_served", sum(1 for p in plan.preemptions if p.owed), "preemptions")
    bench(f"{k}_owed_waiting", owed_waiting, "jobs")
    bench(f"{k}_load", os.getloadavg()[0], "")
    if before:
        bench(f"{k}_searches", searches(snap), "searches")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=list(SIZES))
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--reference-max", type=int, default=1_000)
    ap.add_argument("--before-max", type=int, default=3_000)
    ap.add_argument("--switch", choices=("bound", "one"), default="bound")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: one size
    args = ap.parse_args()
    if args.one:
        one_size(args.one, args.repeats, args.one <= args.reference_max,
                 args.one <= args.before_max, args.switch)
        return
    calibrate()
    for n in args.sizes:  # each in a process of its own
        subprocess.run([sys.executable, __file__, "--one", str(n), "--repeats",
                        str(args.repeats), "--reference-max", str(args.reference_max),
                        "--before-max", str(args.before_max), "--switch", args.switch],
                       check=True)
    calibrate()


if __name__ == "__main__":
    main()
