"""A quiet cycle's publish of the queue plan (docs/performance.md, "The plan published
only when the queue changed").

Question: what does the cycle's step 6 (`queue_plan_publish`) cost on a cycle that moved
nothing, before (every cycle publishes) and after (the mark, `plan_inputs_mark`, is the
last plan's: nothing is published)?

World: bench_fleet.py's snapshot at `--queued` (default 100,000) queued jobs, 150,000
running on 5,000 nodes, 1,000 teams; its plan made once (the pure pass, untimed). Each
round times, alternately in one process:
  * before: `queue_plan_publish(mark=None)`: the compact plan built, pickled and written
    to the cache (Redis at $REDIS_URL, else the process's memory);
  * after: `plan_inputs_mark` on the snapshot, then `queue_plan_publish(mark=...)`: the
    same mark as the plan standing (published by the round before it), so it is kept.
  BENCH plan_publish_quiet_<n>_before_p50 / _cpu_p50   seconds (wall / CPU of the process)
  BENCH plan_publish_quiet_<n>_after_p50 / _cpu_p50
  BENCH plan_publish_mark_<n>_p50                     seconds of the mark alone
And the step itself, the plan read per job or per class (docs/performance.md, "The
published plan read per class"): `queue_plan_publish(mark=None)` with
`queue_plan._PER_CLASS_READ` off (a `Wait` per job, the order's ids made) and on,
alternately, the plan put back as the pass left it (waits in bulk, order as indices)
before each:
  BENCH plan_publish_read_<n>_per_job_p50 / _cpu_p50   seconds (wall / CPU)
  BENCH plan_publish_read_<n>_per_class_p50 / _cpu_p50
`--read-only` times only that.
The machine is shared: read the figures beside calibration_1M_loop and the load average.
Run: `REDIS_URL=redis://127.0.0.1:6379/N .venv/bin/python bench/bench_plan_publish.py`.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note  # noqa: E402  (bench/ is sys.path[0])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--queued", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--read-only", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    import bench_fleet

    from queueing.policy.admission import plan_admissions
    from queueing.selectors import queue_plan as qp

    t = time.perf_counter()
    for _ in range(1_000_000):
        pass
    bench("calibration_1M_loop", time.perf_counter() - t, "s")
    with open("/proc/loadavg") as f:
        note(f"load {f.read().strip()}")
    n = args.queued
    snapshot = bench_fleet.snapshot(n)
    plan = plan_admissions(snapshot)
    note(f"world: {len(snapshot.queued)} queued, {len(snapshot.running)} running, "
         f"{len(snapshot.nodes)} nodes; plan made")
    read_per_class(qp, snapshot, plan, n, args.rounds)
    if args.read_only:
        return
    sides: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
    marks: list[float] = []
    qp.queue_plan_publish(snapshot=snapshot, plan=plan, admitted=(), unprovisioned=(),
                          mark=qp.plan_inputs_mark(snapshot, jobs_version=1))
    for _ in range(args.rounds):
        for side in ("before", "after"):
            w, c = time.perf_counter(), time.process_time()
            if side == "before":
                qp.queue_plan_publish(snapshot=snapshot, plan=plan, admitted=(),
                                      unprovisioned=())
                sides[side].append((time.perf_counter() - w, time.process_time() - c))
                # Untimed: the plan published again with its mark, for the next `after`.
                qp.queue_plan_publish(snapshot=snapshot, plan=plan, admitted=(),
                                      unprovisioned=(),
                                      mark=qp.plan_inputs_mark(snapshot, jobs_version=1))
                continue
            m0 = time.perf_counter()
            mark = qp.plan_inputs_mark(snapshot, jobs_version=1)
            marks.append(time.perf_counter() - m0)
            kept = qp.queue_plan_publish(snapshot=snapshot, plan=plan, admitted=(),
                                         unprovisioned=(), mark=mark)
            sides[side].append((time.perf_counter() - w, time.process_time() - c))
            assert kept is not None and kept.generation == qp._LAST_MARK[0].generation
        with open("/proc/loadavg") as f:
            note(f"load {f.read().strip()}")
    for side, rows in sides.items():
        bench(f"plan_publish_quiet_{n}_{side}_p50", statistics.median(r[0] for r in rows), "s")
        bench(f"plan_publish_quiet_{n}_{side}_cpu_p50",
              statistics.median(r[1] for r in rows), "s")
    bench(f"plan_publish_mark_{n}_p50", statistics.median(marks), "s")


def read_per_class(qp: Any, snapshot: Any, plan: Any, n: int, rounds: int) -> None:
    """Step 6 with the plan read per job, then per class, alternately; the plan's lazy
    state (waits in bulk, order as indices) put back before each, as a cycle has it."""
    waits, order = plan.waits, plan.order
    kept_waits = (waits._raw, waits.bulk, waits.bulk_held, waits.segments)
    kept_order = (getattr(order, "_indices", None), getattr(order, "_ids", None),
                  getattr(order, "_tuple", None))
    note(f"waits in bulk: {len(waits.bulk)}, raw: {len(waits._raw)}")

    def as_the_pass_left_it() -> None:
        waits._raw, waits.bulk, waits.bulk_held, waits.segments = kept_waits
        if hasattr(order, "_tuple"):
            order._indices, order._ids, order._tuple = kept_order

    sides: dict[str, list[tuple[float, float]]] = {"per_job": [], "per_class": []}
    columns: dict[str, Any] = {}
    for _ in range(rounds):
        for side in ("per_job", "per_class"):
            as_the_pass_left_it()
            qp._PER_CLASS_READ = side == "per_class"
            gc.collect()
            w, c = time.perf_counter(), time.process_time()
            published = qp.queue_plan_publish(snapshot=snapshot, plan=plan, admitted=(),
                                              unprovisioned=())
            sides[side].append((time.perf_counter() - w, time.process_time() - c))
            columns[side] = (published.ids, published.code_ix, published.message_ix,
                             published.messages, published.until_ix)
        assert columns["per_job"] == columns["per_class"]
        with open("/proc/loadavg") as f:
            note(f"load {f.read().strip()}")
    qp._PER_CLASS_READ = True
    for side, rows in sides.items():
        bench(f"plan_publish_read_{n}_{side}_p50", statistics.median(r[0] for r in rows), "s")
        bench(f"plan_publish_read_{n}_{side}_cpu_p50",
              statistics.median(r[1] for r in rows), "s")


if __name__ == "__main__":
    main()
