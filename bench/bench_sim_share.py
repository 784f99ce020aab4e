"""Fractional GPUs on the openb replay (docs/simulator.md, "Fractional GPUs").

Question: when the trace's tasks that ask a fraction of a GPU (gpu_milli < 1000) get k
slices of one GPU of a time-sliced pool (S slices per GPU, gpu_milli rounded up to the
grid) instead of a whole GPU, how much more useful work does the same cluster deliver,
how much shorter are the waits per tier, how many GPU-hours do the fractional jobs stop
wasting, and does fairness (rule M1) hold - for fairq and for the FIFO, greedy and EASY
baselines, at offered loads ρ 0.9, 1.2 and 1.5 on several cluster draws?

Each run loads the SAME jobs twice: `frac` (fractions packed on shared GPUs) and `whole`
(`trace.whole_gpus`: each fraction takes a whole GPU of the same pool; submit times,
runtimes and cluster identical). ρ counts the GPU-equivalents asked (k / S for a
fraction), so the `whole` run of the same jobs is offered more (`rho_whole_gpus` in the
JSON). It reports, it does not assert.

Output: `BENCH sim_share_<rho>_s<seed>_ts<S>_<mode>_<policy>_<metric> <value> <unit>`
lines on stdout (metrics: delivered, useful, fraction_waste, wait_p50|p95 overall and
per tier, fairness_max_dev, wall), then per run `..._<policy>_useful_gain pct` (frac over
whole) and `..._<policy>_waste_saved GPU-h`; then a summary table (mean over seeds).
With `--out DIR` each run's JSON (`share_<tag>_<mode>.json`); `--table DIR` prints the
tables of those documents and runs nothing.

    .venv/bin/python bench/bench_sim_share.py [--trace DIR] [--rho 1.2]
        [--seeds 0] [--slices 8] [--fractions 0.3|trace] [--modes frac,whole]
        [--policies fairq,fifo,greedy,easy] [--out DIR] [--table DIR]

No database, no Django: the simulator is pure (queueing/simulator/).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import bench, note

from queueing.simulator.cli import DEFAULT_TRACE, simulate, with_checkpoint_model
from queueing.simulator.trace import ShareMode, load_openb, whole_gpus

POLICIES = ("fairq", "fifo", "greedy", "easy")
MODES = ("frac", "whole")
TIERS = ("high", "normal", "low")


def _tag(rho: float, seed: int, slices: int, fractions: float | None) -> str:
    frac = "" if fractions is None else f"_f{fractions:g}"
    return f"{rho:g}_s{seed}_ts{slices}{frac}"


def metrics(pol: dict[str, object]) -> dict[str, float]:
    """The figures of one policy's run that the bench reports."""
    o = pol["overall"]
    assert isinstance(o, dict)
    out = {"delivered": o["delivered_gpu_hours"], "useful": o.get("useful_gpu_hours", 0.0),
           "fraction_waste": o.get("fraction_waste_gpu_hours", 0.0),
           "wait_p50": o["wait_p50_min"], "wait_p95": o["wait_p95_min"],
           "lost": o["lost_gpu_hours"], "preemptions": o["preemptions"]}
    tiers = pol["tiers"]
    assert isinstance(tiers, dict)
    for t in TIERS:
        if t in tiers:
            out[f"{t}_wait_p50"] = tiers[t]["wait_p50_min"]
            out[f"{t}_wait_p95"] = tiers[t]["wait_p95_min"]
    fair = pol["fairness"]
    assert isinstance(fair, dict)
    out["fairness_max_dev"] = fair["max_deviation_points"]
    sizes = pol["sizes"]
    assert isinstance(sizes, dict)
    fr = [s for k, s in sizes.items() if float(k) < 1]
    if fr:
        waits = [s["wait_p95_min"] for s in fr]
        out["fraction_sizes_max_p95"] = max(waits)
    return {k: float(v) for k, v in out.items()}


UNITS = {"delivered": "GPU-h", "useful": "GPU-h", "fraction_waste": "GPU-h", "lost": "GPU-h",
         "preemptions": "count", "fairness_max_dev": "points"}


