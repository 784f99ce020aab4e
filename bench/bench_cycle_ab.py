"""The 100k scheduler cycle with the plan of two revisions alternated.

Question: how much faster is this checkout's plan (`plan_admissions`) than the one of an
earlier revision, in the real cycle of `bench_cycle.py --only 100k` (100,000 queued and
10,000 running one-GPU jobs of 100 teams, 10,000 simulated GPUs)?

How it works
  * The earlier revision's `queueing/policy/admission.py` and `preemption.py` (and its
    `queueing/policy/stages/`, when it has them) are read with `git show <base>:...`
    into a temporary folder and imported beside this checkout's (the rest of the policy
    is this checkout's: the two must fit it).
  * One world is built as `bench_cycle.py` builds it; then cycles run, each after its
    churn, the scheduler's `plan_admissions` switched between the base ("old") and this
    checkout ("new") in the order old, new, new, old, ... so drift in the machine's load
    weighs on both. Every plan of the run is also made by the other revision and
    compared (admissions, preemptions, order, every wait's cause): the bench fails if
    they differ.
  * Per variant: the p50 of the cycle (the sum of its steps) and of its plan and
    snapshot (wall time), and the p50 of the CPU time of this process in the plan and
    in the whole cycle (PostgreSQL's CPU not counted), which a loaded machine disturbs
    less than wall time.

Output: `BENCH <name> <value> <unit>`. Run:
`DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> .venv/bin/python bench/bench_cycle_ab.py
--base <revision> [--cycles 12]` (the bench empties the job tables of that database).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import bench_cycle as bc  # noqa: E402  (bench/ is sys.path[0])
from _common import bench, note  # noqa: E402


def _show(rev: str, path: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{path}"],
                          check=True, capture_output=True, text=True).stdout


def import_base(rev: str, folder: Path) -> Any:
    """The base revision's admission module (with its preemption module, and its
    admission stages when it has them: `queueing/policy/stages/` as `base_stages`)."""
    stages = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", f"{rev}", "queueing/policy/stages/"],
        check=True, capture_output=True, text=True).stdout.split()
    if stages:
        (folder / "base_stages").mkdir()
    for path in stages:
        text = _show(rev, path).replace("from queueing.policy.preemption import",
                                        "from base_preemption import")
        (folder / "base_stages" / Path(path).name).write_text(text)
    for name in ("admission", "preemption"):
        text = _show(rev, f"queueing/policy/{name}.py")
        text = text.replace("from .preemption import", "from base_preemption import")
        text = text.replace("\nfrom .stages.", "\nfrom base_stages.")
        text = text.replace("\nfrom .", "\nfrom queueing.policy.")
        (folder / f"base_{name}.py").write_text(text)
    sys.path.insert(0, str(folder))
    return importlib.import_module("base_admission")


def same(a: Any, b: Any) -> None:
    assert repr(a.admissions) == repr(b.admissions), "admissions differ"
    assert repr(a.preemptions) == repr(b.preemptions), "preemptions differ"
    assert a.order == b.order, "order differs"
    assert list(a.wait_causes()) == list(b.wait_causes()), "waits differ"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the earlier revision (git)")
    parser.add_argument("--cycles", type=int, default=12)
    args = parser.parse_args()
    bc.setup()
    import queueing.services.scheduler as sched
    from queueing.policy import admission as new
    from queueing.services.scheduler import scheduler_cycle

    with tempfile.TemporaryDirectory() as tmp:
        old = import_base(args.base, Path(tmp))
        cpu_plan: dict[str, list[float]] = {"old": [], "new": []}
        fns = {"old": old.plan_admissions, "new": new.plan_admissions}
        made: list[tuple[Any, Any]] = []  # (snapshot, plan) of the cycle

        def timed(name: str) -> Callable[[Any], Any]:
            def run(snapshot: Any) -> Any:
                t = time.process_time()
                plan = fns[name](snapshot)
                cpu_plan[name].append(time.process_time() - t)
                made.append((snapshot, plan))
                return plan
            return run

        bc.use_cluster(f"{bc.BIG_RUNNING // 8}x8xh100")
        now = datetime.now(UTC)
        t = time.perf_counter()
        bc.build_world(now, teams=bc.BIG_TEAMS, queued=bc.BIG_QUEUED + bc.BIG_RUNNING,
                       nominal=100, borrowing=100, sizes=(1,), replicas=(1,))
        bc.start_running(now - timedelta(minutes=10), bc.BIG_RUNNING)
        bc.vacuum()
        note(f"built the world in {time.perf_counter() - t:.0f} s; base {args.base}")
        scheduler_cycle(now=now)
        cpu: dict[str, list[float]] = {"old": [], "new": []}
        steps: dict[str, dict[str, list[float]]] = {
            v: {s: [] for s in bc.STEPS} for v in ("old", "new")}
        loads = []
        for k in range(1, args.cycles + 1):
            name = ("old", "new", "new", "old")[k % 4]
            sched.plan_admissions = timed(name)
            at = now + timedelta(seconds=k)
            bc.churn(at, k)
            c = time.process_time()
            r = scheduler_cycle(now=at)
            cpu[name].append(time.process_time() - c)
            for snapshot, plan in made:  # the other revision's plan: the same
                same(plan, fns["new" if name == "old" else "old"](snapshot))
            made.clear()
            gc.collect()  # (the comparison's garbage is no cycle's to collect)
            for s in bc.STEPS:
                steps[name][s].append(r.timings[s])
            loads.append(os.getloadavg()[0])
            note(f"cycle {k} {name}: " + ", ".join(
                f"{s} {r.timings[s] * 1000:.0f}" for s in bc.STEPS) + f" ms; load {loads[-1]:.2f}")
        for v in ("old", "new"):
            cycle = [sum(x) for x in zip(*(steps[v][s] for s in bc.STEPS), strict=True)]
            bench(f"cycle_ab_100k_{v}_p50", statistics.median(cycle), "s")
            bench(f"cycle_ab_100k_{v}_plan_p50", statistics.median(steps[v]["decide"]) * 1000, "ms")
            bench(f"cycle_ab_100k_{v}_snapshot_p50",
                  statistics.median(steps[v]["snapshot"]) * 1000, "ms")
            bench(f"cycle_ab_100k_{v}_plan_cpu_p50", statistics.median(cpu_plan[v]) * 1000, "ms")
            bench(f"cycle_ab_100k_{v}_cpu_p50", statistics.median(cpu[v]) * 1000, "ms")
        note(f"load average during the cycles: {min(loads):.2f}-{max(loads):.2f} "
             f"on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
