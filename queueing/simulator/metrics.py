"""What a run is measured by (docs/simulator.md, "Metrics"; fairness is rule M1 of
docs/scheduling.md). Everything is computed from the per-job records, the same way for
fairq and each baseline.

- wait of a job: the total time it spent queued, over all its attempts (a preempted job
  waits again); percentiles are nearest-rank.
- delivered GPU-hours: GPUs × time of the work kept, inside the measuring window
  [0, horizon] (the arrival span): attempts that were not preempted, and a preempted
  attempt up to its last save (checkpoint, or the save on the stop signal); lost
  GPU-hours: a victim's time since its last save (its whole attempt without one);
  grace GPU-hours: victims holding GPUs while they stop (rule R10).
- owed (rule R11): the jobs owed their GPUs when submitted; their wait to their first
  start, per tier.
- utilization: GPUs held (by any attempt) / the cluster's GPUs, per `UTIL_BIN` seconds.
- shared GPUs (docs/simulator.md, "Fractional GPUs"): every GPU figure counts a job's
  GPU-equivalents (`SimJob.share`: k / S for a fraction of k slices of S); useful
  GPU-hours count what the tasks asked (`SimJob.useful`), and the jobs that asked less
  than a whole GPU waste held − asked while they run (a whole GPU, or the slice grid's
  rounding).
- fairness (rule M1): per hour of the window and team, demand = GPU-hours of its jobs
  submitted and not finished; fair = weighted max-min allocation of the hour's GPU-hours
  over the demands; delivered = GPU-hours its attempts held. Over the hours in which the
  team had a job queued, deviation = 100 × (Σ delivered / Σ all teams' delivered −
  Σ fair / Σ all teams' fair), in points.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .model import JobRecord, RunResult, Workload

HOUR = 3600.0
UTIL_BIN = 600.0


def percentile(values: Sequence[float], p: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    s = sorted(values)
    k = max(1, math.ceil(p / 100.0 * len(s)))
    return float(s[k - 1])


def queued_intervals(rec: JobRecord, end: float) -> list[tuple[float, float]]:
    """When the job waited: from submit to its first start, from each preemption to the
    next start, and to `end` when it never (re)started."""
    out = []
    t = rec.job.submit
    for a in rec.attempts:
        if a.start > t:
            out.append((t, a.start))
        if not a.requeued:
            return out
        t = a.end
    if end > t:
        out.append((t, end))
    return out


def wait_seconds(rec: JobRecord, end: float) -> float:
    return sum(e - s for s, e in queued_intervals(rec, end))


def overlap(s: float, e: float, lo: float, hi: float) -> float:
    return max(0.0, min(e, hi) - max(s, lo))


def _spread(bins: list[float], width: float, s: float, e: float, value: float) -> None:
    """Add `value` × (time of [s, e] inside each bin) to the bins."""
    if e <= s:
        return
    first = int(s // width)
    last = min(len(bins) - 1, int(e // width))
    for b in range(first, last + 1):
        if b >= len(bins):
            break
        bins[b] += value * overlap(s, e, b * width, (b + 1) * width)


def weighted_max_min(demand: Mapping[str, float], weight: Mapping[str, float],
                     capacity: float) -> dict[str, float]:
    """Rule M1: the weighted max-min fair allocation of `capacity` (water-filling): no
    team gets more than its demand, and the rest is split in proportion to weight among
    the teams still wanting more, until the capacity or the demands run out."""
    alloc = dict.fromkeys(demand, 0.0)
    left = capacity
    want = sorted(t for t, d in demand.items() if d > 0 and weight.get(t, 0) > 0)
    while want and left > 1e-12:
        w_total = sum(weight[t] for t in want)
        level = left / w_total
        satisfied = [t for t in want if demand[t] - alloc[t] <= level * weight[t] + 1e-12]
        if not satisfied:
            for t in want:
                alloc[t] += level * weight[t]
            break
        for t in satisfied:
            left -= demand[t] - alloc[t]
            alloc[t] = demand[t]
        want = [t for t in want if t not in satisfied]
    return alloc


def first_wait_seconds(rec: JobRecord, end: float) -> float:
    """From submit to its first start (to `end` when it never started)."""
    first = rec.attempts[0].start if rec.attempts else end
    return max(0.0, first - rec.job.submit)


def _group_stats(recs: Iterable[JobRecord], *, horizon: float, end: float,
                 clusters: bool = False, any_fraction: bool = False) -> dict[str, float]:
    recs = list(recs)
    waits = [wait_seconds(r, end) / 60.0 for r in recs]
    delivered = lost = spot = grace = useful = wasted = 0.0
    no_loss = 0
    for r in recs:
        g = r.job.share
        for a in r.attempts:
            kept_h = overlap(a.start, a.kept_until, 0.0, horizon) / HOUR
            kept = g * kept_h
            thrown = g * overlap(a.kept_until, a.end, 0.0, horizon) / HOUR
            delivered += kept
            useful += r.job.useful * kept_h
            if r.job.asked is not None:
                wasted += (g - r.job.useful) * overlap(a.start, a.end, 0.0, horizon) / HOUR
            if a.preempted:
                lost += thrown
                grace += g * overlap(a.end, a.held_until, 0.0, horizon) / HOUR
                no_loss += a.kept_until >= a.end
            elif a.reclaimed:
                spot += thrown
    pre = [r.preemptions for r in recs]
    fractions = sum(1 for r in recs if r.job.asked is not None)
    shared = {"useful_gpu_hours": useful, "fraction_jobs": fractions,
              "fraction_waste_gpu_hours": wasted}
    extra = {"lost_to_spot_gpu_hours": spot,
             "spot_reclaims": sum(1 for r in recs for a in r.attempts if a.reclaimed)}
    return {
        "jobs": len(recs),
        "wait_p50_min": percentile(waits, 50),
        "wait_p95_min": percentile(waits, 95),
        "wait_p99_min": percentile(waits, 99),
        "delivered_gpu_hours": delivered,
        "lost_gpu_hours": lost,
        "grace_gpu_hours": grace,
        "preemptions": sum(pre),
        "preemptions_no_loss": no_loss,
        "jobs_preempted": sum(1 for p in pre if p),
        "max_preemptions_per_job": max(pre, default=0),
        # Only for a scenario with clusters: a run without keeps its JSON as it was.
        **(extra if clusters else {}),
        # Only for a workload with jobs that asked a fraction of a GPU, likewise.
        **(shared if any_fraction else {}),
    }


def fairness(result: RunResult, workload: Workload) -> dict[str, object]:
    """Rule M1 for one run: per team the delivered and fair shares over the hours it had
    work queued, their deviation in points, and the per-hour deviations' largest value."""
    sc = workload.scenario
    weight = {t.name: t.weight for t in sc.teams}
    teams = sorted(weight)
    horizon = workload.horizon
    n = max(1, math.ceil(horizon / HOUR))
    demand = {t: [0.0] * n for t in teams}
    used = {t: [0.0] * n for t in teams}
    waiting = {t: [False] * n for t in teams}
    end = result.end
    for r in result.records:
        t, gpus = r.job.team, r.job.share
        done = r.finished if r.finished is not None else end
        _spread(demand[t], HOUR, r.job.submit, min(done, horizon), gpus / HOUR)
        for a in r.attempts:
            _spread(used[t], HOUR, a.start, min(a.end, horizon), gpus / HOUR)
        for s, e in queued_intervals(r, end):
            e = min(e, horizon)
            for b in range(int(s // HOUR), min(n - 1, int(e // HOUR)) + 1):
                if overlap(s, e, b * HOUR, (b + 1) * HOUR) > 0:
                    waiting[t][b] = True
    fair = {t: [0.0] * n for t in teams}
    for b in range(n):
        length = overlap(b * HOUR, (b + 1) * HOUR, 0.0, horizon) / HOUR
        alloc = weighted_max_min({t: demand[t][b] for t in teams}, weight,
                                 sc.total_gpus * length)
        for t in teams:
            fair[t][b] = alloc[t]
    out: dict[str, object] = {}
    worst = 0.0
    for t in teams:
        hours = [b for b in range(n) if waiting[t][b]]
        got = sum(used[t][b] for b in hours)
        got_all = sum(used[x][b] for x in teams for b in hours)
        owed = sum(fair[t][b] for b in hours)
        owed_all = sum(fair[x][b] for x in teams for b in hours)
        delivered_share = got / got_all if got_all > 0 else 0.0
        fair_share = owed / owed_all if owed_all > 0 else 0.0
        per_hour = []
        for b in hours:
            u_all = sum(used[x][b] for x in teams)
            f_all = sum(fair[x][b] for x in teams)
            if u_all > 0 and f_all > 0:
                per_hour.append(100.0 * (used[t][b] / u_all - fair[t][b] / f_all))
        dev = 100.0 * (delivered_share - fair_share) if hours else 0.0
        worst = max(worst, abs(dev))
        out[t] = {
            "weight": weight[t],
            "hours_waiting": len(hours),
            "delivered_share": delivered_share,
            "fair_share": fair_share,
            "deviation_points": dev,
            "max_hourly_deviation_points": max((abs(x) for x in per_hour), default=0.0),
        }
    return {"teams": out, "max_deviation_points": worst}


def utilization(result: RunResult, workload: Workload) -> list[float]:
    """GPUs held / the cluster's GPUs, per `UTIL_BIN` seconds from 0 to the run's end."""
    n = max(1, math.ceil(result.end / UTIL_BIN))
    bins = [0.0] * n
    for r in result.records:
        for a in r.attempts:
            _spread(bins, UTIL_BIN, a.start, a.held_until, r.job.share)
    cap = workload.scenario.total_gpus * UTIL_BIN
    return [b / cap for b in bins]


def clusters_summary(result: RunResult, workload: Workload) -> dict[str, object]:
    """Rules K1-K7 in figures, per cluster: its GPUs (spot ones apart), the mean share
    of them held over the run, the GPU-hours delivered in the horizon and those lost to
    preemption and to spot interruptions (rule K6); and the run's interruptions."""
    sc = workload.scenario
    horizon, end = workload.horizon, result.end
    out: dict[str, dict[str, float]] = {}
    for spec in sorted(sc.clusters, key=lambda c: (c.cost_rank, c.name)):
        nodes = [n for n in sc.nodes if n.cluster == spec.name]
        out[spec.name] = {
            "cost_rank": spec.cost_rank,
            "gpus": sum(n.gpus for n in nodes),
            "spot_gpus": sum(n.gpus for n in nodes if n.spot),
            "held_gpu_hours": 0.0, "delivered_gpu_hours": 0.0,
            "lost_to_preemption_gpu_hours": 0.0, "lost_to_spot_gpu_hours": 0.0,
            "jobs_started": 0,
        }
    for r in result.records:
        for a in r.attempts:
            row = out.get(a.cluster)
            if row is None:
                continue
            row["held_gpu_hours"] += r.job.share * (a.held_until - a.start) / HOUR
            row["jobs_started"] += 1
            row["delivered_gpu_hours"] += r.job.share * overlap(
                a.start, a.kept_until, 0.0, horizon) / HOUR
            if a.requeued:
                key = "lost_to_preemption_gpu_hours" if a.preempted else "lost_to_spot_gpu_hours"
                row[key] += r.job.share * overlap(a.kept_until, a.end, 0.0, horizon) / HOUR
    for c in out.values():
        c["utilization_mean"] = c["held_gpu_hours"] / (c["gpus"] * end / HOUR) \
            if c["gpus"] and end > 0 else 0.0
    reclaimed = [a for r in result.records for a in r.attempts if a.reclaimed]
    return {"clusters": out, "spot": {
        "interruptions": result.interruptions, "attempts_reclaimed": len(reclaimed),
        "lost_gpu_hours": sum(c["lost_to_spot_gpu_hours"] for c in out.values()),
        "lost_to_preemption_gpu_hours": sum(c["lost_to_preemption_gpu_hours"]
                                            for c in out.values())}}


def owed_summary(result: RunResult, workload: Workload) -> dict[str, object]:
    """Rule R11 in figures: the jobs owed their GPUs when submitted, overall and per tier
    (highest first): how many, the p50/p95/p99 of their wait to the first start and the
    p95 of their whole wait, in minutes; the goal "owed p95 <= 1 min + grace" (the
    largest victim grace of the run)."""
    rank = {t.name: t.rank for t in workload.scenario.tiers}
    recs = [r for r in result.records if r.job.id in result.owed]
    end = result.end

    def stats(group: list[JobRecord]) -> dict[str, float]:
        first = [first_wait_seconds(r, end) / 60.0 for r in group]
        return {"jobs": len(group), "wait_p50_min": percentile(first, 50),
                "wait_p95_min": percentile(first, 95), "wait_p99_min": percentile(first, 99),
                "total_wait_p95_min": percentile([wait_seconds(r, end) / 60.0 for r in group],
                                                 95),
                "over_goal": sum(1 for w in first if w > goal)}

    goal = 1.0 + result.grace_seconds / 60.0
    tiers = {t: stats([r for r in recs if r.job.tier == t])
             for t in sorted({r.job.tier for r in recs}, key=lambda x: (-rank.get(x, 0), x))}
    return {"goal_min": goal, "overall": stats(recs), "tiers": tiers}


def summarize(result: RunResult, workload: Workload) -> dict[str, object]:
    """Everything one run is measured by, as plain JSON values (with the scenario's
    clusters, `clusters_summary` too)."""
    horizon, end = workload.horizon, result.end
    several = bool(workload.scenario.clusters)
    recs = result.records
    fractions = any(r.job.asked is not None for r in recs)
    by: dict[str, dict[str, list[JobRecord]]] = {"tiers": {}, "teams": {}, "sizes": {}}
    for r in recs:
        by["tiers"].setdefault(r.job.tier, []).append(r)
        by["teams"].setdefault(r.job.team, []).append(r)
        by["sizes"].setdefault(r.job.size, []).append(r)
    unfinished = sum(1 for r in recs if r.finished is None)
    rank = {t.name: t.rank for t in workload.scenario.tiers}
    order: dict[str, Callable[[str], Any]] = {
        "tiers": lambda x: (-rank.get(x, 0), x), "teams": lambda x: x, "sizes": float}
    return {
        "cycles": result.cycles,
        "end_hours": end / HOUR,
        "unfinished_jobs": unfinished,
        "overall": _group_stats(recs, horizon=horizon, end=end, clusters=several,
                                any_fraction=fractions),
        **{k: {name: _group_stats(v[name], horizon=horizon, end=end, clusters=several,
                                  any_fraction=fractions)
               for name in sorted(v, key=order[k])} for k, v in by.items()},
        "fairness": fairness(result, workload),
        "utilization": {"bin_seconds": UTIL_BIN, "series": utilization(result, workload)},
        **(clusters_summary(result, workload) if several else {}),
        **({"owed": owed_summary(result, workload)} if result.policy == "fairq" else {}),
        **tree_and_bookings(result, workload),
    }


def tree_and_bookings(result: RunResult, workload: Workload) -> dict[str, object]:
    """Quotas in a tree and booked GPUs in figures (docs/simulator.md, "Quotas in a tree
    and bookings"): with departments, per team the owed wait (`tree.owed_waits`); with
    bookings, per occurrence its delay, crossing jobs and GPU-hours used, lent and empty
    (`bookings.occurrence_report`). Nothing for a flat scenario without bookings, whose
    JSON stays as it was."""
    from .bookings import expand, occurrence_report
    from .tree import owed_waits

    sc = workload.scenario
    out: dict[str, object] = {}
    if any(t.parent for t in sc.teams):
        out["tree"] = {"owed_waits": owed_waits(result, workload)}
    if sc.bookings:
        rows = occurrence_report(result, workload, expand(sc.bookings, workload.horizon))
        out["bookings"] = {"occurrences": rows, **booking_totals(rows)}
    return out


def booking_totals(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The occurrences' sums (GPU-hours) and their largest delay and crossing count."""
    keys = ("booked_gpu_hours", "used_gpu_hours", "lent_gpu_hours", "empty_gpu_hours",
            "unclear_gpu_hours", "crossed_gpu_hours")
    out = {k: float(sum(r[k] for r in rows)) for k in keys}
    out["delay_max_seconds"] = max((float(r["delay_seconds"]) for r in rows), default=0.0)
    out["crossed_jobs"] = float(sum(r["crossed_jobs"] for r in rows))
    out["team_owed_wait_max_seconds"] = max(
        (float(r["team_owed_wait_max_seconds"]) for r in rows), default=0.0)
    return out


def goals(policies: Mapping[str, Mapping[str, object]], *, high_tier: str = "high",
          large_gpus: str = "8", with_gpu_spec: bool = False) -> dict[str, float]:
    """The replay goals' metrics (docs/simulator.md) for the fairq run against its baselines (reported, not
    asserted): delivered vs greedy and EASY (%), lost / delivered (%), most preemptions
    of one job, the high tier's p95 wait, the 8-GPU p95 wait vs greedy backfill's, and
    the largest fairness deviation. `with_gpu_spec`: the run restricts tasks to GPU types
    (the goal "delivered ≥ greedy backfill's with the same spec" applies)."""

    def stat(policy: str, *path: str) -> float:
        node: object = policies[policy]
        for p in path:
            if not isinstance(node, Mapping) or p not in node:
                return 0.0
            node = node[p]
        return float(node) if isinstance(node, int | float) else 0.0

    out: dict[str, float] = {}
    if "fairq" not in policies:
        return out
    d = stat("fairq", "overall", "delivered_gpu_hours")
    for base in ("greedy", "easy", "fifo"):
        if base in policies:
            b = stat(base, "overall", "delivered_gpu_hours")
            out[f"delivered_vs_{base}_pct"] = 100.0 * d / b if b else 0.0
    out["lost_pct_of_delivered"] = 100.0 * stat("fairq", "overall", "lost_gpu_hours") / d if d else 0.0
    out["max_preemptions_per_job"] = stat("fairq", "overall", "max_preemptions_per_job")
    out["preemptions"] = stat("fairq", "overall", "preemptions")
    out["preemptions_no_loss"] = stat("fairq", "overall", "preemptions_no_loss")
    owed = policies["fairq"].get("owed")
    if isinstance(owed, Mapping):
        # Rule R11: the owed jobs' p95 wait to their first start, overall and per tier.
        out["owed_goal_min"] = stat("fairq", "owed", "goal_min")
        out["owed_jobs"] = stat("fairq", "owed", "overall", "jobs")
        out["owed_p95_wait_min"] = stat("fairq", "owed", "overall", "wait_p95_min")
        tiers = owed.get("tiers")
        for tier in tiers if isinstance(tiers, Mapping) else ():
            out[f"owed_{tier}_p95_wait_min"] = stat("fairq", "owed", "tiers", tier,
                                                    "wait_p95_min")
            out[f"owed_{tier}_jobs"] = stat("fairq", "owed", "tiers", tier, "jobs")
    out[f"{high_tier}_p95_wait_min"] = stat("fairq", "tiers", high_tier, "wait_p95_min")
    out[f"gpus{large_gpus}_p95_wait_min"] = stat("fairq", "sizes", large_gpus, "wait_p95_min")
    for base in ("greedy", "easy"):
        if base in policies:
            out[f"gpus{large_gpus}_p95_wait_{base}_min"] = stat(
                base, "sizes", large_gpus, "wait_p95_min")
    out["fairness_max_deviation_points"] = stat("fairq", "fairness", "max_deviation_points")
    if with_gpu_spec:
        out["with_gpu_spec"] = 1.0
    return out



def _at_most(limit: float) -> Callable[[float], bool]:
    return lambda v: v <= limit


def goal_checks(goals_: Mapping[str, float], *, high_tier: str = "high",
                large_gpus: str = "8") -> list[tuple[str, str, float, bool, str]]:
    """The replay goals of one run's `goals` (fairq against the baselines of the same
    run), each as (key, the goal in words, the measured value, met, unit). A goal whose
    metric is missing (no such tier or baseline in the run) is left out. Since rule R11
    (2026-12-06) the owed jobs' p95 wait replaces the high tier's as a goal (the high
    tier's p95 is reported, no goal), and "delivered >= EASY backfill's" is withdrawn
    (EASY never preempts): its figure stays in `goals`."""
    g = goals_
    large = f"gpus{large_gpus}_p95_wait"
    rows: list[tuple[str, str, str, Callable[[float], bool], str]] = [
        ("delivered_vs_greedy", "delivered >= 99 % of greedy backfill's",
         "delivered_vs_greedy_pct", lambda v: v >= 99.0, "%"),
        ("lost", "GPU-hours lost to preemption <= 1 % of delivered",
         "lost_pct_of_delivered", lambda v: v <= 1.0, "%"),
        ("max_preemptions", "no job preempted more than 3 times",
         "max_preemptions_per_job", lambda v: v <= 3, ""),
    ]
    if "owed_p95_wait_min" in g:
        limit = g.get("owed_goal_min", 1.0)
        rows.append(("owed_p95", f"owed jobs' p95 wait <= 1 min + grace ({limit:g} min)",
                     "owed_p95_wait_min", _at_most(limit), "min"))
    for base, name in (("greedy", "greedy"), ("easy", "EASY")):
        if f"{large}_{base}_min" in g:
            limit = g[f"{large}_{base}_min"]
            rows.append((f"gpus{large_gpus}_p95_vs_{base}",
                         f"{large_gpus}-GPU p95 wait <= {name} backfill's ({limit:.0f} min)",
                         f"{large}_min", _at_most(limit), "min"))
    rows.append(("fairness", "every team within 5 points of its M1 share",
                 "fairness_max_deviation_points", lambda v: v <= 5.0, "points"))
    if g.get("with_gpu_spec"):
        rows.append(("delivered_vs_greedy_spec",
                     "with gpu_spec: delivered >= greedy backfill's (same spec)",
                     "delivered_vs_greedy_pct", lambda v: v >= 100.0, "%"))
    return [(key, text, g[metric], test(g[metric]), unit)
            for key, text, metric, test, unit in rows if metric in g]
