"""The PNG report of a simulation (matplotlib, Agg backend: no display needed) and the
text tables printed on stdout."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

POLICY_ORDER = ("fairq", "fifo", "greedy", "easy")


def _ordered(policies: Mapping[str, Any]) -> list[str]:
    return [p for p in POLICY_ORDER if p in policies] + sorted(
        p for p in policies if p not in POLICY_ORDER)


def text_report(doc: Mapping[str, Any]) -> str:
    """Tables: per policy overall, per tier and size, per team (with fairness), goals."""
    pol = doc["policies"]
    names = _ordered(pol)
    lines = [f"workload: {doc['source']}", f"horizon: {doc['horizon_hours']:.2f} h", ""]
    hdr = (f"{'policy':8} {'deliv GPU-h':>11} {'lost GPU-h':>10} {'preempt':>7} {'max/job':>7} "
           f"{'p50 min':>8} {'p95 min':>8} {'p99 min':>8} {'fair dev':>8} {'cycles':>7}")
    lines += [hdr, "-" * len(hdr)]
    for p in names:
        o = pol[p]["overall"]
        lines.append(
            f"{p:8} {o['delivered_gpu_hours']:11.1f} {o['lost_gpu_hours']:10.1f} "
            f"{o['preemptions']:7d} {o['max_preemptions_per_job']:7d} {o['wait_p50_min']:8.1f} "
            f"{o['wait_p95_min']:8.1f} {o['wait_p99_min']:8.1f} "
            f"{pol[p]['fairness']['max_deviation_points']:8.1f} {pol[p]['cycles']:7d}")
    for group, label in (("tiers", "tier"), ("sizes", "GPUs"), ("teams", "team")):
        lines += ["", f"{label:8} {'policy':8} {'jobs':>6} {'p50 min':>8} {'p95 min':>8} "
                      f"{'p99 min':>8} {'deliv GPU-h':>11} {'lost GPU-h':>10} {'preempt':>7}"]
        keys = list(pol[names[0]][group])
        for k in keys:
            for p in names:
                s = pol[p][group].get(k)
                if s is None:
                    continue
                lines.append(
                    f"{k:8} {p:8} {s['jobs']:6d} {s['wait_p50_min']:8.1f} {s['wait_p95_min']:8.1f} "
                    f"{s['wait_p99_min']:8.1f} {s['delivered_gpu_hours']:11.1f} "
                    f"{s['lost_gpu_hours']:10.1f} {s['preemptions']:7d}")
    lines += ["", f"{'team':8} {'policy':8} {'weight':>6} {'hours':>5} {'delivered %':>11} "
                  f"{'fair %':>7} {'dev pts':>7}"]
    for team in pol[names[0]]["fairness"]["teams"]:
        for p in names:
            f = pol[p]["fairness"]["teams"][team]
            lines.append(f"{team:8} {p:8} {f['weight']:6g} {f['hours_waiting']:5d} "
                         f"{100 * f['delivered_share']:11.1f} {100 * f['fair_share']:7.1f} "
                         f"{f['deviation_points']:7.1f}")
    lines += clusters_text(doc)
    lines += shared_lines(doc)
    lines += owed_lines(doc)
    lines += tree_and_booking_lines(doc)
    lines += wait_cause_lines(doc)
    if doc.get("goals"):
        lines += ["", "goals (fairq):"]
        lines += [f"  {k} {v:.2f}" for k, v in doc["goals"].items()]
    return "\n".join(lines) + "\n"


def shared_lines(doc: Mapping[str, Any]) -> list[str]:
    """Shared GPUs (docs/simulator.md, "Fractional GPUs"): per policy the GPU-hours the
    tasks asked (useful) against those delivered, and what the jobs that asked a
    fraction held beyond it (a whole GPU, or the slice grid's rounding)."""
    pol = doc["policies"]
    names = [p for p in _ordered(pol) if "useful_gpu_hours" in pol[p]["overall"]]
    if not names:
        return []
    types = ", ".join(f"{t} {s} slices per GPU"
                      for t, s in doc["cluster"].get("slices_per_gpu", {}).items())
    lines = ["", f"shared GPUs ({types or 'none'}; no memory isolation)"
                 + (": each fraction on a whole GPU" if doc["source"].get("whole_gpus") else ""),
             f"{'policy':8} {'deliv GPU-h':>11} {'useful GPU-h':>12} {'fraction jobs':>13} "
             f"{'wasted by fractions GPU-h':>25}"]
    for p in names:
        o = pol[p]["overall"]
        lines.append(f"{p:8} {o['delivered_gpu_hours']:11.1f} {o['useful_gpu_hours']:12.1f} "
                     f"{o['fraction_jobs']:13d} {o['fraction_waste_gpu_hours']:25.1f}")
    return lines


def owed_lines(doc: Mapping[str, Any]) -> list[str]:
    """Rule R11 (fairq): the jobs owed their GPUs when submitted, per tier, their wait to
    the first start against the goal; preemptions that lost nothing; GPU-hours held by
    victims in their grace."""
    fq = doc["policies"].get("fairq", {})
    owed = fq.get("owed")
    if not owed:
        return []
    o = fq["overall"]
    lines = ["", f"owed jobs (fairq, rule R11): wait to the first start, goal p95 <= "
                 f"{owed['goal_min']:g} min (1 min + grace)",
             f"{'tier':8} {'jobs':>6} {'p50 min':>8} {'p95 min':>8} {'p99 min':>8} "
             f"{'> goal':>6} {'all waits p95':>13}"]
    for name, t in [("(all)", owed["overall"]), *owed["tiers"].items()]:
        lines.append(f"{name:8} {t['jobs']:6d} {t['wait_p50_min']:8.1f} {t['wait_p95_min']:8.1f} "
                     f"{t['wait_p99_min']:8.1f} {t['over_goal']:6d} {t['total_wait_p95_min']:13.1f}")
    lines.append(f"preemptions with no work lost: {o['preemptions_no_loss']} of {o['preemptions']}; "
                 f"GPU-hours held by victims in their grace: {o['grace_gpu_hours']:.1f}")
    return lines


def tree_and_booking_lines(doc: Mapping[str, Any]) -> list[str]:
    """Quotas in a tree and booked GPUs (fairq; docs/simulator.md, "Quotas in a tree and
    bookings"): per team its owed wait; per booking occurrence its delay, the jobs that
    crossed into it and its GPU-hours used, lent, empty and held by jobs that may not be
    there."""
    fq = doc["policies"].get("fairq", {})
    lines: list[str] = []
    tree = fq.get("tree")
    if tree:
        lines += ["", "owed wait (fairq, quotas in a tree): queued while the team and every "
                      "department above it are within their nominal",
                  f"{'team':10} {'owed jobs':>9} {'owed h':>8} {'longest s':>9}"]
        for team, t in tree["owed_waits"].items():
            lines.append(f"{team:10} {t['owed_jobs']:9d} {t['owed_wait_hours']:8.2f} "
                         f"{t['owed_wait_max_seconds']:9.0f}")
    booked = fq.get("bookings")
    if booked:
        lines += ["", "bookings (fairq): per occurrence, GPU-hours of the booked GPUs",
                  f"{'id':>3} {'team':10} {'GPUs':>4} {'start h':>7} {'delay s':>7} "
                  f"{'crossed':>7} {'used':>7} {'lent':>7} {'empty':>7} {'unclear':>7} "
                  f"{'team wait s':>11}"]
        for o in booked["occurrences"]:
            lines.append(
                f"{o['id']:3d} {o['team']:10} {o['gpus']:4d} {o['start_hours']:7.1f} "
                f"{o['delay_seconds']:7.0f} {o['crossed_jobs']:7d} {o['used_gpu_hours']:7.2f} "
                f"{o['lent_gpu_hours']:7.2f} {o['empty_gpu_hours']:7.2f} "
                f"{o['unclear_gpu_hours']:7.2f} {o['team_owed_wait_max_seconds']:11.0f}")
    return lines


def wait_cause_lines(doc: Mapping[str, Any]) -> list[str]:
    """Why each tier waited under fairq (the wait causes of docs/simulator.md) and the
    floors of the non-preemptible tiers' waits, as text lines."""
    fq = doc["policies"].get("fairq", {})
    tiers = fq.get("wait_causes")
    if not tiers:
        return []
    lines = ["", "why each tier waited (fairq): time waited by the cause each cycle gave"]
    hdr = (f"{'tier':8} {'cause':26} {'wait h':>8} {'share %':>7} {'jobs':>6} {'p95 min':>8} "
           f"{'main of':>7} {'their p95':>9} {'> goal':>6}")
    lines += [hdr, "-" * len(hdr)]
    for tier, t in tiers.items():
        for cause, c in t["causes"].items():
            lines.append(
                f"{tier:8} {cause:26} {c['wait_hours']:8.1f} {c['share_pct']:7.1f} "
                f"{c['jobs']:6d} {c['p95_min']:8.1f} {c['main_jobs']:7d} "
                f"{c['main_wait_p95_min']:9.1f} {c['main_over_goal']:6d}")
        lines.append(f"{tier:8} {'(all)':26} {t['wait_hours']:8.1f} {100.0:7.1f} {t['jobs']:6d}"
                     f" {'':8} {'':7} {'':9} {t['over_goal']:6d}")
    floors = doc.get("wait_floors")
    if floors:
        lines += ["", f"floors of the non-preemptible tiers' wait ({', '.join(floors['tiers'])}"
                      ", counted GPUs): p50 / p95 / p99 min, jobs over 1 min"]
        for name, label in (("nominal", "admitted when its team's nominal has room (Q2)"),
                            ("cluster", "the whole cluster theirs, nothing else running")):
            f = floors[name]
            lines.append(f"  {label:48} {f['wait_p50_min']:6.1f} {f['wait_p95_min']:6.1f} "
                         f"{f['wait_p99_min']:6.1f}  {f['over_goal']} of {f['jobs']}")
    return lines


def _short(line: str, width: int = 96) -> str:
    return line if len(line) <= width else line[:width - 1] + "…"


def png_report(doc: Mapping[str, Any], path: str) -> None:
    """Seven plots: utilization over time, p95 wait per tier and per size, delivered and
    lost GPU-hours, fairness deviation per team, preemptions per job (fairq), and why
    each tier waited (fairq's wait causes stacked, and their table with the floors)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pol = doc["policies"]
    names = _ordered(pol)
    fig, axes = plt.subplots(2, 4, figsize=(24, 10))
    ax = axes[0][0]
    for p in names:
        u = pol[p]["utilization"]
        xs = [i * u["bin_seconds"] / 3600.0 for i in range(len(u["series"]))]
        ax.plot(xs, [100 * v for v in u["series"]], label=p, linewidth=1)
    ax.axvline(doc["horizon_hours"], color="grey", linestyle=":", label="horizon")
    ax.set(title="GPU utilization", xlabel="hours", ylabel="% of GPUs held", ylim=(0, 105))
    ax.legend()

    def bars(ax: Any, group: str, metric: str, title: str, ylabel: str) -> None:
        keys = list(pol[names[0]][group])
        width = 0.8 / len(names)
        for i, p in enumerate(names):
            vals = [pol[p][group].get(k, {}).get(metric, 0.0) for k in keys]
            ax.bar([x + i * width for x in range(len(keys))], vals, width, label=p)
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(keys))], keys)
        ax.set(title=title, ylabel=ylabel)
        ax.legend()

    bars(axes[0][1], "tiers", "wait_p95_min", "p95 wait per tier", "minutes")
    bars(axes[0][2], "sizes", "wait_p95_min", "p95 wait per job size (GPUs)", "minutes")
    ax = axes[1][0]
    x = range(len(names))
    ax.bar(x, [pol[p]["overall"]["delivered_gpu_hours"] for p in names], label="delivered")
    ax.bar(x, [pol[p]["overall"]["lost_gpu_hours"] for p in names],
           bottom=[pol[p]["overall"]["delivered_gpu_hours"] for p in names],
           label="lost to preemption", color="tab:red")
    ax.set_xticks(list(x), names)
    ax.set(title="GPU-hours in the horizon", ylabel="GPU-hours")
    ax.legend()
    ax = axes[1][1]
    teams = list(pol[names[0]]["fairness"]["teams"])
    width = 0.8 / len(names)
    for i, p in enumerate(names):
        ft = pol[p]["fairness"]["teams"]
        ax.bar([k + i * width for k in range(len(teams))],
               [ft[t]["deviation_points"] for t in teams], width, label=p)
    ax.axhline(5, color="grey", linestyle=":")
    ax.axhline(-5, color="grey", linestyle=":")
    ax.set_xticks([k + width * (len(names) - 1) / 2 for k in range(len(teams))],
                  [f"{t} (w {pol[names[0]]['fairness']['teams'][t]['weight']:g})" for t in teams])
    ax.set(title="fairness: delivered − weighted max-min share (M1)", ylabel="points")
    ax.legend()
    ax = axes[1][2]
    hist = doc.get("preemption_histogram", {})
    if hist:
        ks = sorted(hist, key=int)
        ax.bar([int(k) for k in ks], [hist[k] for k in ks], color="tab:red")
        ax.set_yscale("log")
    ax.set(title="fairq: jobs by times preempted", xlabel="preemptions of one job",
           ylabel="jobs (log)")
    ax = axes[0][3]
    tiers = pol.get("fairq", {}).get("wait_causes", {})
    names_c = sorted({c for t in tiers.values() for c in t["causes"]})
    bottom = [0.0] * len(tiers)
    for cause in names_c:
        vals = [t["causes"].get(cause, {}).get("wait_hours", 0.0) for t in tiers.values()]
        ax.bar(range(len(tiers)), vals, bottom=bottom, label=cause)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_xticks(list(range(len(tiers))), list(tiers))
    ax.set(title="fairq: why each tier waited", ylabel="job-hours waited")
    if names_c:
        ax.legend(fontsize=7)
    ax = axes[1][3]
    ax.axis("off")
    text = wait_cause_lines(doc)
    if text:
        ax.text(0.0, 1.0, "\n".join(_short(line) for line in text[1:]), va="top",
                family="monospace", fontsize=6, transform=ax.transAxes)
    fig.suptitle(f"fairq-sim: {doc['source']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def clusters_text(doc: Mapping[str, Any]) -> list[str]:
    """Rules K1-K7: per policy run with clusters, each cluster's GPUs, mean utilization,
    delivered GPU-hours and GPU-hours lost to preemption and to spot interruptions; then
    the interruptions. Nothing for a run without clusters."""
    pol = doc["policies"]
    lines: list[str] = []
    for p in _ordered(pol):
        clusters = pol[p].get("clusters")
        if not clusters:
            continue
        lines += ["", f"{'cluster':12} {'policy':8} {'rank':>4} {'GPUs':>5} {'spot':>5} "
                      f"{'util %':>6} {'deliv GPU-h':>11} {'lost preempt':>12} {'lost spot':>9}"]
        for name, c in clusters.items():
            lines.append(
                f"{name:12} {p:8} {c['cost_rank']:4d} {c['gpus']:5d} {c['spot_gpus']:5d} "
                f"{100 * c['utilization_mean']:6.1f} {c['delivered_gpu_hours']:11.1f} "
                f"{c['lost_to_preemption_gpu_hours']:12.1f} {c['lost_to_spot_gpu_hours']:9.1f}")
        sp = pol[p]["spot"]
        lines.append(f"spot ({p}): {sp['interruptions']} interruptions, "
                     f"{sp['attempts_reclaimed']} attempts requeued, {sp['lost_gpu_hours']:.1f} "
                     f"GPU-hours lost to spot, {sp['lost_to_preemption_gpu_hours']:.1f} to "
                     "preemption")
    return lines


def clusters_png(doc: Mapping[str, Any], path: str) -> None:
    """Two plots for a run with clusters (fairq's): per cluster the delivered GPU-hours
    and those lost to preemption and to spot (stacked), and the mean utilization."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    clusters = doc["policies"]["fairq"]["clusters"]
    names = list(clusters)
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    x = range(len(names))
    bottom = [0.0] * len(names)
    for key, label, color in (("delivered_gpu_hours", "delivered", "tab:blue"),
                              ("lost_to_preemption_gpu_hours", "lost to preemption", "tab:red"),
                              ("lost_to_spot_gpu_hours", "lost to spot", "tab:orange")):
        vals = [clusters[n][key] for n in names]
        left.bar(list(x), vals, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    left.set_xticks(list(x), names)
    left.set(title="fairq: GPU-hours per cluster in the horizon", ylabel="GPU-hours")
    left.legend()
    right.bar(list(x), [100 * clusters[n]["utilization_mean"] for n in names])
    right.set_xticks(list(x), names)
    right.set(title="fairq: mean utilization per cluster", ylabel="% of its GPUs held",
              ylim=(0, 105))
    spot = doc["policies"]["fairq"]["spot"]
    fig.suptitle(f"{spot['interruptions']} spot interruptions; "
                 f"{spot['lost_gpu_hours']:.1f} GPU-hours lost to spot, "
                 f"{spot['lost_to_preemption_gpu_hours']:.1f} to preemption", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def tree_bookings_png(doc: Mapping[str, Any], path: str) -> None:
    """Two plots for a fairq run with departments or bookings: each booking occurrence's
    GPU-hours used by its team, lent, empty and held by jobs that may not be there
    (stacked), with its start delay; and each team's longest owed wait against rule
    R11's goal (1 min + grace)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fq = doc["policies"]["fairq"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(14, 5))
    occ = fq.get("bookings", {}).get("occurrences", [])
    x = list(range(len(occ)))
    bottom = [0.0] * len(occ)
    for key, label, color in (("used_gpu_hours", "used by the team", "tab:blue"),
                              ("lent_gpu_hours", "lent", "tab:green"),
                              ("empty_gpu_hours", "empty", "tab:gray"),
                              ("unclear_gpu_hours", "held by jobs that may not", "tab:red")):
        vals = [o[key] for o in occ]
        left.bar(x, vals, bottom=bottom, label=label, color=color)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    left.set_xticks(x, [f"{o['team']} {o['start_hours']:.0f} h\ndelay {o['delay_seconds']:.0f} s"
                        for o in occ])
    left.set(title="fairq: booked GPU-hours per occurrence", ylabel="GPU-hours")
    if occ:
        left.legend()
    owed = fq.get("tree", {}).get("owed_waits", {})
    teams = list(owed)
    right.bar(range(len(teams)), [owed[t]["owed_wait_max_seconds"] for t in teams])
    if teams:
        goal = float(fq.get("owed", {}).get("goal_min", 1.0)) * 60.0
        right.axhline(goal, color="grey", linestyle=":",
                      label=f"{goal:.0f} s: rule R11's goal, 1 min + grace")
        right.legend()
    right.set_xticks(list(range(len(teams))), teams)
    right.set(title="fairq: longest owed wait per team (quotas in a tree)", ylabel="seconds")
    fig.suptitle(_short(f"fairq-sim: {doc['source']}", 170), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)
