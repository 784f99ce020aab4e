"""Reports page benchmark (docs/dashboard.md, "Reports"; rules C1-C3).

Question: how long does GET /reports/ take with a year of history for 100 teams? Goal:
under 150 ms.

How it works
  * Django with `config.settings.test` on a throw-away PostgreSQL database
    ($DATABASE_URL's server, database `<name>_bench_reports`, dropped at the end), or a
    fresh SQLite file when PostgreSQL is not reachable (figures then not comparable).
  * 100 teams in 10 departments, 2 GPU types with 3 prices each over the year, 4
    charged attempts per team and day for 365 days (146,000 usage records, 1-8 GPUs,
    1-30 hours, so many cross midnights), 500 jobs running now with utilization.
  * `roll_up_year`: `usage_days_roll_up` over the whole year (once; the beat task then
    only adds the last 10 minutes' records).
  * `reports_page_month_p50` / `_max`: GET /reports/ as staff (every team, 12 months by
    month: the roll-up's days, the records after it and the running jobs), rendered, 15
    requests after one warm-up.
  * `reports_page_day_p50`: the same by day (30 days).
  * `reports_page_member_p50`: a member of one team.
  * `reports_page_unrolled_p50`: by month with the last 2,000 records not rolled up yet
    (the live part computes them).

Output: `BENCH <name> <value> <unit>`. Run: `.venv/bin/python bench/bench_reports.py`.
"""

from __future__ import annotations

import os
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, drop_postgres, note, recreate_postgres, setup_django_sqlite  # noqa: E402

TEAMS = 100
DAYS = 365
PER_DAY = 4
RUNNING = 500
RUNS = 15


def seed(now: datetime) -> tuple[object, object]:
    from django.contrib.auth import get_user_model

    from accounts.models import Membership, Team
    from queueing.models import AttemptUtilization, GpuPrice, GpuType, Job, Tier, UsageRecord

    rng = random.Random(16)
    h100 = GpuType.objects.create(slug="h100", name="H100", billing_weight=2.0)
    a100 = GpuType.objects.create(slug="a100", name="A100")
    start_day = (now - timedelta(days=DAYS)).date()
    for gt, base in ((h100, 3.0), (a100, 1.5)):
        for k in range(3):
            GpuPrice.objects.create(gpu_type=gt, effective_from=start_day + timedelta(days=120 * k),
                                    price_per_gpu_hour=Decimal(str(base + 0.25 * k)))
    tier = Tier.objects.create(slug="normal", name="normal", rank=100,
                               priority_class_name="fairq-normal", priority_value=100)
    depts = [Team.objects.create(slug=f"dept-{d}", name=f"dept {d}") for d in range(10)]
    teams = [Team.objects.create(slug=f"team-{i:03d}", name=f"team {i}", parent=depts[i % 10])
             for i in range(TEAMS)]
    staff = get_user_model().objects.create_user("root", is_staff=True)
    member = get_user_model().objects.create_user("dave")
    Membership.objects.create(user=member, team=teams[7], role="member")
    records = []
    for team in teams:
        for d in range(DAYS):
            day0 = datetime.combine(start_day + timedelta(days=d), datetime.min.time(), tzinfo=UTC)
            for _ in range(PER_DAY):
                s = day0 + timedelta(minutes=rng.randrange(0, 1440))
                e = min(s + timedelta(hours=rng.uniform(1, 30)), now - timedelta(minutes=1))
                if e <= s:
                    continue
                gpus = rng.choice((1, 2, 4, 8))
                gt = h100 if rng.random() < 0.4 else a100
                records.append(UsageRecord(team=team, gpu_type=gt, gpus=gpus,
                                           billing_weight=gt.billing_weight, start=s, end=e,
                                           gpu_seconds=gpus * (e - s).total_seconds(),
                                           source="import"))
    UsageRecord.objects.bulk_create(records, batch_size=10_000)
    jobs = [Job(team=teams[i % TEAMS], name=f"run-{i}", image="x", gpu_type=a100,
                gpus_per_replica=2, tier=tier, status="RUNNING", created_at=now,
                started_at=now - timedelta(hours=rng.uniform(1, 72))) for i in range(RUNNING)]
    Job.objects.bulk_create(jobs, batch_size=5000)
    AttemptUtilization.objects.bulk_create([
        AttemptUtilization(job=j, attempt=1, first_at=j.started_at, last_at=now, samples=60,
                           sm_sum=60 * 40.0, sm_mean=40.0, sm_hist={"2": 20, "60": 40})
        for j in Job.objects.all()], batch_size=5000)
    note(f"seeded {len(records)} usage records, {RUNNING} running jobs, {TEAMS} teams")
    return staff, member


def timed_get(client: object, path: str) -> float:
    t = time.perf_counter()
    r = client.get(path)  # type: ignore[attr-defined]
    elapsed = time.perf_counter() - t
    assert r.status_code == 200, r.status_code
    return elapsed


def series(client: object, path: str) -> list[float]:
    timed_get(client, path)  # warm-up
    return [timed_get(client, path) for _ in range(RUNS)]


def main() -> None:
    url = os.environ.get("DATABASE_URL", "")
    bench_url = ""
    if url.startswith("postgres"):
        u = urlparse(url)
        bench_url = u._replace(path=f"{u.path.rstrip('/')}_bench_reports").geturl()
        if recreate_postgres(bench_url):
            os.environ["DATABASE_URL"] = bench_url
        else:
            bench_url = ""
            os.environ.pop("DATABASE_URL")
    setup_django_sqlite("fairq_bench_reports")
    from django.conf import settings
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from queueing.models import UsageRecord, UsageRollup
    from queueing.services.reports import usage_days_roll_up

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]  # the test Client's
    note(f"database: {connection.vendor}; the machine may be shared with other work")
    now = timezone.now()
    staff, member = seed(now)
    t = time.perf_counter()
    while usage_days_roll_up(now=now):
        pass
    bench("roll_up_year", time.perf_counter() - t, "s")
    with connection.cursor() as cur:
        cur.execute("ANALYZE") if connection.vendor == "postgresql" else None
    c = Client()
    c.force_login(staff)
    month = series(c, "/reports/")
    bench("reports_page_month_p50", statistics.median(month) * 1000, "ms")
    bench("reports_page_month_max", max(month) * 1000, "ms")
    day = series(c, "/reports/?period=day")
    bench("reports_page_day_p50", statistics.median(day) * 1000, "ms")
    m = Client()
    m.force_login(member)
    bench("reports_page_member_p50", statistics.median(series(m, "/reports/")) * 1000, "ms")
    # The last 2,000 records arrive after the roll-up: the live part adds them.
    last = UsageRecord.objects.order_by("-pk").values_list("pk", flat=True)[1999]
    UsageRollup.objects.filter(pk=1).update(last_record_id=last - 1)
    bench("reports_page_unrolled_p50", statistics.median(series(c, "/reports/")) * 1000, "ms")
    if bench_url:
        drop_postgres(bench_url)


if __name__ == "__main__":
    main()