Doc = tuple[float, int, str, dict[str, object]]


def _s(doc: dict[str, object]) -> int:
    src = doc["source"]
    assert isinstance(src, dict)
    return int(src["share"]["slices_per_gpu"])


def summary_table(docs: list[Doc]) -> str:
    """Mean over seeds per (ρ, mode, policy): useful and delivered GPU-hours, the
    fractions' waste, waits per tier (p50 / p95, min), M1's largest deviation."""
    groups: dict[tuple[int, float, str, str], list[dict[str, float]]] = defaultdict(list)
    seeds: dict[tuple[int, float], set[int]] = defaultdict(set)
    for rho, seed, mode, doc in docs:
        seeds[(_s(doc), rho)].add(seed)
        pols = doc["policies"]
        assert isinstance(pols, dict)
        for p, pol in pols.items():
            groups[(_s(doc), rho, mode, p)].append(metrics(pol))
    head = ("| S | ρ | seeds | mode | policy | useful GPU-h | delivered GPU-h | wasted by "
            "fractions GPU-h | p50 / p95 wait all (min) | high p50 / p95 | low p50 / p95 | "
            "M1 max dev (pts) |")
    lines = [head, "|" + "---|" * 12]
    order = {p: i for i, p in enumerate(POLICIES)}
    for (s, rho, mode, p), rows in sorted(groups.items(), key=lambda kv: (
            kv[0][0], kv[0][1], order.get(kv[0][3], 9), MODES.index(kv[0][2]))):
        def m(k: str, rows: list[dict[str, float]] = rows) -> float:
            return sum(r.get(k, 0.0) for r in rows) / len(rows)
        lines.append(
            f"| {s} | {rho:g} | {','.join(str(x) for x in sorted(seeds[(s, rho)]))} | "
            f"{mode} | {p} | "
            f"{m('useful'):.0f} | {m('delivered'):.0f} | {m('fraction_waste'):.0f} | "
            f"{m('wait_p50'):.1f} / {m('wait_p95'):.0f} | "
            f"{m('high_wait_p50'):.1f} / {m('high_wait_p95'):.0f} | "
            f"{m('low_wait_p50'):.1f} / {m('low_wait_p95'):.0f} | "
            f"{m('fairness_max_dev'):.1f} |")
    return "\n".join(lines)


def run_table(docs: list[Doc]) -> str:
    """One row per run and policy: fairq and the baselines, frac against whole."""
    by: dict[tuple[int, float, int, str], dict[str, dict[str, float]]] = defaultdict(dict)
    for rho, seed, mode, doc in docs:
        pols = doc["policies"]
        assert isinstance(pols, dict)
        for p, pol in pols.items():
            by[(_s(doc), rho, seed, p)][mode] = metrics(pol)
    lines = ["| S | ρ | seed | policy | useful frac / whole (GPU-h) | gain | wasted frac / "
             "whole | p95 wait frac / whole (min) | high p95 frac / whole | M1 dev frac / "
             "whole |", "|" + "---|" * 10]
    order = {p: i for i, p in enumerate(POLICIES)}
    for (s, rho, seed, p), m in sorted(by.items(), key=lambda kv: (
            kv[0][0], kv[0][1], kv[0][2], order.get(kv[0][3], 9))):
        f, w = m.get("frac"), m.get("whole")
        if f is None or w is None:
            continue
        gain = 100.0 * (f["useful"] / w["useful"] - 1) if w["useful"] else 0.0
        lines.append(
            f"| {s} | {rho:g} | {seed} | {p} | {f['useful']:.0f} / {w['useful']:.0f} | "
            f"{gain:+.1f} % | {f['fraction_waste']:.0f} / {w['fraction_waste']:.0f} | "
            f"{f['wait_p95']:.0f} / {w['wait_p95']:.0f} | "
            f"{f.get('high_wait_p95', 0):.0f} / {w.get('high_wait_p95', 0):.0f} | "
            f"{f['fairness_max_dev']:.1f} / {w['fairness_max_dev']:.1f} |")
    return "\n".join(lines)


