"""Quota trees and bookings on a week of the openb replay (docs/simulator.md, "Quotas in a
tree and bookings").

Question: what do departments (rule F4's forest, rules Q3-Q7) and a recurring booking
(rules W1-W5) cost the replay - its wall time, and the waits per tier, delivered
GPU-hours, preemptions and fairness (rule M1) - against the same week without them?

The week: the 30 days of the trace on 32 GPUs at ρ 0.95 (arrivals compressed into a
167 h horizon, docs/simulator.md "The openb trace"), fairq alone (the baselines see
neither trees nor bookings). Variants:
- `flat`: the trace's four teams, no booking;
- `tree`: `--departments 2` (dept-0: team-0, team-2; dept-1: team-1, team-3);
- `booking`: team-1 books 8 GPUs Tuesday, Thursday and Saturday 14:00-16:00 UTC, lent;
- `tree_booking`: both.

Output: `BENCH sim_tree_s<seed>_<variant>_<metric> <value> <unit>` (wall, cycles,
delivered, lost, preemptions, wait p50/p95 per tier, fairness_max_dev, and with a booking
its used/lent/empty GPU-hours and largest delay; with the tree each team's longest owed
wait), then a table. `--out DIR` keeps each run's JSON; `--table DIR` prints the table
of those and runs nothing.

    .venv/bin/python bench/bench_sim_tree.py [--trace DIR] [--seeds 0]
        [--variants flat,tree,booking,tree_booking] [--out DIR] [--table DIR]

No database, no Django: the simulator is pure (queueing/simulator/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import bench, note

from queueing.simulator.cli import DEFAULT_TRACE, load_workload, parser, simulate

WEEK = ["--gpus", "32", "--rho", "0.95"]
BOOKING = "team-1:openb:8@Tue14:00/2h/FREQ=WEEKLY;BYDAY=TU,TH,SA"
VARIANTS = {
    "flat": [],
    "tree": ["--departments", "2"],
    "booking": ["--booking", BOOKING],
    "tree_booking": ["--departments", "2", "--booking", BOOKING],
}
TIERS = ("high", "normal", "low")


def metrics(doc: dict[str, Any]) -> dict[str, tuple[float, str]]:
    """The figures of one run the bench reports, with their units."""
    f = doc["policies"]["fairq"]
    o = f["overall"]
    out: dict[str, tuple[float, str]] = {
        "cycles": (f["cycles"], "count"),
        "delivered": (o["delivered_gpu_hours"], "GPU-h"),
        "lost": (o["lost_gpu_hours"], "GPU-h"),
        "preemptions": (o["preemptions"], "count"),
        "wait_p50": (o["wait_p50_min"], "min"), "wait_p95": (o["wait_p95_min"], "min"),
        "fairness_max_dev": (f["fairness"]["max_deviation_points"], "points"),
    }
    for t in TIERS:
        if t in f["tiers"]:
            out[f"{t}_wait_p50"] = (f["tiers"][t]["wait_p50_min"], "min")
            out[f"{t}_wait_p95"] = (f["tiers"][t]["wait_p95_min"], "min")
    b = f.get("bookings")
    if b:
        for k in ("used", "lent", "empty", "unclear"):
            out[f"booking_{k}"] = (b[f"{k}_gpu_hours"], "GPU-h")
        out["booking_delay_max"] = (b["delay_max_seconds"], "s")
        out["booking_crossed_jobs"] = (b["crossed_jobs"], "count")
        out["booking_team_wait_max"] = (b["team_owed_wait_max_seconds"], "s")
    tree = f.get("tree")
    if tree:
        for team, t in tree["owed_waits"].items():
            out[f"owed_wait_max_{team}"] = (t["owed_wait_max_seconds"], "s")
    return out


def table(runs: list[tuple[int, str, dict[str, Any], float]]) -> str:
    lines = ["| seed | variant | wall s | cycles | delivered GPU-h | lost GPU-h | preemptions | "
             "p50 / p95 wait high (min) | normal | low | M1 max dev (pts) | booked used / "
             "lent / empty GPU-h | booking delay max s |", "|" + "---|" * 13]
    for seed, variant, doc, wall in runs:
        m = {k: v for k, (v, _u) in metrics(doc).items()}
        tiers = " | ".join(f"{m.get(f'{t}_wait_p50', 0):.1f} / {m.get(f'{t}_wait_p95', 0):.0f}"
                           for t in TIERS)
        booked = (f"{m['booking_used']:.1f} / {m['booking_lent']:.1f} / "
                  f"{m['booking_empty']:.1f}") if "booking_used" in m else "-"
        delay = f"{m['booking_delay_max']:.0f}" if "booking_delay_max" in m else "-"
        lines.append(f"| {seed} | {variant} | {wall:.0f} | {m['cycles']:.0f} | "
                     f"{m['delivered']:.0f} | {m['lost']:.1f} | {m['preemptions']:.0f} | "
                     f"{tiers} | {m['fairness_max_dev']:.1f} | {booked} | {delay} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=os.environ.get("FAIRQ_SIM_TRACE", DEFAULT_TRACE))
    ap.add_argument("--seeds", default="0", help="comma-separated cluster draws (0)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", help="write each run's JSON document into this directory")
    ap.add_argument("--table", metavar="DIR", help="print the table of the documents --out "
                    "wrote into DIR and run nothing")
    args = ap.parse_args()
    if args.table:
        runs = []
        for f in sorted(Path(args.table).glob("tree_*.json")):
            doc = json.loads(f.read_text())
            runs.append((int(doc["source"]["seed"]), str(doc["bench_variant"]), doc,
                         float(doc["bench_wall_seconds"])))
        print(table(runs))
        return 0
    if not (Path(args.trace) / "pods.csv").is_file():
        note(f"the openb trace is not at {args.trace} (set FAIRQ_SIM_TRACE): skipped")
        return 0
    variants = [v for v in args.variants.split(",") if v]
    if any(v not in VARIANTS for v in variants):
        ap.error(f"--variants of {', '.join(VARIANTS)}")
    runs = []
    for seed in (int(x) for x in args.seeds.split(",")):
        for variant in variants:
            argv = ["--trace", args.trace, *WEEK, "--seed", str(seed), "--policies", "fairq",
                    *VARIANTS[variant]]
            workload = load_workload(parser().parse_args(argv))
            timings: dict[str, float] = {}
            note(f"seed {seed} {variant}: {len(workload.jobs)} jobs, "
                 f"{workload.horizon / 3600:.1f} h")
            doc = simulate(workload, ["fairq"], timings=timings)
            wall = timings["fairq"]
            tag = f"sim_tree_s{seed}_{variant}"
            bench(f"{tag}_wall", wall, "s")
            for k, (v, unit) in metrics(doc).items():
                bench(f"{tag}_{k}", v, unit)
            runs.append((seed, variant, doc, wall))
            if args.out:
                Path(args.out).mkdir(parents=True, exist_ok=True)
                path = Path(args.out) / f"tree_s{seed}_{variant}.json"
                path.write_text(json.dumps({**doc, "bench_variant": variant,
                                            "bench_wall_seconds": wall},
                                           sort_keys=True, indent=1) + "\n")
    print()
    print(table(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
