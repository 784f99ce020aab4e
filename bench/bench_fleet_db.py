"""A fleet of 5,000 nodes: the snapshot build from PostgreSQL (docs/performance.md,
"A fleet of 5,000 nodes: the baseline"), beside bench_fleet.py's pure pass.

`queueing/selectors/snapshot.py::build_snapshot` over bench_fleet.py's world written as
rows: the 1,110 teams of the tree (parents) with their quota rows, the 13,676 running
jobs of the whole types (placed on a simulated cluster of the 5,000 nodes) and N queued
jobs. Approximation: the time-sliced type is not configured here, so its 136,324
running fractions are left out and its queued jobs ask whole `l40s` GPUs instead.
  BENCH fleet_db_<n>_insert       seconds to write the queued rows (bulk_create)
  BENCH fleet_db_<n>_build_p50    seconds per build_snapshot (3 builds)
  BENCH fleet_db_<n>_rss          process peak RSS (MB) after the builds (an upper bound:
                                 the process also held the rows it wrote)
Database: $DATABASE_URL (PostgreSQL for the figures), its job tables emptied first; without
it a fresh SQLite file in /tmp.
Run: `.venv/bin/python bench/bench_fleet_db.py --sizes 100000 250000`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note, setup_django_sqlite  # noqa: E402  (bench/ is sys.path[0])
from bench_admission import NOW, rss_mb  # noqa: E402
from bench_fleet import CAPACITY, NODES_PER_TYPE, SLICED, WHOLE, snapshot  # noqa: E402


def setup() -> None:
    # $DATABASE_URL, or a fresh SQLite file in /tmp: never the demo's database.
    setup_django_sqlite("bench_fleet_db")
    from django.conf import settings

    settings.FAIRQ_SIM_NODES = ",".join(f"{NODES_PER_TYPE}x8x{t}" for t in WHOLE)
    settings.FAIRQ_SIM_DEFAULT_SECONDS = 10 * 86400


def world(n: int) -> None:
    """The rows of bench_fleet's world with `n` queued (see the module's approximation)."""
    from accounts.models import Team
    from queueing.composition import get_backend, reset_backends
    from queueing.models import GpuType, Job, JobEvent, Quota, Tier
    from queueing.services.scheduler import launch_spec

    snap = snapshot(n)
    JobEvent.objects.all().delete()
    Job.objects.all().delete()
    Quota.objects.all().delete()
    gpu = {t: GpuType.objects.get_or_create(slug=t, defaults={"name": t})[0] for t in WHOLE}
    tiers = {r: Tier.objects.update_or_create(slug=f"t{r}", defaults={
        "name": f"t{r}", "rank": r, "priority_class_name": f"fq-t{r}", "priority_value": r,
        "open_to_all_teams": True})[0] for r in (0, 100, 200)}
    teams: dict[str, Team] = {}
    for slug, parent in snap.team_parent.items():  # parents come before their children
        teams[slug] = Team.objects.update_or_create(slug=slug, defaults={
            "name": slug, "parent": teams[parent] if parent else None})[0]
    Quota.objects.bulk_create([
        Quota(team=teams[k], gpu_type=gpu[t], nominal=q.nominal,
              borrowing_limit=q.borrowing_limit, lending_limit=q.lending_limit)
        for (k, t), q in snap.quotas.items() if t in gpu and t != SLICED])
    reset_backends()
    backend = get_backend()
    at = NOW - timedelta(hours=1)
    running = Job.objects.bulk_create([
        Job(team=teams[r.team], name=f"r{r.id}", image="x", gpu_type=gpu[r.gpu_type],
            gpus_per_replica=r.gpus_per_replica, replicas=1, tier=tiers[r.tier_rank],
            status="RUNNING", created_at=at, admitted_at=at, started_at=at,
            submitted_to_backend_at=at, placement=[f"sim-{r.nodes[0]}"])
        for r in snap.running if r.gpu_type != SLICED], batch_size=5000)
    for job in Job.objects.filter(pk__in=[j.pk for j in running]).select_related(
            "team", "tier", "gpu_type").iterator(chunk_size=5000):
        backend.submit(launch_spec(job), now=at)
    t = time.perf_counter()
    Job.objects.bulk_create([
        Job(team=teams[q.team], name=f"q{q.id}", image="x",
            gpu_type=gpu["l40s" if q.gpu_type == SLICED else q.gpu_type],
            gpus_per_replica=min(8, q.gpus_per_replica), replicas=q.replicas,
            tier=tiers[q.tier_rank], status="QUEUED", created_at=q.submitted_at,
            updated_at=NOW) for q in snap.queued], batch_size=5000)
    bench(f"fleet_db_{n // 1000}k_insert", time.perf_counter() - t, "s")
    note(f"{n} queued: {len(running)} running, {len(teams)} teams, capacity {CAPACITY}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[100_000, 250_000])
    args = ap.parse_args()
    setup()
    from queueing.composition import get_backend
    from queueing.selectors.snapshot import build_snapshot

    for n in args.sizes:
        world(n)
        times = []
        for _ in range(3):
            t = time.perf_counter()
            snap = build_snapshot(backend=get_backend(), now=NOW)
            times.append(time.perf_counter() - t)
        note(f"{n} queued: built {len(snap.queued)} queued, {len(snap.running)} running, "
             f"{len(snap.nodes)} nodes; builds {', '.join(f'{x:.2f}' for x in times)} s")
        bench(f"fleet_db_{n // 1000}k_build_p50", statistics.median(times), "s")
        bench(f"fleet_db_{n // 1000}k_rss", rss_mb(), "MB")


if __name__ == "__main__":
    main()
