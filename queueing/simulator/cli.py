"""`fairq-sim` (also `manage.py simulate`): replay a trace or a scenario through fairq's
policy and the baselines; text tables on stdout, `--json` for scripts, `--report` PNG.
docs/simulator.md says how to run it and what every number means."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, TextIO

import yaml

from .baselines import BASELINES, run_baseline
from .bookings import BookingError, parse_booking
from .checkpoints import (
    DEFAULT_CHECKPOINT,
    CheckpointError,
    CheckpointModel,
    parse_grace,
    with_checkpoints,
    with_grace,
)
from .engine import run_fairq
from .estimates import DEFAULT_ESTIMATE, EstimateError, EstimateModel, with_estimates
from .gpu_spec import GpuSpecError, GpuSpecMode
from .history import load_usage_history
from .metrics import HOUR, goals, summarize
from .model import RunResult, TeamSpec, Workload
from .report import clusters_png, png_report, text_report, tree_bookings_png
from .scenario import ScenarioError, load_scenario, parse_scenario, parse_settings
from .trace import SHARED_MODELS, ShareMode, TraceError, load_openb, whole_gpus
from .waits import WaitCauses, breakdown, non_preemptible_floors

POLICIES = ("fairq", *BASELINES)
DEFAULT_TRACE = "/work/shared/traces/alibaba-openb-2023"


class _Progress:
    """A one-line progress bar on stderr (`\\r`), redrawn at most 5 times a second."""

    def __init__(self, label: str, horizon: float, out: TextIO) -> None:
        self.label, self.horizon, self.out = label, horizon, out
        self.last = 0.0

    def __call__(self, now: float) -> None:
        t = time.monotonic()
        if t - self.last < 0.2:
            return
        self.last = t
        frac = min(1.0, now / self.horizon) if self.horizon > 0 else 1.0
        bar = "#" * int(30 * frac)
        tail = "" if now <= self.horizon else f" draining {now / HOUR:.1f} h"
        self.out.write(f"\r{self.label:7} [{bar:30}] {100 * frac:5.1f}%{tail}   ")
        self.out.flush()

    def done(self, result: RunResult) -> None:
        self.out.write(f"\r{self.label:7} [{'#' * 30}] done: {result.cycles} cycles, "
                       f"{result.seconds:.1f} s{' ' * 20}\n")
        self.out.flush()


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_rounded(v) for v in value]
    return value


def simulate(workload: Workload, policies: Sequence[str], *, progress_out: TextIO | None = None,
             timings: dict[str, float] | None = None) -> dict[str, Any]:
    """Run each policy on the workload; the JSON document (deterministic: no wall times;
    those go to `timings`, policy -> seconds, when given)."""
    out: dict[str, Any] = {}
    hist: dict[str, int] = {}
    for p in policies:
        bar = _Progress(p, workload.horizon, progress_out) if progress_out else None
        causes = WaitCauses() if p == "fairq" else None
        result = run_fairq(workload, progress=bar, on_cycle=causes.on_cycle) if causes \
            else run_baseline(p, workload, progress=bar)
        if bar is not None:
            bar.done(result)
        if timings is not None:
            timings[p] = result.seconds
        out[p] = summarize(result, workload)
        if causes is not None:
            causes.finish(result.end)
            out[p]["wait_causes"] = breakdown(result, causes, workload)
        if p == "fairq":
            counts = Counter(r.preemptions for r in result.records)
            hist = {str(k): v for k, v in sorted(counts.items())}
    sc = workload.scenario
    doc = {
        "source": dict(workload.source),
        "cluster": {"nodes": len(sc.nodes), "gpus": sc.total_gpus,
                    "gpus_per_node": dict(sorted(Counter(str(n.gpus) for n in sc.nodes).items())),
                    # Only with time-sliced types: a run without keeps its JSON as it was.
                    **({"slices_per_gpu": dict(sorted(sc.slices.items()))} if sc.slices
                       else {})},
        "horizon_hours": workload.horizon / HOUR,
        "policies": out,
        "preemption_histogram": hist,
        "wait_floors": non_preemptible_floors(workload),
        "goals": goals(out, high_tier=_high_tier(workload),
                       with_gpu_spec=str(workload.source.get("gpu_spec", "off")) != "off"),
    }
    return _rounded(doc)  # type: ignore[no-any-return]


def _high_tier(workload: Workload) -> str:
    return max(workload.scenario.tiers, key=lambda t: t.rank).name


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="fairq-sim", description="Replay a trace or a scenario through fairq's policy "
        "and the FIFO, greedy and EASY backfill baselines (docs/simulator.md).")
    ap.add_argument("--trace", help="the openb trace directory (nodes.csv, pods.csv); default "
                    f"$FAIRQ_SIM_TRACE or {DEFAULT_TRACE} when no --scenario lists jobs")
    ap.add_argument("--scenario", help="a YAML scenario; with --trace only its settings "
                    "sections (fair_share, priority, preemption, gpu_types) apply")
    ap.add_argument("--history", metavar="FILE.csv", help="replay fairq's usage history (the "
                    "CSV of manage.py export_usage) on --scenario's cluster, teams and tiers")
    ap.add_argument("--history-tier", metavar="TIER",
                    help="the tier of the history's jobs (the scenario's lowest)")
    ap.add_argument("--rho", type=float, default=1.2, help="offered load (trace), default 1.2")
    ap.add_argument("--days", type=float, default=30.0, help="last days of the trace (30)")
    ap.add_argument("--gpus", type=int, default=429,
                    help="GPUs of the drawn cluster (429); the node count follows the draw")
    ap.add_argument("--seed", type=int, default=0,
                    help="seed of the cluster draw, the estimates' over-request factors and "
                    "the generated GPU specs (0)")
    ap.add_argument("--estimate", default=DEFAULT_ESTIMATE.describe(),
                    help="runtime estimates (trace): user[:LO-HI] (a user's limit, the "
                    "runtime times a seeded factor in LO-HI, capped at 24 h), oracle (the "
                    "runtime rounded up to a bucket), fixed:DURATION (e.g. fixed:24h); "
                    "default user:2-10")
    ap.add_argument("--gpu-spec", default="off",
                    help="GPU types a trace task accepts: off (one type), trace (the "
                    "trace's gpu_spec column), gen:SHARE (a seeded SHARE of tasks restricted "
                    "to generated specs); default off")
    ap.add_argument("--checkpoint", metavar="SHARE:MIN_RUNTIME:INTERVAL[:SAVE]",
                    help="which jobs checkpoint (trace, history): a seeded SHARE of the jobs "
                    "running over MIN_RUNTIME, every INTERVAL; SAVE: how long the save on "
                    "the stop signal takes (0); 'off': none; default "
                    f"{DEFAULT_CHECKPOINT.describe()} (over 1 h, every 30 min)")
    ap.add_argument("--grace", metavar="SECONDS|TIER=SECONDS,...",
                    help="how long a victim keeps its GPUs after its preemption (rule R10), "
                    "every tier or per tier; default the preemption settings' "
                    "termination_grace_seconds (30)")
    ap.add_argument("--share", metavar="S", type=int,
                    help="shared GPUs (trace): the --share-models nodes are one time-sliced "
                    "pool of S slices per GPU (no memory isolation between the tasks of one "
                    "GPU) and a task asking a fraction asks its gpu_milli rounded up to "
                    "slices there; default off (a fraction takes a whole GPU)")
    ap.add_argument("--share-models", default=",".join(SHARED_MODELS),
                    help="with --share: the GPU models time-sliced "
                    f"({','.join(SHARED_MODELS)})")
    ap.add_argument("--fractions", metavar="SHARE|trace", default="trace",
                    help="with --share: the share of the jobs that ask a fraction, sampled "
                    "down from the trace's 42 %% (seeded); default trace")
    ap.add_argument("--whole-gpus", action="store_true",
                    help="with --share: the same jobs, each fraction taking a whole GPU "
                    "(whole-GPU-only scheduling, to compare)")
    ap.add_argument("--limit", type=int, help="only the first N jobs of the trace")
    ap.add_argument("--no-preemption", action="store_true", help="fairq with preemption off")
    ap.add_argument("--no-reservation", action="store_true",
                    help="fairq without rule A9's backfill reservation")
    ap.add_argument("--lost-per-wait", metavar="RATIO",
                    help="rule R9's ratio for fairq ('none': no check); default the "
                    "scenario's or the product's")
    ap.add_argument("--spot-interruptions-per-hour", metavar="RATE", type=float,
                    help="every spot node's interruption rate (rule K6), over the scenario's")
    ap.add_argument("--departments", metavar="N", type=int,
                    help="quotas in a tree (trace): team-i goes under department dept-<i %% N>, "
                    "whose weight and nominal are its teams' sums (rules F4, Q3); default none")
    ap.add_argument("--booking", metavar="TEAM:TYPE:GPUS@START/DURATION[/RULE][/nolend]",
                    action="append", default=[],
                    help="book GPUs for a team (repeatable; rules W1-W5): START +OFFSET, "
                    "HH:MM or DayHH:MM from the run's instant 0 (a Sunday, UTC); RULE an "
                    "RRULE (FREQ=WEEKLY;BYDAY=TU,TH), daily, weekly or once; nolend: its "
                    "unused GPUs stay empty. E.g. team-3:openb:8@Tue14:00/2h/weekly")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help=f"comma-separated, of {', '.join(POLICIES)} (all)")
    ap.add_argument("--json", metavar="FILE", help="write the results as JSON ('-': stdout)")
    ap.add_argument("--report", metavar="FILE.png", help="write the PNG report")
    ap.add_argument("--quiet", action="store_true", help="no progress bar, no tables")
    return ap


def load_workload(args: argparse.Namespace) -> Workload:
    doc = None
    if args.scenario:
        try:
            with open(args.scenario) as fh:
                doc = yaml.safe_load(fh)
        except OSError as exc:
            raise ScenarioError(f"{args.scenario}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ScenarioError(f"{args.scenario}: not valid YAML: {exc}") from None
    if args.history:
        if not args.scenario or args.trace:
            raise ScenarioError("--history: give --scenario (the cluster, teams and tiers) "
                                "and no --trace")
        w = load_usage_history(args.history, parse_scenario(doc), tier=args.history_tier)
        model = EstimateModel.parse(args.estimate)
        w = replace(w, jobs=with_estimates(w.jobs, model, seed=args.seed),
                    source={**w.source, "estimate": model.describe()})
        return _overrides(with_checkpoint_model(w, args.checkpoint, seed=args.seed), args)
    trace = args.trace or (None if doc and isinstance(doc, dict) and doc.get("jobs") else
                           os.environ.get("FAIRQ_SIM_TRACE", DEFAULT_TRACE))
    if trace:
        settings = parse_settings(doc) if isinstance(doc, dict) else None
        w = load_openb(trace, rho=args.rho, days=args.days, gpus=args.gpus,
                       seed=args.seed, limit=args.limit, settings=settings,
                       estimate=EstimateModel.parse(args.estimate),
                       gpu_spec=GpuSpecMode.parse(args.gpu_spec), share=share_mode(args))
        if args.whole_gpus:
            w = whole_gpus(w)
        w = with_checkpoint_model(w, args.checkpoint, seed=args.seed)
    else:
        if args.estimate != DEFAULT_ESTIMATE.describe() or args.gpu_spec != "off" \
                or args.share is not None:
            raise ScenarioError("--estimate, --gpu-spec and --share apply to the trace; a "
                                "scenario's jobs give max_runtime_seconds, gpu_type and "
                                "gpu_slices themselves")
        w = load_scenario(args.scenario)
        if args.whole_gpus:
            w = whole_gpus(w)
        if args.checkpoint is not None:
            w = with_checkpoint_model(w, args.checkpoint, seed=args.seed)
    return _overrides(w, args)


def share_mode(args: argparse.Namespace) -> ShareMode | None:
    """--share, --share-models and --fractions as a `ShareMode` (None: --share not
    given; --fractions or --whole-gpus without it are refused)."""
    if args.share is None:
        if args.fractions != "trace" or args.share_models != ",".join(SHARED_MODELS):
            raise TraceError("--fractions and --share-models need --share S")
        return None
    text = args.fractions.strip().lower()
    try:
        fractions = None if text == "trace" else float(text)
    except ValueError:
        raise TraceError("--fractions: a share in (0, 1) or 'trace'") from None
    models = tuple(m.strip() for m in args.share_models.split(",") if m.strip())
    return ShareMode(args.share, models, fractions)


def with_checkpoint_model(w: Workload, text: str | None, *, seed: int) -> Workload:
    """The workload's jobs with the checkpoint intervals `text` (a `--checkpoint` value;
    None: the default) draws, noted in its `source`."""
    model = DEFAULT_CHECKPOINT if text is None else CheckpointModel.parse(text)
    jobs = with_checkpoints(w.jobs, model, seed=seed)
    return replace(w, jobs=jobs, scenario=replace(w.scenario, save_seconds=model.save_seconds),
                   source={**w.source, "checkpoint": model.describe(),
                           "checkpointing_jobs": sum(1 for j in jobs if j.checkpoint_interval)})


def _overrides(w: Workload, args: argparse.Namespace) -> Workload:
    """The command line's settings over the workload's: --no-preemption,
    --no-reservation, --lost-per-wait, --grace (each noted in the JSON's `source`)."""
    st, source = w.scenario.settings, dict(w.source)
    if args.no_preemption:
        st = replace(st, preemption=replace(st.preemption, enabled=False))
        source["preemption"] = False
    if args.no_reservation:
        st = replace(st, reservation=False)
        source["reservation"] = False
    if args.lost_per_wait is not None:
        text = str(args.lost_per_wait).strip().lower()
        try:
            ratio = None if text == "none" else float(text)
        except ValueError:
            raise ScenarioError("--lost-per-wait: a number >= 0 or 'none'") from None
        if ratio is not None and not ratio >= 0:
            raise ScenarioError("--lost-per-wait: a number >= 0 or 'none'")
        st = replace(st, preemption=replace(st.preemption, lost_per_wait=ratio))
        source["lost_per_wait"] = ratio
    tiers = w.scenario.tiers
    if args.grace is not None:
        grace = parse_grace(args.grace, [t.name for t in tiers])
        tiers = with_grace(tiers, grace)
        source["grace"] = grace
    teams, bookings = w.scenario.teams, w.scenario.bookings
    if args.departments is not None:
        if source.get("kind") != "openb":
            raise ScenarioError("--departments: applies to the trace; a scenario gives its "
                                "teams' parents")
        teams = with_departments(teams, args.departments)
        source["departments"] = args.departments
    if args.booking:
        capacity: dict[str, int] = {}
        for n in w.scenario.nodes:
            capacity[n.gpu_type] = capacity.get(n.gpu_type, 0) + n.gpus
        try:
            extra = tuple(parse_booking(b, [t.name for t in teams], capacity)
                          for b in args.booking)
        except BookingError as exc:
            raise ScenarioError(str(exc)) from None
        bookings = bookings + extra
        source["bookings"] = list(args.booking)
    nodes = w.scenario.nodes
    rate = args.spot_interruptions_per_hour
    if rate is not None:
        if not rate >= 0:
            raise ScenarioError("--spot-interruptions-per-hour: a number >= 0")
        if not any(n.spot for n in nodes):
            raise ScenarioError("--spot-interruptions-per-hour: the scenario has no spot pool")
        nodes = tuple(replace(n, interruptions_per_hour=rate) if n.spot else n for n in nodes)
        source["spot_interruptions_per_hour"] = rate
    return replace(w, scenario=replace(w.scenario, settings=st, nodes=nodes, tiers=tiers,
                                       teams=teams, bookings=bookings),
                   source=source)


def with_departments(teams: Sequence[TeamSpec], n: int) -> tuple[TeamSpec, ...]:
    """`--departments N`: the i-th top-level team goes under department dept-<i % N>
    (weight: the sum of its teams'; no quota row, so its nominal is its teams' sum, rule
    Q3)."""
    if n <= 0:
        raise ScenarioError("--departments: a number of departments > 0")
    top = [t for t in teams if t.parent is None]
    if n > len(top):
        raise ScenarioError(f"--departments: at most {len(top)} (one per team)")
    depts = [TeamSpec(f"dept-{k}", sum(t.weight for i, t in enumerate(top) if i % n == k))
             for k in range(n)]
    under = {t.name: f"dept-{i % n}" for i, t in enumerate(top)}
    return (*depts, *(replace(t, parent=under.get(t.name, t.parent)) for t in teams))


def main(argv: Sequence[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    bad = [p for p in policies if p not in POLICIES]
    if bad or not policies:
        ap.error(f"--policies: unknown {', '.join(bad) or '(none given)'}; "
                 f"choose from {', '.join(POLICIES)}")
    if args.rho <= 0 or args.days <= 0 or args.gpus <= 0:
        ap.error("--rho, --days and --gpus must be > 0")
    if args.limit is not None and args.limit <= 0:
        ap.error("--limit must be > 0")
    try:
        workload = load_workload(args)
        if not workload.jobs:
            raise ScenarioError("no jobs: give --trace, or a scenario with a jobs section")
    except (ScenarioError, TraceError, EstimateError, GpuSpecError, CheckpointError) as exc:
        print(f"fairq-sim: {exc}", file=sys.stderr)
        return 2
    doc = simulate(workload, policies, progress_out=None if args.quiet else sys.stderr)
    if args.json:
        text = json.dumps(doc, sort_keys=True, indent=1) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            with open(args.json, "w") as fh:
                fh.write(text)
    if args.report:
        png_report(doc, args.report)
        if any("clusters" in p for p in doc["policies"].values()):
            clusters_png(doc, args.report.removesuffix(".png") + "-clusters.png")
        fq = doc["policies"].get("fairq", {})
        if "tree" in fq or "bookings" in fq:
            tree_bookings_png(doc, args.report.removesuffix(".png") + "-tree.png")
    if not args.quiet and args.json != "-":
        sys.stdout.write(text_report(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
