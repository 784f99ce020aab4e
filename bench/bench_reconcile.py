"""Step 1 of the cycle with many workloads changing at once (docs/performance.md, "A
fleet of 5,000 nodes: admissions per second"): how long reconcile takes to record N jobs
starting, then the same N ending (each a status change, an event, and at the end a usage
record and the fair-share charge), along these paths, alternated in one run:

  1            each change its own transaction (`scheduler.STATUS_CHUNK = 1`, per job)
  100          the changes of a chunk in one transaction of savepoints, written one job
               at a time (`STATUS_CHUNK = 100`, `scheduler._BATCHED_STATUSES = False`)
  batched      a chunk's starts in one statement, its ends in one statement with one
               insert of their usage records and one update of the accumulators
               (`_BATCHED_STATUSES = True`, `STATUS_BATCH_CHUNK = 100`; PostgreSQL)
  batched1000  the same, `STATUS_BATCH_CHUNK = 1000` (the default)

The webhooks' messages are not sent (as in bench_throughput.py: the test settings would
run their task in this process, and chunk 1 would pay it per job).

  BENCH reconcile_<n>_start_<path>_ms_per_job   ADMITTED -> RUNNING, best of rounds
  BENCH reconcile_<n>_end_<path>_ms_per_job     RUNNING -> SUCCEEDED, best of rounds
  BENCH reconcile_<n>_<step>_speedup            chunk 1 over chunk 100
  BENCH reconcile_<n>_<step>_<batched>_speedup  chunk 100 over a batched path

Database: $DATABASE_URL (PostgreSQL for the figures; its job tables are emptied), else a
fresh SQLite file in /tmp (where the chunk is always 1 and nothing is batched). Run:
  .venv/bin/python bench/bench_reconcile.py --jobs 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note, setup_django_sqlite  # noqa: E402
from bench_admission import calibrate  # noqa: E402

# path -> (`STATUS_CHUNK`, `_BATCHED_STATUSES`, `STATUS_BATCH_CHUNK`)
PATHS = {"1": (1, False, 1), "100": (100, False, 100), "batched": (100, True, 100),
         "batched1000": (100, True, 1000)}


def one_round(n: int, path: str) -> tuple[float, float]:
    """N admitted jobs submitted to a fresh simulated cluster; seconds of the reconcile
    that starts them and of the one that ends them."""
    from django.utils import timezone

    from accounts.models import Team
    from queueing.backends.simulated import SimulatedCluster
    from queueing.models import GpuType, Job, JobEvent, Tier, UsageRecord
    from queueing.services import scheduler

    scheduler.STATUS_CHUNK, scheduler._BATCHED_STATUSES, scheduler.STATUS_BATCH_CHUNK = \
        PATHS[path]
    JobEvent.objects.all().delete()
    UsageRecord.objects.all().delete()
    Job.objects.all().delete()
    h100 = GpuType.objects.get_or_create(slug="h100", defaults={"name": "H100"})[0]
    tier = Tier.objects.update_or_create(slug="normal", defaults={
        "name": "normal", "rank": 100, "priority_class_name": "fq-normal",
        "priority_value": 100, "open_to_all_teams": True})[0]
    teams = [Team.objects.get_or_create(slug=f"team-{k}", defaults={"name": f"team-{k}"})[0]
             for k in range(20)]
    nodes = (n + 7) // 8
    cluster = SimulatedCluster.from_spec(f"{nodes}x8xh100")
    t0 = timezone.now()
    jobs = Job.objects.bulk_create([
        Job(team=teams[i % len(teams)], name=f"j{i}", image="x", gpu_type=h100,
            gpus_per_replica=1, replicas=1, tier=tier, status="ADMITTED", created_at=t0,
            updated_at=t0, admitted_at=t0, submitted_to_backend_at=t0,
            placement=[f"sim-{i // 8}"], env={"FAIRQ_SIM_SECONDS": "60"})
        for i in range(n)], batch_size=5000)
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]).select_related(
            "team", "tier", "gpu_type"):
        cluster.submit(scheduler.launch_spec(job), now=t0)
    took = []
    for at in (t0 + timedelta(seconds=5), t0 + timedelta(seconds=120)):
        result = scheduler.CycleResult()
        t = time.perf_counter()
        scheduler.reconcile(backend=cluster, now=at, result=result)
        took.append(time.perf_counter() - t)
    assert Job.objects.filter(status="SUCCEEDED").count() == n, "not every job ended"
    return took[0], took[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--paths", nargs="+", choices=sorted(PATHS), default=list(PATHS))
    args = ap.parse_args()
    setup_django_sqlite("bench_reconcile")
    from django.conf import settings

    settings.FAIRQ_CYCLE_BUDGET_SECONDS = 45.0  # no deferral: every change is handled
    # The webhooks' one message per committed transaction is not sent: the test
    # settings would run its task here, in the cycle's process (production sends it to
    # the worker's queue), and chunk 1 would pay it per job.
    from queueing.services import webhooks

    webhooks.webhooks_dispatch_soon = lambda event_ids: None
    calibrate()
    note(f"load average {os.getloadavg()[0]:.1f}")
    best: dict[tuple[str, str], float] = {}
    for _ in range(args.rounds):
        for path in args.paths:
            start, end = one_round(args.jobs, path)
            for step, took in (("start", start), ("end", end)):
                key = (step, path)
                best[key] = min(best.get(key, took), took)
            note(f"{path}: start {start:.2f} s, end {end:.2f} s, "
                 f"load average {os.getloadavg()[0]:.1f}")
    n = args.jobs
    for (step, path), took in sorted(best.items()):
        bench(f"reconcile_{n}_{step}_{path}_ms_per_job", took / n * 1000, "ms")
    for step in ("start", "end"):
        if (step, "1") in best and (step, "100") in best:
            bench(f"reconcile_{n}_{step}_speedup", best[(step, "1")] / best[(step, "100")],
                  "x")
        for path in ("batched", "batched1000"):
            if (step, "100") in best and (step, path) in best:
                bench(f"reconcile_{n}_{step}_{path}_speedup",
                      best[(step, "100")] / best[(step, path)], "x")
    note(f"load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
