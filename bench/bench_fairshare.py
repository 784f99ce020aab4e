"""Fair-share standings benchmark (docs/scheduling.md, rules F1-F5).

Question: does computing the standings stay fast and flat whatever the length of the usage
history? Goal: under 50 ms per recompute of the standings for 1,000 teams, the same at
10 thousand, 1 million and 10 million historical usage records.

How it works
  * Database: PostgreSQL at $FAIRQ_BENCH_DATABASE_URL, default
    postgres://postgres@127.0.0.1:5432/fairq_fs_bench: a database of its own, dropped and
    created afresh every run (never $DATABASE_URL: the bench would wipe it). There the
    usage table is made UNLOGGED and its secondary indexes are dropped, so 10M rows load
    in about a minute; neither measured path uses them (standings never read the usage
    table, the full recompute is one sequential scan). Without a reachable PostgreSQL it
    runs on a SQLite file in /tmp with the 10 million step skipped.
  * World: 1,000 teams (50 departments of 19 teams plus the 50 departments themselves, so
    the hierarchy of rule F4 is exercised), 3 GPU types, a quota per team, 200 running and
    100 admitted jobs (running attempts and entry penalties are part of every standing).
  * History: usage records are generated inside PostgreSQL with `generate_series`
    (INSERT ... SELECT, foreign-key triggers off for the session), spread over a year, and
    topped up from 10k to 1M to 10M rows.
  * At each size:
      - `recompute_full_<N>`: `fairshare_recompute` (what `manage.py fairshare --recompute`
        runs): one aggregate query over the whole history rebuilding every accumulator;
      - `standings_1000teams_<N>_p50/_p95`: `fairshare_standings(now=...)`, the hot path of
        every scheduler cycle, the API and the command: reads one accumulator per team;
      - `standings_policy_1000teams_p50`: the pure `compute_standings` alone.
  * Exactness: at 10k rows the accumulators are first built record by record through the
    incremental path (`Accumulator.add_interval`, what charging an attempt does) and
    compared with the full recompute: `accumulator_vs_recompute_max_rel_diff`.
  * `accumulator_add_p50`: charging one finished interval (row lock + closed form).

Output: lines `BENCH <name> <value> <unit>` (p50, p95 and the fastest run: on a busy
shared machine the load average, printed on stderr, inflates p50 and p95).
Run: `.venv/bin/python bench/bench_fairshare.py` (`make bench`); about 2 minutes on 2
cores, most of it generating 10M rows.
Options: `--sizes 10000,1000000` to choose the history sizes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note, recreate_postgres  # noqa: E402  (bench/ is sys.path[0])

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/fairq_fs_bench"
TEAMS = 1000
DEPARTMENTS = 50
GPU_TYPES = (("h100", 2.0), ("a100", 1.0), ("mig-1g-10gb", 0.15))


def setup_django() -> str:
    url = os.environ.get("FAIRQ_BENCH_DATABASE_URL") or DEFAULT_PG
    if url.startswith("postgres") and recreate_postgres(url):
        os.environ["DATABASE_URL"] = url
    else:
        os.environ["DATABASE_URL"] = "sqlite:////tmp/fairq_bench_fairshare.sqlite3"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("ALTER TABLE queueing_usagerecord SET UNLOGGED")
            # A vacuum of the fresh rows would run during the timings: not what we measure.
            cur.execute("ALTER TABLE queueing_usagerecord SET (autovacuum_enabled = false)")
            cur.execute("SELECT indexname FROM pg_indexes WHERE tablename = "
                        "'queueing_usagerecord' AND indexname NOT LIKE '%%_pkey'")
            for (name,) in cur.fetchall():
                cur.execute(f'DROP INDEX IF EXISTS "{name}"')
            cur.execute("SELECT conname FROM pg_constraint WHERE conrelid = "
                        "'queueing_usagerecord'::regclass AND contype = 'u'")
            for (name,) in cur.fetchall():
                cur.execute(f'ALTER TABLE queueing_usagerecord DROP CONSTRAINT "{name}"')
    return connection.vendor


def build_world(now: datetime) -> tuple[list[int], list[int]]:
    from django.db import connection

    from accounts.models import Team
    from queueing.models import GpuType, Job, Quota, Tier

    with connection.cursor() as cur:
        tables = ["queueing_usagerecord", "queueing_fairshareaccumulator",
                  "queueing_fairsharesnapshot", "queueing_jobevent", "queueing_job",
                  "queueing_quota", "accounts_team", "queueing_gputype", "queueing_tier"]
        if connection.vendor == "postgresql":
            cur.execute(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE")
        else:
            for t in tables:
                cur.execute(f"DELETE FROM {t}")
    gpu = [GpuType.objects.create(slug=s, name=s.upper(), billing_weight=w)
           for s, w in GPU_TYPES]
    tier = Tier.objects.create(slug="normal", name="Normal", rank=100,
                               priority_class_name="fairq-normal", priority_value=1000)
    depts = Team.objects.bulk_create(
        [Team(slug=f"dept-{d}", name=f"Dept {d}", weight=1.0 + d % 3)
         for d in range(DEPARTMENTS)])
    per = (TEAMS - DEPARTMENTS) // DEPARTMENTS
    teams = Team.objects.bulk_create(
        [Team(slug=f"team-{d}-{i}", name=f"Team {d}-{i}", weight=1.0 + (i % 4),
              parent=depts[d]) for d in range(DEPARTMENTS) for i in range(per)])
    all_teams = [*depts, *teams]
    Quota.objects.bulk_create([Quota(team=t, gpu_type=gpu[0], nominal=1) for t in teams])
    jobs = []
    for i in range(300):
        t = teams[(i * 7) % len(teams)]
        running = i < 200
        jobs.append(Job(team=t, name=f"j{i}", image="x", gpu_type=gpu[i % 3],
                        gpus_per_replica=1 + i % 8, replicas=1, tier=tier,
                        status="RUNNING" if running else "ADMITTED",
                        created_at=now - timedelta(hours=3),
                        started_at=now - timedelta(minutes=1 + i) if running else None))
    Job.objects.bulk_create(jobs)
    return [t.pk for t in all_teams], [g.pk for g in gpu]


def fill_usage(*, upto: int, have: int, team_ids: list[int], gpu_ids: list[int],
               now: datetime) -> None:
    """Top the usage records up from `have` to `upto` rows, generated in the database."""
    from django.db import connection, transaction

    t_lo, n_teams = min(team_ids), len(team_ids)
    assert max(team_ids) - t_lo + 1 == n_teams, "team ids must be contiguous"
    g_lo = min(gpu_ids)
    chunk = 1_000_000
    a = have
    while a < upto:
        b = min(upto, a + chunk)
        with transaction.atomic(), connection.cursor() as cur:
            if connection.vendor == "postgresql":
                cur.execute("SET LOCAL session_replication_role = replica")
                cur.execute(
                    """
                    INSERT INTO queueing_usagerecord
                      (team_id, gpu_type_id, job_id, attempt, gpus, billing_weight,
                       start, "end", gpu_seconds, source)
                    SELECT %(t)s + (i %% %(n)s), %(g)s + (i %% 3), NULL, NULL, 1 + (i %% 8),
                           (ARRAY[2.0, 1.0, 0.15])[1 + (i %% 3)],
                           s, s + make_interval(secs => d), (1 + (i %% 8)) * d, 'scheduler'
                    FROM (
                      SELECT i, ((i * 7919) %% 31536000)::float8 AS d0,
                             (60 + (i * 31) %% 86400)::float8 AS d
                      FROM generate_series(%(a)s::bigint, %(b)s::bigint - 1) AS i
                    ) q,
                    LATERAL (SELECT %(now)s::timestamptz
                             - make_interval(secs => q.d0 + q.d + 1) AS s) x
                    """,
                    {"t": t_lo, "n": n_teams, "g": g_lo, "a": a, "b": b, "now": now},
                )
            else:
                cur.execute(
                    """
                    WITH RECURSIVE seq(i) AS (SELECT %s UNION ALL SELECT i + 1 FROM seq
                                              WHERE i + 1 < %s)
                    INSERT INTO queueing_usagerecord
                      (team_id, gpu_type_id, job_id, attempt, gpus, billing_weight,
                       start, "end", gpu_seconds, source)
                    SELECT %s + (i %% %s), %s + (i %% 3), NULL, NULL, 1 + (i %% 8),
                           CASE i %% 3 WHEN 0 THEN 2.0 WHEN 1 THEN 1.0 ELSE 0.15 END,
                           strftime('%%Y-%%m-%%d %%H:%%M:%%f', %s, '-' ||
                             (((i * 7919) %% 31536000) + 60 + (i * 31) %% 86400 + 1)
                             || ' seconds'),
                           strftime('%%Y-%%m-%%d %%H:%%M:%%f', %s, '-' ||
                             (((i * 7919) %% 31536000) + 1) || ' seconds'),
                           (1 + (i %% 8)) * (60 + (i * 31) %% 86400), 'scheduler'
                    FROM seq
                    """,
                    [a, b, t_lo, n_teams, g_lo, now.strftime("%Y-%m-%d %H:%M:%S"),
                     now.strftime("%Y-%m-%d %H:%M:%S")],
                )
        a = b
    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("ANALYZE queueing_usagerecord")
            # Write the fresh pages out now, not while the standings are being timed.
            cur.execute("CHECKPOINT")
        os.sync()


def build_accumulators_incrementally(now: datetime) -> None:
    """The incremental path: every record folded into its team's accumulator in time
    order, as charging attempts one by one does."""
    from queueing.models import FairShareAccumulator, UsageRecord
    from queueing.policy.fairshare import Accumulator
    from queueing.selectors.fairshare import half_life_hours

    h = half_life_hours()
    accs: dict[int, Accumulator] = {}
    for team_id, gpus, weight, start, end in UsageRecord.objects.order_by("end").values_list(
            "team_id", "gpus", "billing_weight", "start", "end").iterator(chunk_size=20_000):
        acc = accs.get(team_id) or Accumulator(0.0, end)
        accs[team_id] = acc.add_interval(rate=gpus * weight, start=start, end=end,
                                         half_life_hours=h)
    FairShareAccumulator.objects.all().delete()
    FairShareAccumulator.objects.bulk_create(
        [FairShareAccumulator(team_id=t, value=a.value, as_of=a.as_of) for t, a in accs.items()])


def time_standings(now: datetime, runs: int = 40) -> tuple[float, float, float]:
    from queueing.selectors.fairshare import fairshare_standings

    fairshare_standings(now=now)  # warm
    samples = []
    for i in range(runs):
        t0 = time.perf_counter()
        st = fairshare_standings(now=now + timedelta(milliseconds=i))
        samples.append(time.perf_counter() - t0)
    assert len(st) == TEAMS, len(st)
    samples.sort()
    return statistics.median(samples), samples[int(0.95 * (len(samples) - 1))], samples[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="10000,1000000,10000000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    t_start = time.perf_counter()
    vendor = setup_django()
    if vendor != "postgresql":
        sizes = [s for s in sizes if s <= 1_000_000]
    note(f"database: {vendor}; sizes {sizes}")

    from django.db import transaction

    from queueing.policy.fairshare import compute_standings
    from queueing.selectors.fairshare import fairshare_inputs, half_life_hours
    from queueing.services.fairshare import fairshare_recompute
    from queueing.services.usage import accumulator_add

    now = datetime.now(UTC).replace(microsecond=0)
    team_ids, gpu_ids = build_world(now)
    have = 0
    for n in sizes:
        t0 = time.perf_counter()
        fill_usage(upto=n, have=have, team_ids=team_ids, gpu_ids=gpu_ids, now=now)
        have = n
        note(f"{n} usage records in place ({time.perf_counter() - t0:.1f} s to generate)")
        if n <= 100_000:
            build_accumulators_incrementally(now)
            check = fairshare_recompute(now=now, write=False)
            bench(f"accumulator_vs_recompute_max_rel_diff_{n}", check.max_rel_diff, "ratio")
        res = fairshare_recompute(now=now)
        bench(f"recompute_full_{_label(n)}", res.seconds, "s")
        p50, p95, best = time_standings(now)
        bench(f"standings_1000teams_{_label(n)}_p50", p50, "s")
        bench(f"standings_1000teams_{_label(n)}_p95", p95, "s")
        # The fastest run: the cost without other processes' load on a shared machine.
        bench(f"standings_1000teams_{_label(n)}_min", best, "s")
        note(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")

    inputs, extra = fairshare_inputs(now=now)
    samples = []
    for _ in range(30):
        t0 = time.perf_counter()
        compute_standings(inputs, now=now, half_life_hours=half_life_hours(), extra_usage=extra)
        samples.append(time.perf_counter() - t0)
    bench("standings_policy_1000teams_p50", statistics.median(samples), "s")

    samples = []
    for i in range(100):
        end = now + timedelta(seconds=i)
        t0 = time.perf_counter()
        with transaction.atomic():
            accumulator_add(team_id=team_ids[i % len(team_ids)], rate=8.0,
                            start=end - timedelta(hours=1), end=end)
        samples.append(time.perf_counter() - t0)
    bench("accumulator_add_p50", statistics.median(samples), "s")
    bench("bench_fairshare_total", time.perf_counter() - t_start, "s")


def _label(n: int) -> str:
    if n >= 1_000_000 and n % 1_000_000 == 0:
        return f"{n // 1_000_000}M"
    if n >= 1000 and n % 1000 == 0:
        return f"{n // 1000}k"
    return str(n)


if __name__ == "__main__":
    main()