def read_docs(directory: Path) -> list[Doc]:
    out = []
    for f in sorted(directory.glob("share_*.json")):
        doc = json.loads(f.read_text())
        src = doc["source"]
        out.append((float(src["rho"]), int(src["seed"]),
                    "whole" if src.get("whole_gpus") else "frac", doc))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=os.environ.get("FAIRQ_SIM_TRACE", DEFAULT_TRACE))
    ap.add_argument("--rho", default="1.2", help="comma-separated offered loads (1.2: "
                    "`make bench` runs every bench); the figures of docs/simulator.md ran "
                    "0.9,1.2,1.5")
    ap.add_argument("--seeds", default="0", help="comma-separated cluster draws (0); the "
                    "figures of docs/simulator.md ran 0,1,2")
    ap.add_argument("--slices", default="8", help="comma-separated S values (8)")
    ap.add_argument("--fractions", default="0.3",
                    help="the share of jobs asking a fraction, sampled down ('trace': the "
                    "trace's 42 %%); default 0.3")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--checkpoint", default=None, help="as bench_sim.py (default 1:1h:30m)")
    ap.add_argument("--out", help="write each run's JSON document into this directory")
    ap.add_argument("--table", metavar="DIR", help="print the tables of the documents "
                    "--out wrote into DIR and run nothing")
    args = ap.parse_args()
    if args.table:
        stored = read_docs(Path(args.table))
        print(summary_table(stored))
        print()
        print(run_table(stored))
        return 0
    if not (Path(args.trace) / "pods.csv").is_file():
        note(f"the openb trace is not at {args.trace} (set FAIRQ_SIM_TRACE): skipped")
        return 0
    fractions = None if args.fractions == "trace" else float(args.fractions)
    policies = tuple(p for p in args.policies.split(",") if p)
    modes = tuple(m for m in args.modes.split(",") if m)
    if any(p not in POLICIES for p in policies) or any(m not in MODES for m in modes):
        ap.error(f"--policies of {', '.join(POLICIES)}; --modes of {', '.join(MODES)}")
    docs: list[Doc] = []
    for s in (int(x) for x in args.slices.split(",")):
        for seed in (int(x) for x in args.seeds.split(",")):
            for rho in (float(x) for x in args.rho.split(",")):
                tag = _tag(rho, seed, s, fractions)
                base = load_openb(args.trace, rho=rho, seed=seed,
                                  share=ShareMode(s, fractions=fractions))
                base = with_checkpoint_model(base, args.checkpoint, seed=seed)
                got: dict[str, dict[str, dict[str, float]]] = {}
                for mode in modes:
                    w = base if mode == "frac" else whole_gpus(base)
                    note(f"{tag} {mode}: {w.source['jobs']} jobs, {w.source['share']}")
                    t0 = time.perf_counter()
                    timings: dict[str, float] = {}
                    doc = simulate(w, policies, progress_out=sys.stderr, timings=timings)
                    docs.append((rho, seed, mode, doc))
                    if args.out:
                        Path(args.out).mkdir(parents=True, exist_ok=True)
                        (Path(args.out) / f"share_{tag}_{mode}.json").write_text(
                            json.dumps(doc, sort_keys=True, indent=1) + "\n")
                    bench(f"sim_share_{tag}_{mode}_all_wall", time.perf_counter() - t0, "s")
                    for p in policies:
                        m = metrics(doc["policies"][p])
                        got.setdefault(p, {})[mode] = m
                        bench(f"sim_share_{tag}_{mode}_{p}_wall", timings[p], "s")
                        for k, v in m.items():
                            bench(f"sim_share_{tag}_{mode}_{p}_{k}", v, UNITS.get(k, "min"))
                for p, by in got.items():
                    if "frac" in by and "whole" in by:
                        f, w_ = by["frac"], by["whole"]
                        bench(f"sim_share_{tag}_{p}_useful_gain",
                              100.0 * (f["useful"] / w_["useful"] - 1) if w_["useful"] else 0.0,
                              "pct")
                        bench(f"sim_share_{tag}_{p}_waste_saved",
                              w_["fraction_waste"] - f["fraction_waste"], "GPU-h")
    print()
    print(summary_table(docs))
    print()
    print(run_table(docs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
