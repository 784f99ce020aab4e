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
And the step itself, the plan read per job, per class, or built in classes over arrays
(docs/performance.md, "The published plan read per class", "The published plan built
per class"): `queue_plan_publish(mark=None)` with `queue_plan._PER_CLASS_READ` off (a
`Wait` per job, the order's ids made), on, and on with `queue_plan._IN_CLASSES`,
alternately (`--sides`: which of per_job,per_class,in_classes), the plan put back as the
pass left it (waits in bulk, order as indices) before each, every column asserted equal:
  BENCH plan_publish_read_<n>_<side>_p50 / _cpu_p50   seconds (wall / CPU)
  BENCH plan_publish_bytes_<n>                        the pickled plan the cache is sent
  BENCH plan_publish_peak_rss_added_<n>_<sides>       MB the process's peak grew from
                                                      before the first publish
`--read-only` times only that. `--profile`: one publish taken apart (CPU of the read of
the waits alone, the columns, the pickle, the cache write; then cProfile's top lines),
and nothing else:
  BENCH plan_publish_parts_<n>_<part>_cpu  seconds
The machine is shared: read the figures beside calibration_1M_loop and the load average.
Run: `REDIS_URL=redis://127.0.0.1:6379/N .venv/bin/python bench/bench_plan_publish.py`.
"""

from __future__ import annotations

import argparse
import gc
import os
import pickle
import resource
import statistics
import sys
import time
from dataclasses import fields
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
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--sides", default="per_job,per_class,in_classes")
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
    if args.profile:
        profile(qp, snapshot, plan, n)
        return
    read_per_class(qp, snapshot, plan, n, args.rounds, tuple(args.sides.split(",")))
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


def read_per_class(qp: Any, snapshot: Any, plan: Any, n: int, rounds: int,
                   names: tuple[str, ...] = ("per_job", "per_class", "in_classes")) -> None:
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

    sides: dict[str, list[tuple[float, float]]] = {side: [] for side in names}
    columns: dict[str, Any] = {}
    rss_before = _rss_mb()
    for _ in range(rounds):
        for side in names:
            as_the_pass_left_it()
            qp._PER_CLASS_READ = side != "per_job"
            qp._IN_CLASSES = side == "in_classes"
            gc.collect()
            w, c = time.perf_counter(), time.process_time()
            published = qp.queue_plan_publish(snapshot=snapshot, plan=plan, admitted=(),
                                              unprovisioned=())
            sides[side].append((time.perf_counter() - w, time.process_time() - c))
            columns[side] = {f.name: getattr(published, f.name) for f in fields(published)
                             if f.name not in ("generation", "made_at")}
            written = len(pickle.dumps(published, protocol=pickle.HIGHEST_PROTOCOL))
            del published
        assert all(columns[side] == columns[names[0]] for side in names)
        with open("/proc/loadavg") as f:
            note(f"load {f.read().strip()}")
    qp._PER_CLASS_READ = qp._IN_CLASSES = True
    for side, rows in sides.items():
        bench(f"plan_publish_read_{n}_{side}_p50", statistics.median(r[0] for r in rows), "s")
        bench(f"plan_publish_read_{n}_{side}_cpu_p50",
              statistics.median(r[1] for r in rows), "s")
    bench(f"plan_publish_bytes_{n}", written, "bytes")
    # The process's peak against its size before the first publish: what the publish
    # adds at most (alone in its process: `--sides NAME --rounds 1`).
    bench(f"plan_publish_peak_rss_added_{n}_{'_'.join(names)}", _peak_rss_mb() - rss_before,
          "MB")


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def profile(qp: Any, snapshot: Any, plan: Any, n: int) -> None:
    """One publish taken apart, then the same under cProfile."""
    import cProfile
    import pstats

    from django.core.cache import cache

    waits = plan.waits
    kept_waits = (waits._raw, waits.bulk, waits.bulk_held, waits.segments)

    def put_back() -> None:
        waits._raw, waits.bulk, waits.bulk_held, waits.segments = kept_waits

    put_back()
    c = time.process_time()
    for _ in qp._in_order_per_class(snapshot, plan):
        pass
    bench(f"plan_publish_parts_{n}_read_cpu", time.process_time() - c, "s")
    put_back()
    c = time.process_time()
    published = qp.published_plan_of(snapshot, plan)
    bench(f"plan_publish_parts_{n}_read_and_columns_cpu", time.process_time() - c, "s")
    c = time.process_time()
    raw = pickle.dumps(published, protocol=pickle.HIGHEST_PROTOCOL)
    bench(f"plan_publish_parts_{n}_pickle_cpu", time.process_time() - c, "s")
    bench(f"plan_publish_parts_{n}_bytes", len(raw), "bytes")
    c = time.process_time()
    cache.set("fairq:bench:profile", published, timeout=60)
    bench(f"plan_publish_parts_{n}_cache_set_cpu", time.process_time() - c, "s")
    cache.delete("fairq:bench:profile")
    put_back()
    prof = cProfile.Profile()
    prof.enable()
    qp.queue_plan_publish(snapshot=snapshot, plan=plan, admitted=(), unprovisioned=())
    prof.disable()
    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
