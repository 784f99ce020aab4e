"""The scheduler cycle over several clusters (docs/clusters.md): what reading, planning and
submitting to 5 clusters costs against the same GPUs as one cluster.

Question: with 10,000 queued jobs of 50 teams and 1,000 simulated h100 GPUs, how long
does a real `scheduler_cycle` take when the GPUs are one implicit cluster (125 nodes,
FAIRQ_SIM_NODES) and when they are 5 `Cluster` rows of 25 nodes each (cost ranks 0-40),
and when one of the 5 does not answer (rule K5)? Goal: the fleet adds little to the
single cluster's cycle (both well under 1 s).

How it works: Django with `config.settings.test` on a fresh SQLite file in /tmp (or
$DATABASE_URL, whose job tables it empties); the world of bench/bench_cycle.py (50
teams with quota nominal 20, borrowing limit 40, three tiers; jobs of 1-8 GPUs × 1-2
replicas). Per layout: `_first` is the first cycle (fills the cluster: reconcile,
snapshot, plan, apply, submit), `_steady_p50` the median of the next 5 (reconcile of
every running workload, a full plan in which nothing fits).

Output: `BENCH <name> <value> <unit>`. Run: `.venv/bin/python bench/bench_cycle_clusters.py`.
"""

from __future__ import annotations

import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note, setup_django_sqlite  # noqa: E402  (bench/ is sys.path[0])
from bench_cycle import build_world, use_cluster  # noqa: E402

CLUSTERS = 5


class Down:
    """A cluster whose API server does not answer (rule K5)."""

    in_process = True
    provisions = False

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise ConnectionError("connection refused")

    nodes = statuses = submit = stop = logs = _fail


def run(label: str, *, backends: dict[str, Any] | None = None) -> None:
    from queueing.services.scheduler import scheduler_cycle

    now = datetime.now(UTC)
    build_world(now, teams=50, queued=10_000, nominal=20, borrowing=40,
                sizes=(1, 1, 2, 4, 8), replicas=(1, 1, 2))
    t = time.perf_counter()
    r = scheduler_cycle(now=now, backends=backends)
    bench(f"cycle_clusters_{label}_first", time.perf_counter() - t, "s")
    note(f"{label}: first cycle admitted {len(r.admitted)} jobs; unreachable "
         f"{r.unreachable or 'none'}")
    steady = []
    steps: dict[str, list[float]] = {}
    for k in range(1, 6):
        t = time.perf_counter()
        r = scheduler_cycle(now=now + timedelta(seconds=k), backends=backends)
        steady.append(time.perf_counter() - t)
        for step, seconds in r.timings.items():
            steps.setdefault(step, []).append(seconds)
    bench(f"cycle_clusters_{label}_steady_p50", statistics.median(steady), "s")
    note(f"{label}: steady p50 per step: " + ", ".join(
        f"{step} {statistics.median(v) * 1000:.0f} ms" for step, v in steps.items()))


def main() -> int:
    setup_django_sqlite("fairq_bench_cycle_clusters")
    from django.conf import settings

    from queueing.composition import reset_backends
    from queueing.models import Cluster, Job

    settings.FAIRQ_SIM_DEFAULT_SECONDS = 86400.0
    Job.objects.all().delete()
    Cluster.objects.all().delete()
    use_cluster("125x8xh100")
    run("one")
    reset_backends()
    for k in range(CLUSTERS):
        Cluster.objects.create(name=f"c{k}", backend="simulated", sim_nodes="25x8xh100",
                               cost_rank=10 * k)
    run("five")
    reset_backends()
    run("five_one_down", backends={"c0": Down()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
