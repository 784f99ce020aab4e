"""The trace-replay benchmark (docs/simulator.md; the replay goals).

Question: on the openb replay (a seeded draw of 429 GPUs of nodes, the last 30 days,
tasks ≤ 24 h, four tenants weighted 1, 1, 2, 4, realistic runtime estimates by default),
how does fairq's policy compare with FIFO, greedy backfill and EASY backfill at offered
loads ρ 0.9, 1.2 and 1.5, on several clusters, with and without GPU specs, and how fast
does the replay run?

It reports, it does not assert: each of the goals (delivered ≥ 99 % of greedy
backfill's, lost ≤ 1 % of delivered, no job preempted more than 3 times, the owed jobs'
p95 wait ≤ 1 min + grace (rule R11), 8-GPU p95 wait ≤ greedy's and EASY's, every team
within 5 points of its weighted max-min share, rule M1; with GPU specs, delivered ≥
greedy backfill's with the same specs) is a BENCH line per ρ, seed and spec with its
value and one with 1 (met) or 0, and a PASS/FAIL table follows on stdout. Delivered vs
EASY backfill's and the high tier's p95 wait are reported, no goals since rule R11.
Jobs checkpoint as `--checkpoint` says (default: those over 1 h, every 30 min) and a
victim keeps its GPUs for `--grace` (default 30 s) (docs/simulator.md, "Checkpoints,
grace and owed claims").

Why the high tier waited (docs/simulator.md, "Why a tier waited"): per wait cause its
share of the tier's waiting, the p95 of the time in it and the jobs over 1 min mainly for
it (`sim_fairq_<rho>_high_cause_<cause>_share|_p95|_main_over_1min`), and the tier's wait
floors (`sim_floor_<rho>_high_nominal|cluster_p95_wait|_over_1min`).

Output: `BENCH sim_<policy>_<rho>[_s<seed>][_gen0.3]_<metric> <value> <unit>` lines on
stdout (`_s<seed>` for seeds other than 0, the GPU-spec mode when not off), for
example `BENCH sim_fairq_1.2_delivered_vs_greedy 99.5 pct` and
`BENCH sim_goal_1.2_s1_lost_met 1 bool`; then the table; progress and notes on stderr.

    .venv/bin/python bench/bench_sim.py [--trace DIR] [--rho 0.9,1.2,1.5] [--seeds 0,1,2]
        [--estimate user|oracle|fixed:24h] [--gpu-spec off,gen:0.3] [--out DIR]
        [--lost-per-wait R|none] [--no-reservation] [--checkpoint 1:1h:30m|off]
        [--grace 30] [--policies fairq,fifo,greedy,easy]

No database, no Django: the simulator is pure (queueing/simulator/).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import json
from dataclasses import replace

from _common import bench, note

from queueing.simulator.checkpoints import (
    DEFAULT_CHECKPOINT,
    CheckpointModel,
    parse_grace,
    with_grace,
)
from queueing.simulator.cli import DEFAULT_TRACE, simulate, with_checkpoint_model
from queueing.simulator.estimates import DEFAULT_ESTIMATE, EstimateModel
from queueing.simulator.gpu_spec import GpuSpecMode
from queueing.simulator.metrics import goal_checks
from queueing.simulator.trace import load_openb

POLICIES = ("fairq", "fifo", "greedy", "easy")


# The goal table's columns (docs/simulator.md, "The goal table"): goal key -> heading.
TABLE_GOALS = {
    "delivered_vs_greedy": "delivered vs greedy (≥ 99 %)",
    "lost": "lost of delivered (≤ 1 %)",
    "max_preemptions": "max preemptions / job (≤ 3)",
    "fairness": "M1 max dev (≤ 5 pts)",
    "delivered_vs_greedy_spec": "with spec: vs greedy (≥ 100 %)",
}
# Since rule R11 (docs/simulator.md, "Checkpoints, grace and owed claims"): the owed
# jobs' p95 wait (the goal, ≤ 1 min + grace), the high (LS) tier's owed jobs apart.
OWED_GOAL = "owed_p95"


def _owed_cells(doc: dict[str, object], goal: tuple[float, bool, str] | None) -> list[str]:
    """The owed columns: all owed jobs' p95 against the goal (✗ when missed), then the
    high tier's owed p95 and the other tiers' (jobs in brackets), preemptions with no
    loss of all."""
    g = doc["goals"]
    assert isinstance(g, dict)
    if goal is None:
        return ["–", "–", "–", "–"]
    value, met, _ = goal
    others = sorted(k for k in g if k.startswith("owed_") and k.endswith("_p95_wait_min")
                    and k not in ("owed_p95_wait_min", "owed_high_p95_wait_min"))
    rest = ", ".join(f"{k[5:-13]} {g[k]:.2f} ({g[k[:-13] + '_jobs']:.0f})" for k in others)
    high = (f"{g['owed_high_p95_wait_min']:.2f} ({g['owed_high_jobs']:.0f})"
            if "owed_high_p95_wait_min" in g else "–")
    return [f"{value:.2f} min ({g['owed_jobs']:.0f})" + ("" if met else " ✗"), high,
            rest or "–", f"{g.get('preemptions_no_loss', 0):.0f} of {g['preemptions']:.0f}"]


def _share(doc: dict[str, object]) -> float:
    """The share of a run's jobs that checkpoint (0 without the setting)."""
    src = doc["source"]
    assert isinstance(src, dict)
    n = src.get("checkpointing_jobs", 0)
    return float(n) / float(src["jobs"]) if isinstance(n, int) and src.get("jobs") else 0.0


