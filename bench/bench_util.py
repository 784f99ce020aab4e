"""Utilization ingest benchmark (docs/scheduling.md, "Idle GPUs", rules U1-U5).

Question: how long does one cycle's utilization step take for 10,000 running jobs? Goal:
under 1 s per minute of readings.

How it works
  * Django with `config.settings.test`; database: $DATABASE_URL (PostgreSQL, what
    production runs; the bench empties the job tables of that database), or a fresh
    SQLite file in /tmp.
  * 50 teams, one tier (threshold 5%, window 3 minutes, action "flag"), 10,000 RUNNING
    jobs; a fifth of them idle (2% SM activity), the others busy.
  * `parse_10k`: Prometheus's answer for 10,000 pods (an SM and a memory series each)
    turned into readings (`readings_from_vector`, pure).
  * `ingest_10k_first`: the first minute: 10,000 summaries and samples created.
  * `ingest_10k_steady`: the next minutes: 10,000 summaries updated and samples added,
    p50 and max of 8 minutes; the max is the minute 2,000 idle jobs are flagged (rule U2,
    2,000 events).
  * `ingest_10k_same_minute`: the same minute again (a cycle every 3 s): nothing written.

Output: `BENCH <name> <value> <unit>`. Run: `.venv/bin/python bench/bench_util.py`.
"""

from __future__ import annotations

import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note, setup_django_sqlite  # noqa: E402  (bench/ is sys.path[0])

TEAMS = 50
RUNNING = 10_000
IDLE_EVERY = 5  # one job in five is idle


def setup() -> list[int]:
    from django.contrib.auth import get_user_model

    from accounts.models import Team
    from queueing.models import (
        AttemptUtilization,
        GpuType,
        Job,
        JobEvent,
        Tier,
        UsageRecord,
        UtilizationSample,
    )

    UtilizationSample.objects.all().delete()
    AttemptUtilization.objects.all().delete()
    JobEvent.objects.all().delete()
    UsageRecord.objects.all().delete()
    Job.objects.all().delete()
    get_user_model().objects.all().delete()
    h100, _ = GpuType.objects.get_or_create(slug="h100", defaults={"name": "H100"})
    tier, _ = Tier.objects.update_or_create(slug="normal", defaults={
        "name": "Normal", "rank": 100, "priority_class_name": "fairq-normal",
        "priority_value": 1000, "idle_threshold_percent": 5, "idle_window_minutes": 3,
        "idle_action": "flag", "idle_grace_minutes": 10})
    teams = [Team.objects.update_or_create(slug=f"team-{i:02d}",
                                           defaults={"name": f"Team {i}"})[0]
             for i in range(TEAMS)]
    now = datetime.now(UTC)
    jobs = [Job(team=teams[i % TEAMS], name=f"job-{i}", image="ghcr.io/acme/train:1",
                gpu_type=h100, gpus_per_replica=1 + i % 8, replicas=1, tier=tier,
                status="RUNNING", created_at=now, started_at=now, admitted_at=now)
            for i in range(RUNNING)]
    Job.objects.bulk_create(jobs, batch_size=2000)
    return list(Job.objects.order_by("pk").values_list("pk", flat=True))


def answer(ids: list[int]) -> list[dict[str, object]]:
    """Prometheus's `data.result` for the utilization query: per pod an SM and an FB series."""
    out: list[dict[str, object]] = []
    for i, pk in enumerate(ids):
        pod = f"fq-{pk}-1-abcde"
        sm = 2.0 if i % IDLE_EVERY == 0 else 60.0 + i % 40
        out.append({"metric": {"namespace": "fairq-team", "pod": pod, "fairq": "sm"},
                    "value": [0, str(sm)]})
        out.append({"metric": {"namespace": "fairq-team", "pod": pod, "fairq": "fb"},
                    "value": [0, str(1000 + i % 70_000)]})
    return out


def main() -> None:
    setup_django_sqlite("fairq_bench_util")
    from django.db import connection

    from queueing.backends.prometheus import readings_from_vector
    from queueing.models import AttemptUtilization, JobEvent
    from queueing.services.utilization import utilization_ingest

    note(f"database: {connection.vendor}")
    ids = setup()
    result = answer(ids)
    t = time.perf_counter()
    readings = readings_from_vector(result)
    bench("parse_10k", time.perf_counter() - t, "s")
    assert len(readings) == RUNNING

    t0 = datetime.now(UTC).replace(second=0, microsecond=0)
    t = time.perf_counter()
    first = utilization_ingest(readings=readings, now=t0)
    bench("ingest_10k_first", time.perf_counter() - t, "s")
    assert first.sampled == RUNNING, first.sampled

    steady = []
    flagged = 0
    for minute in range(1, 9):
        t = time.perf_counter()
        r = utilization_ingest(readings=readings, now=t0 + timedelta(minutes=minute))
        steady.append(time.perf_counter() - t)
        assert r.sampled == RUNNING
        flagged += len(r.flagged)
    bench("ingest_10k_steady_p50", statistics.median(steady), "s")
    bench("ingest_10k_steady_max", max(steady), "s")
    assert flagged == RUNNING // IDLE_EVERY, flagged
    assert JobEvent.objects.filter(kind="idle").count() == flagged
    note(f"flagged {flagged} idle jobs (rule U2) in one of those minutes")

    t = time.perf_counter()
    again = utilization_ingest(readings=readings, now=t0 + timedelta(minutes=8, seconds=30))
    bench("ingest_10k_same_minute", time.perf_counter() - t, "s")
    assert again.sampled == 0
    row = AttemptUtilization.objects.get(job_id=ids[1], attempt=1)
    note(f"a busy job after 9 minutes: {row.samples} samples, mean {row.sm_mean:.1f}%, "
         f"p95 {row.sm_p95:.0f}%")


if __name__ == "__main__":
    main()
