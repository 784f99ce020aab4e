"""Scheduler cycle benchmark (docs/scheduling.md, "The cycle").

Question: how long does one real `scheduler_cycle` take with 10,000 queued jobs of 50
teams on a 1,000-GPU simulated cluster (125 nodes × 8 h100)? Goal: under 1 s.

How it works
  * Django with `config.settings.test`, the simulated backend configured via settings
    (FAIRQ_SIM_NODES = 125x8xh100); database: $DATABASE_URL, or a fresh SQLite file in
    /tmp. The bench empties the job tables of that database.
  * 50 teams with a quota each (nominal 20, borrowing limit 40), 3 tiers, 10,000 queued
    jobs of 1-8 GPUs × 1-2 replicas submitted over the last day.
  * `cycle_10k_first`: the first cycle, which fills the cluster: reconcile (nothing yet),
    snapshot, decide (the pure plan over 10,000 jobs), apply (one compare-and-swap and
    one event per admitted job, one transaction), submit (to the simulated cluster).
  * `cycle_10k_steady`: the next cycle: reconcile of every running workload, then a
    full plan in which nothing fits (the common case of a busy cluster). p50 of 5.
  * Per step of the first cycle and the peak RSS of the process.

Output: `BENCH <name> <value> <unit>`. Run: `.venv/bin/python bench/bench_cycle.py`.
"""

from __future__ import annotations

import random
import resource
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note, setup_django_sqlite  # noqa: E402  (bench/ is sys.path[0])

TEAMS = 50
QUEUED = 10_000


def setup() -> None:
    setup_django_sqlite("fairq_bench_cycle")
    from django.conf import settings

    settings.FAIRQ_SIM_NODES = "125x8xh100"
    settings.FAIRQ_SIM_DEFAULT_SECONDS = 86400.0


def build_world(now: datetime) -> None:
    from accounts.models import Team
    from queueing.models import GpuType, Job, JobEvent, Quota, Tier

    JobEvent.objects.all().delete()
    Job.objects.all().delete()
    rnd = random.Random(1)
    h100 = GpuType.objects.get_or_create(slug="h100", defaults={"name": "H100"})[0]
    tiers = [Tier.objects.get_or_create(slug=s, defaults={
        "name": s, "rank": r, "priority_class_name": f"fq-{s}", "priority_value": r})[0]
        for s, r in (("low", 0), ("normal", 100), ("high", 200))]
    teams = [Team.objects.get_or_create(slug=f"team-{k}", defaults={
        "name": f"Team {k}", "weight": 1.0 + k % 3})[0] for k in range(TEAMS)]
    Quota.objects.all().delete()
    Quota.objects.bulk_create([Quota(team=t, gpu_type=h100, nominal=20, borrowing_limit=40)
                               for t in teams])
    Job.objects.bulk_create([
        Job(team=rnd.choice(teams), name=f"q{i}", image="x", gpu_type=h100,
            gpus_per_replica=rnd.choice((1, 1, 2, 4, 8)), replicas=rnd.choice((1, 1, 2)),
            tier=rnd.choice(tiers), status="QUEUED",
            created_at=now - timedelta(seconds=rnd.uniform(0, 86400)), updated_at=now)
        for i in range(QUEUED)
    ], batch_size=2000)


def main() -> None:
    setup()
    from django.db import connection

    from queueing.composition import reset_backends
    from queueing.services.scheduler import scheduler_cycle

    reset_backends()
    now = datetime.now(UTC)
    build_world(now)
    note(f"database: {connection.vendor}; {QUEUED} queued jobs of {TEAMS} teams; "
         "1,000 simulated h100 GPUs")
    t = time.perf_counter()
    r = scheduler_cycle(now=now)
    first = time.perf_counter() - t
    note(f"first cycle admitted {len(r.admitted)} jobs "
         f"({len(r.plan.waits) if r.plan else 0} waiting)")
    for step in ("reconcile", "snapshot", "decide", "apply", "submit"):
        bench(f"cycle_10k_first_{step}", r.timings[step] * 1000, "ms")
    bench("cycle_10k_first", first, "s")
    steady = []
    for k in range(1, 6):
        t = time.perf_counter()
        r = scheduler_cycle(now=now + timedelta(seconds=k))
        steady.append(time.perf_counter() - t)
        note(f"cycle {k + 1}: {len(r.started)} started, {len(r.admitted)} admitted, "
             f"{len(r.preempted)} preempted (rules R1/R2, rate-limited by R5)")
    bench("cycle_10k_steady_p50", statistics.median(steady), "s")
    bench("cycle_10k_peak_rss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
          "MB")


if __name__ == "__main__":
    main()
