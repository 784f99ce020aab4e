"""A submit's write with its membership and tier checks (issue 20), before and after they
rode on the INSERT, alternated in one process on PostgreSQL:

  * before: `check_submit` (one SELECT) then the job-and-event INSERT;
  * after: the INSERT alone, its WHERE holding the same two conditions
    (`services/jobs.py::job_submit_with_event`).

Database: $FAIRQ_BENCH_GUARD_DATABASE_URL, default .../fairq_bench_guard, dropped and
created afresh. Output: BENCH submit_write_{before,after}_ms (the median of `--rounds`
rounds of `--calls` submits, per submit) and submit_write_speedup.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, drop_postgres, note, recreate_postgres  # noqa: E402
from bench_api import setup_django  # noqa: E402

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/fairq_bench_guard"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--rounds", type=int, default=6)
    a = p.parse_args()
    url = os.environ.get("FAIRQ_BENCH_GUARD_DATABASE_URL", DEFAULT_PG)
    if not recreate_postgres(url):
        note("skipping: this bench measures PostgreSQL round trips")
        return 0
    setup_django(url, 1)
    from django.contrib.auth import get_user_model
    from django.utils import timezone

    from accounts.models import Team
    from queueing.models import GpuType, Job, JobEvent, Tier
    from queueing.services import jobs
    from queueing.services.access import check_submit, submit_allowed_sql

    user = get_user_model().objects.get(username="bench")
    team, tier = Team.objects.get(slug="vision"), Tier.objects.get(slug="normal")
    data = jobs.JobInput(team=team, name="bench", image="ghcr.io/acme/train:1.4",
                         command=["python"], args=[], env={"SEED": "1"},
                         gpu_type=GpuType.objects.get(slug="h100"), gpus_per_replica=1,
                         replicas=1, tier=tier, max_runtime_seconds=3600)

    def rows() -> tuple[Job, JobEvent]:
        now = timezone.now()
        job = Job(**data.job_values(), submitter=user, status="QUEUED", created_at=now,
                  updated_at=now)
        event = JobEvent(at=now, kind="transition", from_status="", to_status="QUEUED",
                         actor=user, actor_label=str(user), attempt=1, reason="submitted")
        return job, event

    def before() -> None:
        check_submit(actor=user, team=team, tier=tier)
        jobs._insert_job_with_event(*rows())

    def after() -> None:
        t, m, params = submit_allowed_sql(actor=user, team=team, tier=tier)
        assert jobs._insert_job_with_event(*rows(), where=(f"{t} AND {m}", params))

    sides = {"before": before, "after": after}
    times: dict[str, list[float]] = {"before": [], "after": []}
    for fn in sides.values():
        fn()
    for r in range(a.rounds):
        for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
            t0 = time.perf_counter()
            for _ in range(a.calls):
                sides[name]()
            times[name].append((time.perf_counter() - t0) / a.calls * 1000)
    for name in sides:
        bench(f"submit_write_{name}_ms", statistics.median(times[name]), "ms")
    bench("submit_write_speedup",
          statistics.median(times["before"]) / statistics.median(times["after"]), "x")
    bench("host_load_average_1m", os.getloadavg()[0], "")
    drop_postgres(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
