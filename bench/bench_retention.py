"""History retention benchmark (docs/deployment.md, "History retention";
services/history.py).

Question: how fast does `history_prune` archive and delete a fleet's history, and what
does the archive cost beside a plain delete? Goal: a day of a 5,000-node fleet's history
(about a million job events) in well under the hourly task's hour.

How it works
  * Django with `config.settings.test` on a throw-away PostgreSQL database
    ($DATABASE_URL's server, database `<name>_bench_retention`, dropped at the end), the
    archive in a temporary directory (the file storage; S3 adds its upload time).
  * `--jobs` finished jobs (default 100,000) over 200 days, each with `--events` events
    (default 10: 1,000,000 events), one usage record and 3 utilization samples, written
    by INSERT ... SELECT; 20 teams; the roll-up marked as holding every record.
  * One run with FAIRQ_JOB_RETENTION_DAYS=90, FAIRQ_USAGE_RETENTION_DAYS=100,
    FAIRQ_UTIL_RETENTION_DAYS=30: `prune_total_rows_per_s` (every row deleted, jobs
    and theirs, records and samples, over the run's time), `prune_events` (events
    deleted), `prune_seconds`, `archive_bytes`.
  * `raw_usage_before_ms` / `raw_usage_after_ms`: `raw_decayed_usage` (what
    `fairshare_recompute` reads) before and after the prune, median of 5.
  * Jobs deleted alone, 1,000 (10,000 events) a transaction, alternated batch by batch
    (`--batches`, default 10): PostgreSQL's statements per table (`_FAST`) and Django's
    collector: `jobs_delete_fast_rows_per_s`, `jobs_delete_plain_rows_per_s` (medians).
  * Samples alone, alternated in one run (`--rounds`, default 3): the same 300,000
    samples deleted by the plain delete that purged them before (`plain`:
    `utilization_purge`) and archived then deleted by `history_prune` (`archived`):
    `samples_plain_rows_per_s`, `samples_archived_rows_per_s` (medians).

Output: `BENCH <name> <value> <unit>`. Run: `.venv/bin/python bench/bench_retention.py`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, drop_postgres, note, recreate_postgres, setup_django_sqlite  # noqa: E402

NOW = datetime(2026, 11, 20, 12, 0, tzinfo=UTC)
TEAMS = 20
SAMPLES = 300_000


def seed(jobs: int, events: int) -> None:
    from accounts.models import Team
    from queueing.models import GpuType, Job, Tier, UsageRollup

    gpu = GpuType.objects.create(slug="h100", name="H100", billing_weight=2.0)
    tier = Tier.objects.create(slug="normal", name="Normal", rank=100,
                               priority_class_name="fairq-normal", priority_value=1000)
    teams = [Team.objects.create(slug=f"team-{i}", name=f"Team {i}") for i in range(TEAMS)]
    template = Job.objects.create(team=teams[0], name="t", image="ghcr.io/acme/train:1.4",
                                  command=["python", "train.py"], gpu_type=gpu,
                                  gpus_per_replica=2, tier=tier, status="SUCCEEDED",
                                  created_at=NOW, finished_at=NOW, started_at=NOW)
    cols = [str(f.column) for f in Job._meta.concrete_fields if f.column != "id"]
    over = {
        "team_id": f"(array[{','.join(str(t.pk) for t in teams)}])[1 + g %% {TEAMS}]",
        "name": "'job-' || g",
        "finished_at": "%(now)s::timestamptz - (g::float8 / %(n)s * 200) * interval '1 day'",
        "started_at": "%(now)s::timestamptz - (g::float8 / %(n)s * 200) * interval '1 day'"
                      " - interval '3 hours'",
        "created_at": "%(now)s::timestamptz - (g::float8 / %(n)s * 200) * interval '1 day'"
                      " - interval '4 hours'",
    }
    select = ", ".join(over.get(c, f'j."{c}"') for c in cols)
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(f"""INSERT INTO queueing_job ({", ".join(f'"{c}"' for c in cols)})
                        SELECT {select} FROM queueing_job j, generate_series(1, %(n)s) g
                        WHERE j.id = %(t)s""", {"now": NOW, "n": jobs, "t": template.pk})
        template.delete()
        cur.execute("""INSERT INTO queueing_jobevent (job_id, at, kind, from_status, to_status,
                           actor_label, reason, attempt, data)
                       SELECT j.id, j.finished_at - k * interval '10 minutes', 'transition',
                           'RUNNING', 'SUCCEEDED', 'scheduler', 'bench', 1,
                           jsonb_build_object('k', k)
                       FROM queueing_job j, generate_series(1, %s) k""", [events])
        cur.execute("""INSERT INTO queueing_usagerecord (team_id, gpu_type_id, job_id, attempt,
                           gpus, billing_weight, start, "end", gpu_seconds, source, spot)
                       SELECT team_id, gpu_type_id, id, 1, 2, 2.0, started_at, finished_at,
                           2 * 3 * 3600, 'scheduler', false FROM queueing_job""")
        cur.execute("""INSERT INTO queueing_utilizationsample (job_id, attempt, minute, sm,
                           mem_bytes)
                       SELECT j.id, 1, date_trunc('minute', j.started_at) + m * interval
                           '1 minute', 50, 1 << 30
                       FROM queueing_job j, generate_series(0, 2) m""")
        cur.execute("SELECT max(id) FROM queueing_usagerecord")
        mark = cur.fetchone()[0]
        cur.execute("ANALYZE")
    UsageRollup.objects.update_or_create(pk=1, defaults={"last_record_id": mark,
                                                         "updated_at": NOW})


def samples_seed(job_ids: list[int]) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("""INSERT INTO queueing_utilizationsample (job_id, attempt, minute, sm,
                           mem_bytes)
                       SELECT j, 2, %s::timestamptz - interval '60 days' + m * interval
                           '1 minute', 50, 1 << 30
                       FROM unnest(%s::bigint[]) j, generate_series(0, %s) m""",
                    [NOW, job_ids, SAMPLES // len(job_ids) - 1])


def timed(fn: object) -> float:
    t = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=10)
    args = parser.parse_args()
    url = os.environ.get("DATABASE_URL", "")
    bench_url = ""
    if url.startswith("postgres"):
        u = urlparse(url)
        bench_url = u._replace(path=f"{u.path.rstrip('/')}_bench_retention").geturl()
        if recreate_postgres(bench_url):
            os.environ["DATABASE_URL"] = bench_url
        else:
            bench_url = ""
            os.environ.pop("DATABASE_URL")
    setup_django_sqlite("fairq_bench_retention")
    from django.conf import settings
    from django.db import connection

    from queueing.models import Job, JobEvent, UtilizationSample
    from queueing.selectors.fairshare import raw_decayed_usage
    from queueing.services.history import history_prune
    from queueing.services.utilization import utilization_purge

    archive = tempfile.mkdtemp(prefix="fairq-history-bench-")
    settings.STORAGES = {**settings.STORAGES, "fairq-history": {
        "BACKEND": "django.core.files.storage.FileSystemStorage",
        "OPTIONS": {"location": archive}}}
    settings.FAIRQ_JOB_RETENTION_DAYS = 90
    settings.FAIRQ_USAGE_RETENTION_DAYS = 100
    settings.FAIRQ_UTIL_RETENTION_DAYS = 30
    note(f"database: {connection.vendor}; load {os.getloadavg()}; the machine is shared")
    t = time.perf_counter()
    seed(args.jobs, args.events)
    note(f"seeded {args.jobs} jobs, {JobEvent.objects.count()} events in "
         f"{time.perf_counter() - t:.1f} s")

    def raw_ms() -> float:
        return statistics.median(timed(lambda: raw_decayed_usage(at=NOW)) for _ in range(5)) * 1000

    before_raw = raw_decayed_usage(at=NOW)
    bench("raw_usage_before_ms", raw_ms(), "ms")
    events_before = JobEvent.objects.count()
    note(f"load before the prune {os.getloadavg()}")
    t = time.perf_counter()
    if os.environ.get("BENCH_PROFILE"):
        import cProfile
        import pstats

        prof = cProfile.Profile()
        result = prof.runcall(history_prune, now=NOW, actor_label="bench")
        pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(40)
    else:
        result = history_prune(now=NOW, actor_label="bench")
    seconds = time.perf_counter() - t
    note(f"load after the prune {os.getloadavg()}")
    deleted = sum(r.deleted for r in result.tables.values())
    for table, r in result.tables.items():
        note(f"{table}: {r.deleted} deleted, {r.archived} archived, {len(r.files)} files")
    bench("prune_seconds", seconds, "s")
    bench("prune_events", events_before - JobEvent.objects.count(), "rows")
    bench("prune_total_rows_per_s", deleted / seconds, "rows/s")
    size = sum(p.stat().st_size for p in Path(archive).rglob("*.gz"))
    bench("archive_bytes", size, "bytes")
    after_raw = raw_decayed_usage(at=NOW)
    worst = max(abs(after_raw.get(k, 0.0) - v) / max(abs(v), 1e-12) for k, v in before_raw.items())
    note(f"raw_decayed_usage after the prune: worst relative difference {worst:.2e}")
    bench("raw_usage_after_ms", raw_ms(), "ms")

    # Deleting jobs alone (1,000 with their events a transaction), alternated batch by
    # batch: PostgreSQL's statements per table (`_FAST`) and Django's collector.
    from queueing.services import history

    left = list(Job.objects.order_by("pk").values_list("pk", flat=True))
    job_rates: dict[bool, list[float]] = {True: [], False: []}
    for k in range(min(args.batches, len(left) // 1000)):
        fast = k % 2 == 0
        history._FAST = fast
        batch = left[k * 1000:(k + 1) * 1000]
        t = time.perf_counter()
        per = history._delete_jobs(batch)
        job_rates[fast].append(sum(per.values()) / (time.perf_counter() - t))
    history._FAST = True
    note(f"job deletes alternated, load {os.getloadavg()}")
    bench("jobs_delete_fast_rows_per_s", statistics.median(job_rates[True]), "rows/s")
    bench("jobs_delete_plain_rows_per_s", statistics.median(job_rates[False]), "rows/s")

    # Samples alone: the plain delete and the archived prune, alternated.
    settings.FAIRQ_JOB_RETENTION_DAYS = 0
    settings.FAIRQ_USAGE_RETENTION_DAYS = 0
    job_ids = list(Job.objects.order_by("pk").values_list("pk", flat=True)[:1000])
    UtilizationSample.objects.all().delete()  # the seed's recent ones: only the rounds
    rates: dict[str, list[float]] = {"plain": [], "archived": []}
    for k in range(args.rounds):
        for side in ("plain", "archived") if k % 2 == 0 else ("archived", "plain"):
            samples_seed(job_ids)
            n = UtilizationSample.objects.count()
            with connection.cursor() as cur:
                cur.execute("ANALYZE queueing_utilizationsample")
            if side == "plain":
                s = timed(lambda: utilization_purge(now=NOW, days=30))
            else:
                s = timed(lambda: history_prune(now=NOW))
            assert not UtilizationSample.objects.exists(), side
            rates[side].append(n / s)
            note(f"round {k} {side}: {n} samples in {s:.2f} s, load {os.getloadavg()[0]:.2f}")
    if not args.rounds:
        return
    bench("samples_plain_rows_per_s", statistics.median(rates["plain"]), "rows/s")
    bench("samples_archived_rows_per_s", statistics.median(rates["archived"]), "rows/s")
    note(f"load at the end {os.getloadavg()}")
    if bench_url:
        drop_postgres(bench_url)


if __name__ == "__main__":
    main()
