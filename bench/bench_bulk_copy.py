"""A 10,000-task array on PostgreSQL stored compactly (docs/scheduling.md,
"Arrays"), against every member written as a row at submit, in one process:

  * submit: `jobs_submit_array` writing the whole array (window = count: what every
    submit did before compact storage, and still `jobs_submit_bulk`'s path) against its
    default (the JobArray and ARRAY_SUBMIT_WINDOW rows), alternated, committed; and the
    default's cost for submit windows of 1, 8, 32, 64 and 256 rows (how W was chosen);
  * top-up: the cycle's `arrays_top_up` writing one window of 64 and of 400 members;
  * the cycle: `scheduler_cycle` (simulated cluster of 16 H100s) with 100,000 queued
    tasks in 10 arrays of 10,000, stored compactly against written whole (the plan of
    100,000 queued must not get slower).

Database: $FAIRQ_BENCH_BULK_DATABASE_URL, default .../fairq_bench_bulk, dropped and
created afresh. Output: BENCH bulk_copy_{whole,compact}_s (wall, median of `--rounds`),
bulk_copy_{whole,compact}_cpu_s, bulk_copy_compact_speedup, array_submit_w<W>_ms,
array_top_up_<N>_ms, cycle_100k_{whole,compact}_{total,snapshot,decide}_ms and
array_top_up_idle_ms (a cycle's top-up when no array has members left to write).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, drop_postgres, note, recreate_postgres  # noqa: E402
from bench_api import setup_django  # noqa: E402

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/fairq_bench_bulk"
COUNT = 10_000


def _median_ms(fn: Callable[[], object], runs: int) -> float:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out) * 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--arrays", type=int, default=10, help="arrays of 10,000 for the cycle")
    p.add_argument("--cycles", type=int, default=3)
    a = p.parse_args()
    url = os.environ.get("FAIRQ_BENCH_BULK_DATABASE_URL", DEFAULT_PG)
    if not recreate_postgres(url):
        note("skipping: this bench measures PostgreSQL's COPY")
        return 0
    setup_django(url, 1)
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.utils import timezone

    from accounts.models import Team
    from queueing.models import GpuType, JobArray, Quota, Tier
    from queueing.services import arrays, jobs
    from queueing.services.scheduler import scheduler_cycle

    user = get_user_model().objects.get(username="bench")
    data = jobs.JobInput(team=Team.objects.get(slug="vision"), name="arr",
                         image="ghcr.io/acme/train:1.4", command=["python", "train.py"],
                         args=["--epochs", "1"], env={"SEED": "1"},
                         gpu_type=GpuType.objects.get(slug="h100"), gpus_per_replica=1,
                         replicas=1, tier=Tier.objects.get(slug="normal"),
                         max_runtime_seconds=3600)

    def whole() -> None:
        jobs.jobs_submit_array(actor=user, data=data, count=COUNT, window=COUNT)

    def compact() -> None:
        jobs.jobs_submit_array(actor=user, data=data, count=COUNT)

    sides = {"whole": whole, "compact": compact}
    wall: dict[str, list[float]] = {"whole": [], "compact": []}
    cpu: dict[str, list[float]] = {"whole": [], "compact": []}
    for fn in sides.values():
        fn()
    for r in range(a.rounds):
        for name in (("whole", "compact") if r % 2 == 0 else ("compact", "whole")):
            c0, t0 = time.process_time(), time.perf_counter()
            sides[name]()
            wall[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
    for name in sides:
        bench(f"bulk_copy_{name}_s", statistics.median(wall[name]), "s")
        bench(f"bulk_copy_{name}_cpu_s", statistics.median(cpu[name]), "s")
    bench("bulk_copy_compact_speedup",
          statistics.median(wall["whole"]) / statistics.median(wall["compact"]), "x")

    # How the submit's window costs: the request answers after this many rows.
    for w in (1, 8, 32, 64, 256):
        def submit(w: int = w) -> object:
            return jobs.jobs_submit_array(actor=user, data=data, count=COUNT, window=w)

        bench(f"array_submit_w{w}_ms", _median_ms(submit, a.rounds), "ms")
    # The cycle's top-up of one array by a window (no cluster view published here: the
    # window is ARRAY_WINDOW, set to each size in turn).
    JobArray.objects.update(materialized=COUNT)  # only the arrays made below count
    for size in (64, 400):
        arrays.ARRAY_WINDOW = size  # the bench's knob
        took: list[float] = []
        for _ in range(a.rounds):
            jobs.jobs_submit_array(actor=user, data=data, count=COUNT)  # its window queued
            t0 = time.perf_counter()
            written = arrays.arrays_top_up(now=timezone.now())
            took.append(time.perf_counter() - t0)
            assert sum(len(ids) for ids in written.values()) == size - jobs.ARRAY_SUBMIT_WINDOW, written
            JobArray.objects.update(materialized=COUNT)  # out of the next round's way
        bench(f"array_top_up_{size}_ms", statistics.median(took) * 1000, "ms")
    arrays.ARRAY_WINDOW = 64

    # The cycle with 100,000 queued tasks: compactly stored, then written whole.
    with connection.cursor() as cur:  # start empty: the submits above queued rows
        cur.execute("UPDATE queueing_job SET status = 'CANCELLED' WHERE status = 'QUEUED'")
    Quota.objects.update(nominal=16)
    for name, window in (("compact", jobs.ARRAY_SUBMIT_WINDOW), ("whole", COUNT)):
        made = [jobs.jobs_submit_array(actor=user, data=data, count=COUNT, window=window)[0]
                for _ in range(a.arrays)]
        scheduler_cycle()  # the first reads every active job (a worker's start)
        runs = [scheduler_cycle().timings for _ in range(a.cycles)]
        for key in ("total", "snapshot", "decide"):
            bench(f"cycle_100k_{name}_{key}_ms",
                  statistics.median(t[key] for t in runs) * 1000, "ms")
        for array in made:
            arrays.array_cancel(actor=None, array=array)
    # What every cycle pays when no array has members left to write (one indexed read):
    # the cost the top-up adds to a plan of queued jobs that are not arrays.
    bench("array_top_up_idle_ms",
          _median_ms(lambda: arrays.arrays_top_up(now=timezone.now()), 20), "ms")
    bench("host_load_average_1m", os.getloadavg()[0], "")
    connection.close()
    drop_postgres(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
