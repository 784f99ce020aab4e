"""Two of a submit's statements folded into others, each before and after,
alternated in one process on PostgreSQL:

  * the write: before, `check_submit` (one SELECT) then the job-and-event INSERT; after,
    the INSERT alone, its WHERE holding the same two conditions
    (`services/jobs.py::job_submit_with_event`);
  * rule B3's budget: before, the team lookup then `budget_downgrade_tier`'s own query
    ("has the team a downgrade budget?"); after, the lookup reading it with the team
    (`selectors/lookups.py::team_for_submitter`).

Database: $FAIRQ_BENCH_GUARD_DATABASE_URL, default .../fairq_bench_guard, dropped and
created afresh. Output: BENCH submit_{write,budget}_{before,after}_ms (the median of
`--rounds` rounds of `--calls` calls, per call), ..._cpu_ms (this process's CPU and its
PostgreSQL backend's, per call) and submit_{write,budget}_speedup (wall).
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
    from queueing.selectors.budgets import budget_downgrade_tier
    from queueing.selectors.lookups import team_for_submitter
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

    def budget_before() -> None:
        row = team_for_submitter(user=user, slug="vision")
        del row.has_downgrade_budget  # type: ignore[union-attr]
        budget_downgrade_tier(team=row, tier=tier, now=timezone.now())  # type: ignore[arg-type]

    def budget_after() -> None:
        row = team_for_submitter(user=user, slug="vision")
        budget_downgrade_tier(team=row, tier=tier, now=timezone.now())  # type: ignore[arg-type]

    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        backend = Path(f"/proc/{cur.fetchone()[0]}/stat")
    tick = os.sysconf("SC_CLK_TCK")

    def cpu() -> float:  # this process and its PostgreSQL backend (same host)
        fields = backend.read_text().rsplit(")", 1)[1].split()
        return time.process_time() + (int(fields[11]) + int(fields[12])) / tick

    for what, sides in (("write", {"before": before, "after": after}),
                        ("budget", {"before": budget_before, "after": budget_after})):
        times: dict[str, list[float]] = {"before": [], "after": []}
        cpus: dict[str, float] = {"before": 0.0, "after": 0.0}
        for fn in sides.values():
            fn()
        for r in range(a.rounds):
            for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
                c0, t0 = cpu(), time.perf_counter()
                for _ in range(a.calls):
                    sides[name]()
                times[name].append((time.perf_counter() - t0) / a.calls * 1000)
                cpus[name] += cpu() - c0
        for name in sides:
            bench(f"submit_{what}_{name}_ms", statistics.median(times[name]), "ms")
            bench(f"submit_{what}_{name}_cpu_ms", cpus[name] * 1000 / (a.rounds * a.calls),
                  "ms")
        bench(f"submit_{what}_speedup",
              statistics.median(times["before"]) / statistics.median(times["after"]), "x")
    bench("host_load_average_1m", os.getloadavg()[0], "")
    drop_postgres(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
