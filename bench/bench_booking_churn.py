"""Where a booking's preemptions fall on the openb week (docs/simulator.md, "A week of
the openb trace with departments and a booking").

Question: does a booking add preemptions, and if so where (the 2 h before each start,
the windows, elsewhere), which jobs take the most, and does every preemptor run soon
after its preemption (a preemptor not admitted within `--settle` seconds freed GPUs it
could not use: a loop)? The replay's every plan is watched through `run_fairq`'s
`on_cycle`; nothing in the policy or the simulator is changed.

The week: `--gpus 32 --rho 0.95`, fairq alone; `--booking` as in bench_sim_tree.py
(team-1 books 8 GPUs Tuesday, Thursday and Saturday 14:00-16:00 UTC, lent), or none.

Output: `BENCH booking_churn_s<seed>_<variant>_<metric> <value> <unit>` (victims in the
windows, before them, elsewhere; the most of one job; preemptions whose preemptor was not
admitted within the settle time), then the jobs preempted most with their preemptors.

    .venv/bin/python bench/bench_booking_churn.py [--seed 0] [--variant booking|flat]
        [--departments N] [--settle 900]

No database, no Django: the simulator is pure (queueing/simulator/).
"""

from __future__ import annotations

import argparse
import bisect
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _common import bench, note

from queueing.policy.admission import Plan
from queueing.simulator.bookings import expand, seconds
from queueing.simulator.cli import load_workload, parser
from queueing.simulator.engine import run_fairq

BOOKING = "team-1:openb:8@Tue14:00/2h/FREQ=WEEKLY;BYDAY=TU,TH,SA"
HOUR = 3600.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variant", choices=("booking", "flat"), default="booking")
    ap.add_argument("--departments", type=int)
    ap.add_argument("--settle", type=float, default=900.0,
                    help="seconds a preemptor has to be admitted (900)")
    args = ap.parse_args()
    week = ["--gpus", "32", "--rho", "0.95", "--seed", str(args.seed), "--policies", "fairq"]
    argv = list(week)
    if args.variant == "booking":
        argv += ["--booking", BOOKING]
    if args.departments:
        argv += ["--departments", str(args.departments)]
    workload = load_workload(parser().parse_args(argv))
    # The windows are the booking's occurrences (also for `flat`: the same hours).
    booked = load_workload(parser().parse_args([*week, "--booking", BOOKING]))
    windows = [seconds(b) for b in expand(booked.scenario.bookings, booked.horizon)]
    preemptions: list[tuple[float, int, list[int]]] = []  # (instant, preemptor, victims)
    admitted: dict[int, list[float]] = defaultdict(list)

    def on_cycle(now: float, plan: Plan) -> None:
        for a in plan.admissions:
            admitted[a.job_id].append(now)
        for p in plan.preemptions:
            preemptions.append((now, p.preemptor_id, [v.job_id for v in p.victims]))

    run_fairq(workload, on_cycle=on_cycle)

    def zone(t: float) -> str:
        for start, end in windows:
            if start - 2 * HOUR <= t < start:
                return "before"
            if start <= t < end:
                return "in"
        return "elsewhere"

    victims: Counter[str] = Counter()
    unsettled: Counter[str] = Counter()
    per_job: Counter[int] = Counter()
    by_whom: dict[int, set[int]] = defaultdict(set)
    for t, preemptor, ids in preemptions:
        z = zone(t)
        victims[z] += len(ids)
        for i in ids:
            per_job[i] += 1
            by_whom[i].add(preemptor)
        if preemptor:  # rule W2's own preemption has none (preemptor 0)
            times = admitted.get(preemptor, [])
            k = bisect.bisect_right(times, t)
            if not (k < len(times) and times[k] <= t + args.settle):
                unsettled[z] += len(ids)
    tag = f"booking_churn_s{args.seed}_{args.variant}" + (
        f"_d{args.departments}" if args.departments else "")
    for z in ("before", "in", "elsewhere"):
        bench(f"{tag}_victims_{z}", victims[z], "count")
        bench(f"{tag}_unsettled_{z}", unsettled[z], "count")
    bench(f"{tag}_victims", sum(victims.values()), "count")
    top = per_job.most_common(1)
    bench(f"{tag}_max_per_job", top[0][1] if top else 0, "count")
    for job_id, n in per_job.most_common(5):
        note(f"job {job_id}: preempted {n} times by {len(by_whom[job_id])} preemptors")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