def goal_table(directory: Path) -> str:
    """One markdown row per run document (`sim_*.json`) in `directory`: ρ, seed, GPU
    specs, estimates, the cluster's nodes, each goal's value with ✗ when missed, and
    the goals met of those that apply."""
    docs = []
    for f in sorted(directory.glob("sim_*.json")):
        doc = json.loads(f.read_text())
        src = doc["source"]
        docs.append(((str(src.get("gpu_spec", "off")), float(src["rho"]), int(src["seed"])),
                     doc))
    owed_heads = ["owed p95 (≤ 1 min + grace)", "owed p95 high (LS)", "owed p95 other tiers",
                  "preemptions with no loss"]
    with_owed = any("owed_p95_wait_min" in d["goals"] for _, d in docs)
    lines = ["| ρ | seed | GPU spec | estimates | checkpoint | nodes | "
             + " | ".join(TABLE_GOALS.values())
             + (" | " + " | ".join(owed_heads) if with_owed else "") + " | goals met |",
             "|---|---|---|---|---|---|" + "---|" * (len(TABLE_GOALS) + 1
                                                     + (len(owed_heads) if with_owed else 0))]
    # Runs of several checkpoint settings: grouped by setting, most jobs checkpointing last.
    for (spec, rho, seed), doc in sorted(docs, key=lambda d: (round(_share(d[1]), 1), d[0])):
        checks = {key: (value, met, unit) for key, _, value, met, unit in goal_checks(
            doc["goals"])}
        cells = []
        for key in TABLE_GOALS:
            if key not in checks:
                cells.append("–")
                continue
            value, met, unit = checks[key]
            shown = f"{value:.0f}" if not unit else f"{value:.2f} {unit}"
            cells.append(shown + ("" if met else " ✗"))
        if with_owed:
            cells += _owed_cells(doc, checks.get(OWED_GOAL))
        applied = [checks[k][1] for k in (*TABLE_GOALS, OWED_GOAL) if k in checks]
        lines.append(f"| {rho:g} | {seed} | {spec} | {doc['source'].get('estimate', '')} | "
                     f"{doc['source'].get('checkpoint', 'off')} | "
                     f"{doc['source']['nodes']} | " + " | ".join(cells)
                     + f" | {sum(applied)} of {len(applied)} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=os.environ.get("FAIRQ_SIM_TRACE", DEFAULT_TRACE))
    ap.add_argument("--rho", default="0.9,1.2,1.5")
    ap.add_argument("--seeds", default="0",
                    help="comma-separated seeds: each draws another cluster of 429 GPUs "
                         "(and the estimates' factors, the generated specs); metric names "
                         "get a _s<seed> suffix for seeds other than 0")
    ap.add_argument("--estimate", default=DEFAULT_ESTIMATE.describe(),
                    help="runtime estimates: user[:LO-HI], oracle, fixed:DURATION")
    ap.add_argument("--gpu-spec", default="off",
                    help="comma-separated GPU-spec modes: off, trace, gen:SHARE (off)")
    ap.add_argument("--out", help="write each run's JSON document into this directory")
    ap.add_argument("--table", metavar="DIR", help="print the goal table of the JSON "
                    "documents --out wrote into DIR (one row per run) and run nothing")
    ap.add_argument("--lost-per-wait", help="rule R9's ratio ('none': no check); default "
                    "the product's")
    ap.add_argument("--no-reservation", action="store_true", help="rule A9 off")
    ap.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT.describe(),
                    help="which jobs checkpoint: SHARE:MIN_RUNTIME:INTERVAL[:SAVE] or off "
                    "(default: every job over 1 h, every 30 min)")
    ap.add_argument("--grace", help="a victim's grace: SECONDS or TIER=SECONDS,... "
                    "(default: the preemption settings' 30 s)")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="fairq and the baselines to run (fairq and greedy at least: the "
                    "goals are against greedy backfill)")
    args = ap.parse_args()
    if args.table:
        print(goal_table(Path(args.table)))
        return 0
    if not (Path(args.trace) / "pods.csv").is_file():
        # Skipped, not failed: `make bench` runs every bench and stops at the first failure.
        note(f"the openb trace is not at {args.trace} (set FAIRQ_SIM_TRACE): skipped")
        return 0
    estimate = EstimateModel.parse(args.estimate)
    checkpoint = CheckpointModel.parse(args.checkpoint)
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if "fairq" not in policies or "greedy" not in policies or \
            any(p not in POLICIES for p in policies):
        ap.error(f"--policies: fairq, greedy and any of {', '.join(POLICIES[2:])}")
    specs = [GpuSpecMode.parse(m) for m in args.gpu_spec.split(",")]
    runs = [(float(r), int(sd), m) for m in specs for sd in args.seeds.split(",")
            for r in args.rho.split(",")]
    table: dict[str, dict[str, tuple[float, bool, str]]] = {}
    texts: dict[str, str] = {}
    for rho, seed, spec in runs:
        slug = "" if spec.kind == "off" else "_" + spec.describe().replace(":", "")
        if checkpoint != DEFAULT_CHECKPOINT:
            slug += "_ckpt" + checkpoint.describe().replace(":", "-")
        tag = f"{rho:g}" + (f"_s{seed}" if seed else "") + slug
        w = load_openb(args.trace, rho=rho, seed=seed, estimate=estimate, gpu_spec=spec)
        w = with_checkpoint_model(w, checkpoint.describe(), seed=seed)
        if args.grace is not None:
            grace = parse_grace(args.grace, [t.name for t in w.scenario.tiers])
            w = replace(w, scenario=replace(w.scenario, tiers=with_grace(w.scenario.tiers, grace)),
                        source={**w.source, "grace": grace})
        st = w.scenario.settings
        if args.lost_per_wait is not None:
            ratio = None if args.lost_per_wait == "none" else float(args.lost_per_wait)
            st = replace(st, preemption=replace(st.preemption, lost_per_wait=ratio))
        if args.no_reservation:
            st = replace(st, reservation=False)
        w = replace(w, scenario=replace(w.scenario, settings=st))
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        doc = simulate(w, policies, progress_out=sys.stderr, timings=timings)
        if args.out:
            Path(args.out).mkdir(parents=True, exist_ok=True)
            (Path(args.out) / f"sim_{tag}.json").write_text(
                json.dumps(doc, sort_keys=True, indent=1) + "\n")
        bench(f"sim_all_{tag}_wall", time.perf_counter() - t0, "s")
        for p in policies:
            bench(f"sim_{p}_{tag}_wall", timings[p], "s")
        pol = doc["policies"]
        for p in policies:
            o = pol[p]["overall"]
            bench(f"sim_{p}_{tag}_delivered", o["delivered_gpu_hours"], "GPU-h")
            bench(f"sim_{p}_{tag}_high_p95_wait", pol[p]["tiers"]["high"]["wait_p95_min"], "min")
            bench(f"sim_{p}_{tag}_gpus8_p95_wait", pol[p]["sizes"].get("8", {}).get(
                "wait_p95_min", 0.0), "min")
            bench(f"sim_{p}_{tag}_fairness_max_dev",
                  pol[p]["fairness"]["max_deviation_points"], "points")
        g = doc["goals"]
        f = pol["fairq"]["overall"]
        bench(f"sim_fairq_{tag}_delivered_vs_greedy", g["delivered_vs_greedy_pct"], "pct")
        if "easy" in policies:
            bench(f"sim_fairq_{tag}_delivered_vs_easy", g["delivered_vs_easy_pct"], "pct")
        bench(f"sim_fairq_{tag}_lost", f["lost_gpu_hours"], "GPU-h")
        bench(f"sim_fairq_{tag}_grace", f["grace_gpu_hours"], "GPU-h")
        bench(f"sim_fairq_{tag}_preemptions_no_loss", f["preemptions_no_loss"], "count")
        # Rule R11: the owed jobs' wait to their first start, all and per tier.
        for key, value in sorted(g.items()):
            if key.startswith("owed_"):
                bench(f"sim_fairq_{tag}_{key.removesuffix('_min')}", value,
                      "min" if key.endswith("_min") else "count")
        bench(f"sim_fairq_{tag}_lost_of_delivered", g["lost_pct_of_delivered"], "pct")
        bench(f"sim_fairq_{tag}_preemptions", f["preemptions"], "count")
        bench(f"sim_fairq_{tag}_max_preemptions_per_job", f["max_preemptions_per_job"], "count")
        bench(f"sim_fairq_{tag}_gpus8_p95_vs_greedy",
              g["gpus8_p95_wait_min"] - g["gpus8_p95_wait_greedy_min"], "min")
        if "easy" in policies:
            bench(f"sim_fairq_{tag}_gpus8_p95_vs_easy",
                  g["gpus8_p95_wait_min"] - g["gpus8_p95_wait_easy_min"], "min")
        # Why the high tier waited (docs/simulator.md, "Why a tier waited"): per wait
        # cause its share of the tier's waiting and the p95 of the time jobs spent in it,
        # the jobs over the goal whose wait was mostly that cause; the two floors.
        high = pol["fairq"].get("wait_causes", {}).get("high")
        if high:
            bench(f"sim_fairq_{tag}_high_over_1min", high["over_goal"], "count")
            for cause, c in high["causes"].items():
                name = cause.replace("capacity:", "capacity_")
                bench(f"sim_fairq_{tag}_high_cause_{name}_share", c["share_pct"], "pct")
                bench(f"sim_fairq_{tag}_high_cause_{name}_p95", c["p95_min"], "min")
                bench(f"sim_fairq_{tag}_high_cause_{name}_main_over_1min",
                      c["main_over_goal"], "count")
        for floor, f in doc.get("wait_floors", {}).items():
            if isinstance(f, dict):
                bench(f"sim_floor_{tag}_high_{floor}_p95_wait", f["wait_p95_min"], "min")
                bench(f"sim_floor_{tag}_high_{floor}_over_1min", f["over_goal"], "count")
        column = f"ρ {rho:g} s{seed}" + ("" if spec.kind == "off" else f" {spec.describe()}")
        for key, text, value, met, unit in goal_checks(g):
            bench(f"sim_goal_{tag}_{key}", value, {"%": "pct", "": "count"}.get(unit, unit))
            bench(f"sim_goal_{tag}_{key}_met", 1.0 if met else 0.0, "bool")
            table.setdefault(key, {})[column] = (value, met, unit)
            texts[key] = text.split(" (")[0]
    columns = [f"ρ {rho:g} s{seed}" + ("" if spec.kind == "off" else f" {spec.describe()}")
               for rho, seed, spec in runs]
    print("\n| goal | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for key, cells in table.items():
        row = [f"{'PASS' if c[1] else 'FAIL'} {c[0]:.3g}{(' ' + c[2]) if c[2] else ''}"
               if (c := cells.get(col)) else "-" for col in columns]
        print(f"| {texts[key]} | " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
