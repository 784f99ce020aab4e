"""Web pages benchmark (docs/dashboard.md): the dashboard, the job list (the queue
page), a job's page and the reports page with up to 1,000,000 jobs in PostgreSQL.

Question: do the pages stay fast as the history grows? Goal: p95 server time under
150 ms per page, and a number of queries per page that does not grow with the jobs.

How it works
  * Database: PostgreSQL at $FAIRQ_DASH_BENCH_DATABASE_URL, default
    postgres://postgres@127.0.0.1:5432/fairq_dash_bench: a database of its own, dropped
    and created afresh every run (never $DATABASE_URL), or kept (`--keep`) and timed
    again without building (`--reuse`). Without a reachable PostgreSQL it runs on a
    SQLite file in /tmp (bulk_create, small sizes only).
  * World (`--jobs`, `--queued`, `--running`, `--teams`, `--days`): teams under
    departments of 10, 3 GPU types, 4 tiers, the jobs spread over the teams and the
    days, oldest first: `--queued` queued and `--running` running among the newest, the
    rest succeeded, failed, cancelled or preempted. Every job has its events (submitted;
    started; ended: 1 to 3 rows), every attempt that ended a usage record, rolled up
    into the reports' days (`UsageDay`, summed in SQL from the records); the running
    jobs their utilization; standings snapshots every 15 minutes for 7 days; an
    accumulator per team. On PostgreSQL the rows go in by COPY (psycopg 3
    `cursor.copy`), each column rendered by the model field's own conversion of a
    prototype row. The viewer is a member of team-00.
  * Each page is requested `--requests` times through Django's test Client (the whole
    middleware stack and template rendering, no network), after 5 warm-up requests:
      - `dashboard` (`/`) and `dashboard_live` (the HTMX fragment it polls every 3 s);
      - `jobs` (the job list: the team's jobs newest first, keyset-paginated),
        `jobs_page2` (`before=`), `jobs_filtered` (`status=SUCCEEDED`) and
        `jobs_queued` (`status=QUEUED`);
      - `job_detail` (a queued job: its place in the queue) and `job_detail_done` (a
        finished one: its events, attempts, utilization);
      - `reports` (`/reports/`, the viewer's team, 12 months) and `reports_staff` (every
        team: a platform admin's).
    The queue positions come from the cached admission plan: the bench keeps it cached
    for the whole run (QUEUE_PLAN_TTL raised), as its cost is the cycle's, not the
    page's; `queue_plan_cold_p50` is one plan of the whole queue, what a request pays
    when it finds none (printed apart; `--skip-plan` leaves it out).
  * Queries per page are counted on one extra request with CaptureQueriesContext; the
    web process's CPU time of each request (`time.process_time`, PostgreSQL's own not
    included) gives `<page>_cpu_p50` / `_cpu_p95` beside the wall times.
  * `--rounds N --ab`: the pages are timed N times, alternately without and with the
    page indexes of migration 0034 (DROP INDEX / CREATE INDEX between rounds, ANALYZE
    after), on the same database in the same process: `<page>_p50_noidx`, `_p95_noidx`
    beside `_p50`, `_p95` (every round's requests pooled per side).
  * `--rounds N --published-ab`: alternately `before` (requests plan the queue and
    refresh the dashboard's kept reads, the plan kept cached for the whole run) and the
    scheduler cycle publishing both (an emulated cycle, untimed, every `--cycle-seconds`):
    `<page>_p95_before` beside `<page>_p95`; `plan_publish` and `page_reads_publish_p50`
    are the cycle's added work, `plan_published_fetch_p50` a reader's once per cycle
    (`PublishedAB`).
  * `--rounds N --dash-ab`: alternately `before` (`dashboard.SERIES_KEPT_PER_PROCESS` and
    `SESSIONS_OF_OWNERS_ONLY` off: every request unpickles every team's usage series and
    reads the sessions' join) and both on: `<page>_p50_before`, `_cpu_p50_before` beside
    `<page>_p50`, `_cpu_p50`.
  * `--collector`: the collector set up as config/wsgi.py sets up a web process's
    (`collector_setup`, right after the application is loaded); runs with and without
    it alternate as separate processes.
  * `--rounds N --running-ab`: alternately `before` (`reports.RUNNING_JOINED` off: the
    running attempts' utilization read by three correlated subqueries) and one join.

Output: lines `BENCH <name> <value> <unit>`. Run: `.venv/bin/python bench/bench_dashboard.py`
(`make bench`; about a minute at 100,000 jobs). The 1M world:
`--jobs 1000000 --queued 100000 --running 5000 --teams 1000 --days 180` (about 6 minutes
to build on 2 shared cores).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import sys
import time
from datetime import date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, drop_postgres, note, recreate_postgres  # noqa: E402  (bench/ is sys.path[0])

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/fairq_dash_bench"
GPU_TYPES = (("h100", 2.0), ("a100", 1.0), ("mig-1g-10gb", 0.15))
TIERS = (("low", 0), ("normal", 100), ("high", 200), ("critical", 300))
DONE = ["SUCCEEDED"] * 14 + ["FAILED"] * 3 + ["CANCELLED"] * 2 + ["PREEMPTED"]


def setup_django(*, reuse: bool) -> str:
    url = os.environ.get("FAIRQ_DASH_BENCH_DATABASE_URL") or DEFAULT_PG
    if url.startswith("postgres") and (reuse or recreate_postgres(url)):
        os.environ["DATABASE_URL"] = url
    else:
        path = Path("/tmp/fairq_bench_dashboard.sqlite3")
        if not reuse:
            path.unlink(missing_ok=True)
        os.environ["DATABASE_URL"] = f"sqlite:///{path}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    from django.conf import settings
    from django.db import connection

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]  # the test Client's
    return connection.vendor


# --- rows by COPY -----------------------------------------------------------------------------

def _copy_text(value: Any) -> str:
    """One value in COPY's text format."""
    if value is None:
        return r"\N"
    if isinstance(value, bool):
        return "t" if value else "f"
    if hasattr(value, "obj"):  # psycopg's Json / Jsonb wrapper
        value = json.dumps(value.obj)
    elif isinstance(value, list | dict):  # a JSON column's value given per row
        value = json.dumps(value)
    elif isinstance(value, datetime | date):
        value = value.isoformat()
    elif not isinstance(value, str):
        value = str(value)
    return (value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
            .replace("\r", "\\r"))


class Copier:
    """Rows of one model by COPY: a prototype instance's every column through the field's
    own conversion (`get_db_prep_save`), then per row only the columns given."""

    def __init__(self, model: Any, prototype: Any, *, with_id: bool = False) -> None:
        from django.db import connection

        self.model = model
        fields = [f for f in model._meta.concrete_fields if with_id or not f.primary_key]
        self.names = [f.attname for f in fields]
        self.index = {n: i for i, n in enumerate(self.names)}
        self.template = [_copy_text(f.get_db_prep_save(getattr(prototype, f.attname), connection))
                         for f in fields]
        quote = connection.ops.quote_name
        self.sql = (f"COPY {quote(model._meta.db_table)} "
                    f"({', '.join(quote(f.column) for f in fields)}) FROM STDIN")
        self.buf = io.StringIO()
        self.count = 0

    def row(self, **values: Any) -> None:
        line = list(self.template)
        for k, v in values.items():
            line[self.index[k]] = _copy_text(v)
        self.buf.write("\t".join(line))
        self.buf.write("\n")
        self.count += 1
        if self.count % 50_000 == 0:
            self.flush()

    def flush(self) -> None:
        from django.db import connection

        data = self.buf.getvalue()
        self.buf = io.StringIO()
        if not data:
            return
        with connection.cursor() as cur:
            raw = cur.cursor
            with raw.copy(self.sql) as copy:
                copy.write(data)

    def done(self) -> int:
        from django.db import connection

        self.flush()
        table = self.model._meta.db_table
        with connection.cursor() as cur:  # the id sequence past the rows written
            cur.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), "
                        f"COALESCE((SELECT MAX(id) FROM {table}), 1))")
        return self.count


class OrmWriter:
    """The same rows by bulk_create (SQLite)."""

    def __init__(self, model: Any, prototype: Any, *, with_id: bool = False) -> None:
        self.model = model
        self.base = {f.attname: getattr(prototype, f.attname)
                     for f in model._meta.concrete_fields}
        self.batch: list[Any] = []
        self.count = 0

    def row(self, **values: Any) -> None:
        self.batch.append(self.model(**{**self.base, **values}))
        self.count += 1
        if len(self.batch) >= 5000:
            self.flush()

    def flush(self) -> None:
        self.model.objects.bulk_create(self.batch)
        self.batch = []

    def done(self) -> int:
        self.flush()
        return self.count


# --- the world --------------------------------------------------------------------------------

def build_world(*, jobs: int, queued: int, running: int, teams_n: int, days: float,
                now: datetime) -> None:
    """Teams, quotas, jobs, events, usage and its roll-up, utilization, snapshots."""
    from django.db import connection, transaction

    from accounts.models import Membership, Role, Team
    from queueing.models import (
        AttemptUtilization,
        FairShareAccumulator,
        FairShareSnapshot,
        GpuPrice,
        GpuType,
        Job,
        JobEvent,
        Quota,
        Tier,
        UsageRecord,
        UsageRollup,
    )
    from tests.factories import UserFactory

    pg = connection.vendor == "postgresql"
    writer = Copier if pg else OrmWriter
    rng = random.Random(7)
    gpus = [GpuType.objects.create(slug=s, name=s.upper(), billing_weight=w) for s, w in GPU_TYPES]
    for g, price in zip(gpus, ("3.20", "1.60", "0.25"), strict=True):
        GpuPrice.objects.create(gpu_type=g, effective_from=(now - timedelta(days=days + 40)).date(),
                                price_per_gpu_hour=Decimal(price))
    tiers = [Tier.objects.create(slug=s, name=s.title(), rank=r, priority_class_name=f"fq-{s}",
                                 priority_value=r * 10, preemptible=s != "critical")
             for s, r in TIERS]
    depts = Team.objects.bulk_create([Team(slug=f"dept-{d:03d}", name=f"Dept {d}")
                                      for d in range(max(1, teams_n // 10))])
    teams = Team.objects.bulk_create(
        [Team(slug=f"team-{i:02d}" if teams_n <= 100 else f"team-{i:04d}", name=f"Team {i}",
              weight=1.0 + i % 4, parent=depts[i // 10 % len(depts)]) for i in range(teams_n)])
    Quota.objects.bulk_create([Quota(team=t, gpu_type=g, nominal=2, borrowing_limit=None)
                               for t in teams for g in gpus])
    viewer = UserFactory(username="viewer")
    UserFactory(username="root", is_staff=True)
    Membership.objects.create(user=viewer, team=teams[0], role=Role.MEMBER)

    t0 = time.perf_counter()
    start = now - timedelta(days=days)
    span = (now - start).total_seconds()
    proto = Job(team=teams[0], submitter=None, name="job", image="ghcr.io/acme/train:1.4",
                command=["python", "train.py"], gpu_type=gpus[0], gpus_per_replica=1,
                replicas=1, tier=tiers[0], status="SUCCEEDED", created_at=now, updated_at=now)
    jw = writer(Job, proto, with_id=True)
    ew = writer(JobEvent, JobEvent(job_id=1, at=now, kind="transition", actor_label="scheduler"))
    uw = writer(UsageRecord, UsageRecord(team=teams[0], gpu_type=gpus[0], job_id=1, attempt=1,
                                         gpus=1.0, billing_weight=1.0, start=now, end=now,
                                         gpu_seconds=0.0, source="scheduler"))
    # The queued and running jobs among the newest: the last `6 * queued` jobs hold the
    # queued ones, the last `20 * running` the running ones (as the old bench did).
    queued_left, running_left = queued, running
    q_from, r_from = jobs - max(queued * 3, 1), jobs - max(running * 10, 1)
    q_p = queued / max(1, jobs - q_from)
    r_p = running / max(1, jobs - r_from)
    running_ids: list[tuple[int, int, datetime]] = []
    with transaction.atomic():  # the foreign keys checked once, at the end
        for i in range(jobs):
            jid = i + 1
            created = start + timedelta(seconds=span * i / jobs)
            team = teams[i % teams_n]
            if i >= q_from and queued_left and (rng.random() < q_p * 1.2
                                                 or jobs - i <= queued_left):
                status, queued_left = "QUEUED", queued_left - 1
            elif i >= r_from and running_left and (rng.random() < r_p * 1.2
                                                    or jobs - i <= running_left):
                status, running_left = "RUNNING", running_left - 1
            else:
                status = rng.choice(DONE)
            g = gpus[i % 3]
            n = 1 + i % 4
            started = None if status == "QUEUED" else created + timedelta(minutes=1)
            final = status not in ("QUEUED", "RUNNING")
            finished = created + timedelta(minutes=30) if final else None
            if started is not None and started > now:
                started = now
            if finished is not None and finished > now:
                finished = now
            jw.row(id=jid, team_id=team.pk, submitter_id=viewer.pk if i % teams_n == 0 else None,
                   name=f"job-{i}", gpu_type_id=g.pk, gpus_per_replica=n, tier_id=tiers[i % 4].pk,
                   status=status, created_at=created, updated_at=finished or started or created,
                   admitted_at=started, started_at=started, finished_at=finished,
                   placement=[f"sim-{g.slug}-000"] if status == "RUNNING" else [])
            ew.row(job_id=jid, at=created, to_status="QUEUED", reason="submitted")
            if started is not None:
                ew.row(job_id=jid, at=started, from_status="QUEUED", to_status="RUNNING",
                       reason="admitted")
            if status == "RUNNING":
                running_ids.append((jid, team.pk, started))
            if final:
                assert started is not None and finished is not None
                if status == "PREEMPTED":
                    ew.row(job_id=jid, at=finished, kind="preempted", reason="preempted by job 1")
                ew.row(job_id=jid, at=finished, from_status="RUNNING", to_status=status,
                       reason=status.lower())
                uw.row(team_id=team.pk, gpu_type_id=g.pk, job_id=jid, attempt=1, gpus=float(n),
                       billing_weight=g.billing_weight, start=started, end=finished,
                       gpu_seconds=n * (finished - started).total_seconds())
        n_jobs, n_events, n_usage = jw.done(), ew.done(), uw.done()
    note(f"{n_jobs} jobs, {n_events} events, {n_usage} usage records written in "
         f"{time.perf_counter() - t0:.1f} s ({'COPY' if pg else 'bulk_create'})")
    AttemptUtilization.objects.bulk_create([
        AttemptUtilization(job_id=jid, attempt=1, first_at=st, last_at=now, samples=60,
                           sm_sum=60 * 40.0, sm_mean=40.0, sm_hist={"2": 20, "60": 40})
        for jid, _, st in running_ids], batch_size=5000)
    t1 = time.perf_counter()
    # The reports' roll-up of every record (what `usage_days_roll_up` holds after it ran):
    # summed per UTC day of the start in SQL (a record here lasts 29 minutes; one that
    # crosses midnight is counted on its first day: an approximation of rule C2's cut).
    # Used 40 % of the allocated hours, the rest idle; preempted ones preempted.
    with connection.cursor() as cur:
        day = "DATE(u.start AT TIME ZONE 'UTC')" if pg else "DATE(u.start)"
        cur.execute(f"""
            INSERT INTO queueing_usageday (day, team_id, gpu_type_id, allocated_gpu_hours,
                used_gpu_hours, idle_gpu_hours, preempted_gpu_hours, lost_gpu_hours)
            SELECT {day}, u.team_id, u.gpu_type_id, SUM(u.gpu_seconds) / 3600.0,
                   0.4 * SUM(u.gpu_seconds) / 3600.0, 0.6 * SUM(u.gpu_seconds) / 3600.0,
                   SUM(CASE WHEN j.status = 'PREEMPTED' THEN u.gpu_seconds ELSE 0 END) / 3600.0,
                   0.0
            FROM queueing_usagerecord u JOIN queueing_job j ON j.id = u.job_id
            GROUP BY 1, 2, 3""")
    last = UsageRecord.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
    UsageRollup.objects.update_or_create(pk=1, defaults={"last_record_id": last,
                                                         "updated_at": now})
    note(f"roll-up of the usage records in SQL: {time.perf_counter() - t1:.1f} s")
    FairShareAccumulator.objects.bulk_create([
        FairShareAccumulator(team=t, value=10.0 * (i + 1), as_of=now) for i, t in enumerate(teams)])
    FairShareSnapshot.objects.bulk_create([
        FairShareSnapshot(at=now - timedelta(minutes=15 * k), half_life_hours=168.0,
                          standings={t.slug: [10.0 * (i + 1) * (1 + k / 700), 0.05, 0.05, 0.5]
                                     for i, t in enumerate(teams)})
        for k in range(1, 7 * 96)], batch_size=50)
    t2 = time.perf_counter()
    if pg:
        with connection.cursor() as cur:
            cur.execute("VACUUM ANALYZE")
    note(f"VACUUM ANALYZE: {time.perf_counter() - t2:.1f} s")


# --- the page indexes, off and on -------------------------------------------------------------

def page_indexes() -> list[tuple[str, str]]:
    """(name, CREATE INDEX statement) of migration 0034's indexes, as migrate made them."""
    from django.db import connection

    names = _migration_index_names()
    if not names:
        return []
    with connection.cursor() as cur:
        cur.execute("SELECT indexname, indexdef FROM pg_indexes WHERE indexname = ANY(%s)",
                    [names])
        return sorted(cur.fetchall())


def _migration_index_names() -> list[str]:
    try:
        from importlib import import_module

        mig = import_module("queueing.migrations.0034_page_indexes")
    except ImportError:
        return []
    return list(getattr(mig, "PAGE_INDEXES", ()))


# What migration 0034 replaced: back on the side without its indexes.
REPLACED = (("job_team_status_idx",
             'CREATE INDEX "job_team_status_idx" ON queueing_job (team_id, status)'),)


def indexes_set(defs: list[tuple[str, str]], *, on: bool) -> None:
    from django.db import connection

    with connection.cursor() as cur:
        for name, ddl in defs:
            cur.execute(ddl.replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1) if on
                        else f'DROP INDEX IF EXISTS "{name}"')
        for name, ddl in REPLACED:
            cur.execute(f'DROP INDEX IF EXISTS "{name}"' if on
                        else ddl.replace("CREATE INDEX", "CREATE INDEX IF NOT EXISTS", 1))
        cur.execute("ANALYZE queueing_job")
        cur.execute("ANALYZE queueing_jobevent")


# --- timing -----------------------------------------------------------------------------------

CPU_TIMES: list[float] = []  # the web process's CPU of each timed request, ms (time_page)


def time_page(client: Any, url: str, n: int, between: Any = None,
              **headers: str) -> tuple[list[float], int]:
    """`n` timed requests after 5 warm-ups; `between()` (untimed) before each: what a
    scheduler cycle does meanwhile (`--published-ab`)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(5):
        r = client.get(url, **headers)
        assert r.status_code == 200, (url, r.status_code)
    times = []
    for _ in range(n):
        if between is not None:
            between()
        t, c = time.perf_counter(), time.process_time()
        client.get(url, **headers)
        times.append((time.perf_counter() - t) * 1000)
        CPU_TIMES.append((time.process_time() - c) * 1000)
    with CaptureQueriesContext(connection) as ctx:
        client.get(url, **headers)
    return times, len(ctx.captured_queries)


class PublishedAB:
    """`--published-ab`: the pages with the queue plan and the dashboard's kept reads
    made by requests (`before`: `queue_plan.PUBLISHED` and `dashboard.PAGE_READS_PUBLISHED`
    off; the request's plan stays cached for the whole run, as this bench always kept it:
    its cost after each cycle that moved a job, `queue_plan_cold_p50`, is printed apart)
    against both published by the cycle (`after`: an emulated cycle, untimed, publishes
    the plan under a new generation and the kept reads every `--cycle-seconds`, so the
    timed requests pay what a reader pays after each cycle: a fetch of the plan and of
    the kept reads). The plan is the pass's own on the world's snapshot."""

    def __init__(self, tag: str) -> None:
        from django.core.cache import cache
        from django.utils import timezone

        from queueing.selectors import dashboard as dash
        from queueing.selectors import queue_plan as qp
        from queueing.selectors.cluster import cluster_view
        from queueing.selectors.snapshot import build_snapshot

        self.tag, self.cache, self.qp, self.dash = tag, cache, qp, dash
        qp.PUBLISHED_TTL = dash.PAGE_PUBLISHED_SECONDS = 24 * 3600.0
        now = timezone.now()
        view = cluster_view(now=now)
        snapshot = build_snapshot(backend=view, now=now, live_workloads=set(view.workloads))
        t = time.perf_counter()
        plan = qp.plan_admissions(snapshot)
        bench(f"queue_plan_cold_p50{tag}", (time.perf_counter() - t) * 1000, "ms")
        t = time.perf_counter()
        self.published = qp.queue_plan_publish(snapshot=snapshot, plan=plan, admitted=(),
                                               unprovisioned=view.unprovisioned)
        bench(f"plan_publish{tag}", (time.perf_counter() - t) * 1000, "ms")
        import pickle
        bench(f"plan_published_bytes{tag}", len(pickle.dumps(self.published)), "bytes")
        entries = qp.plan_entries(snapshot, plan)
        self.plan_w = qp.QueuePlan(entries, len(entries), generation="before")
        self.fetch: list[float] = []
        self.reads: list[float] = []
        self.last = 0.0

    def side(self, *, published: bool, cycle_seconds: float) -> Any:
        qp, dash, cache = self.qp, self.dash, self.cache
        qp.PUBLISHED = dash.PAGE_READS_PUBLISHED = published
        cache.delete_many(list(dash.PAGE_CACHE_KEYS))
        dash._local.clear()
        qp._Local.plan = qp._Local.published = None
        if not published:
            cache.set_many({qp._PLAN_KEY: self.plan_w, qp._GEN_KEY: self.plan_w.generation},
                           timeout=24 * 3600)
            return None
        cache.delete_many([qp._PLAN_KEY, qp._GEN_KEY])
        self.last = 0.0

        def cycle() -> None:
            from dataclasses import replace
            from uuid import uuid4

            from django.utils import timezone
            if time.perf_counter() - self.last < cycle_seconds:
                return
            self.last = time.perf_counter()
            new = replace(self.published, generation=uuid4().hex)
            cache.set_many({qp._PUB_KEY: new, qp._PUB_GEN_KEY: new.generation},
                           timeout=24 * 3600)
            t = time.perf_counter()
            dash.page_reads_publish(now=timezone.now(), moved=True)
            self.reads.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            qp._published(new.generation)  # what one reader pays once per cycle
            self.fetch.append((time.perf_counter() - t) * 1000)
            qp._Local.published = None  # ... and the timed request of this process too
        return cycle

    def report(self) -> None:
        if self.fetch:
            bench(f"plan_published_fetch_p50{self.tag}", statistics.median(self.fetch), "ms")
            bench(f"page_reads_publish_p50{self.tag}", statistics.median(self.reads), "ms")
        self.qp.PUBLISHED = self.dash.PAGE_READS_PUBLISHED = True


def p95(times: list[float]) -> float:
    s = sorted(times)
    return s[min(len(s) - 1, round(0.95 * len(s)) - 1)]


def calibration() -> float:
    t = time.perf_counter()
    x = 0
    for i in range(1_000_000):
        x += i
    return time.perf_counter() - t


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=100_000)
    parser.add_argument("--queued", type=int, default=2_000)
    parser.add_argument("--running", type=int, default=40)
    parser.add_argument("--teams", type=int, default=20)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--ab", action="store_true",
                        help="alternate rounds without and with migration 0034's indexes")
    parser.add_argument("--pages", default="", help="comma-separated page names to time")
    parser.add_argument("--skip-plan", action="store_true")
    parser.add_argument("--keep", action="store_true", help="keep the PostgreSQL database")
    parser.add_argument("--reuse", action="store_true", help="time a kept database again")
    parser.add_argument("--tag", default="", help="suffix of every BENCH name")
    parser.add_argument("--published-ab", action="store_true",
                        help="alternate rounds: `before` (requests plan the queue and refresh "
                             "the kept reads) and the cycle publishing both (`after`)")
    parser.add_argument("--dash-ab", action="store_true",
                        help="alternate rounds: `before` (every request unpickles the shared "
                             "usage series and reads the sessions' join) and the kept series "
                             "and owners-only sessions (`after`)")
    parser.add_argument("--running-ab", action="store_true",
                        help="alternate rounds: `before` (the running attempts' utilization "
                             "read by three subqueries) and one join (`after`)")
    parser.add_argument("--collector", action="store_true",
                        help="set up the collector as a web process does once the "
                             "application is loaded (queueing/web/collector.py); without "
                             "it, Python's defaults (the before side: alternate runs)")
    parser.add_argument("--cycle-seconds", type=float, default=3.0,
                        help="--published-ab: how often the emulated cycle publishes")
    args = parser.parse_args()

    vendor = setup_django(reuse=args.reuse)
    note(f"database: {vendor}")
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from queueing.models import Job
    from queueing.selectors import queue_plan as qp
    from queueing.web import views  # noqa: F401  (the application loaded, as in config/wsgi.py)
    from queueing.web.collector import collector_setup

    if args.collector:
        collector_setup()

    tag = args.tag
    now = timezone.now()
    if not args.reuse:
        build_world(jobs=args.jobs, queued=args.queued, running=args.running,
                    teams_n=args.teams, days=args.days, now=now)
    bench(f"pages_jobs_total{tag}", Job.objects.count(), "jobs")
    bench(f"pages_jobs_queued{tag}", Job.objects.filter(status="QUEUED").count(), "jobs")
    qp.QUEUE_PLAN_TTL = 24 * 3600.0  # the plan stays cached while the pages are timed
    if args.published_ab:
        ab = PublishedAB(tag)
        plan: Any = ab.plan_w
    else:
        plan = qp.queue_plan(now=timezone.now(), fresh=True)
    if not args.skip_plan and not args.published_ab:
        cold = []
        for _ in range(2):
            t = time.perf_counter()
            plan = qp.queue_plan(now=timezone.now(), fresh=True)
            cold.append((time.perf_counter() - t) * 1000)
        bench(f"queue_plan_cold_p50{tag}", statistics.median(cold), "ms")
        with CaptureQueriesContext(connection) as ctx:
            plan = qp.queue_plan(now=timezone.now(), fresh=True)
        bench(f"queue_plan_cold_queries{tag}", len(ctx.captured_queries), "count")
    note(f"queue plan: {plan.queued} queued jobs {plan.error}")

    users = get_user_model().objects
    member, staff = Client(), Client()
    member.force_login(users.get(username="viewer"))
    staff.force_login(users.get(username="root"))
    mine = Job.objects.filter(team__memberships__user__username="viewer")
    first_page = list(mine.order_by("-id").values_list("id", flat=True)[:50])
    queued_job = mine.filter(status="QUEUED").order_by("id").values_list("id", flat=True).first()
    done_job = mine.filter(status="PREEMPTED").order_by("-id").values_list("id", flat=True).first()
    pages: list[tuple[str, Any, str, dict[str, str]]] = [
        ("dashboard", member, "/", {}),
        ("dashboard_live", member, "/", {"HTTP_HX_REQUEST": "true"}),
        ("jobs", member, "/jobs/", {}),
        ("jobs_page2", member, f"/jobs/?before={first_page[-1]}", {}),
        ("jobs_filtered", member, "/jobs/?status=SUCCEEDED", {}),
        ("jobs_queued", member, "/jobs/?status=QUEUED", {}),
        ("job_detail", member, f"/jobs/{queued_job or first_page[0]}/", {}),
        ("job_detail_done", member, f"/jobs/{done_job or first_page[-1]}/", {}),
        ("reports", member, "/reports/", {}),
        ("reports_staff", staff, "/reports/", {}),
    ]
    if args.pages:
        wanted = set(args.pages.split(","))
        pages = [p for p in pages if p[0] in wanted]
    defs = page_indexes() if vendor == "postgresql" else []
    sides = ["noidx", ""] if args.ab and defs else [""]
    if args.published_ab or args.dash_ab or args.running_ab:
        sides, defs = ["before", ""], []
    if args.ab and not defs:
        note("no page indexes found (migration 0034): timing one side only")
    pooled: dict[tuple[str, str], list[float]] = {}
    queries: dict[tuple[str, str], int] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    note(f"calibration loop {calibration():.3f} s, load average {os.getloadavg()[0]:.1f}")
    for rnd in range(args.rounds):
        for side in sides:
            between = None
            if args.published_ab:
                between = ab.side(published=side == "", cycle_seconds=args.cycle_seconds)
            elif args.dash_ab:
                from queueing.selectors import dashboard as dash

                dash.SERIES_KEPT_PER_PROCESS = dash.SESSIONS_OF_OWNERS_ONLY = side == ""
            elif args.running_ab:
                from queueing.selectors import reports as rep

                rep.RUNNING_JOINED = side == ""
            elif len(sides) > 1:
                indexes_set(defs, on=side == "")
            for name, client, url, headers in pages:
                CPU_TIMES.clear()
                times, nq = time_page(client, url, args.requests, between, **headers)
                pooled.setdefault((name, side), []).extend(times)
                cpu.setdefault((name, side), []).extend(CPU_TIMES)
                queries[(name, side)] = nq
            note(f"round {rnd + 1} {side or 'indexed'}: load average {os.getloadavg()[0]:.1f}")
    if len(sides) > 1 and not args.published_ab:
        indexes_set(defs, on=True)
    if args.published_ab:
        ab.report()
    worst = 0.0
    for name, *_ in pages:
        for side in sides:
            times = pooled[(name, side)]
            sfx = f"_{side}" if side else ""
            bench(f"{name}_p50{sfx}{tag}", statistics.median(times), "ms")
            bench(f"{name}_p95{sfx}{tag}", p95(times), "ms")
            bench(f"{name}_cpu_p50{sfx}{tag}", statistics.median(cpu[(name, side)]), "ms")
            bench(f"{name}_cpu_p95{sfx}{tag}", p95(cpu[(name, side)]), "ms")
            if args.published_ab:  # the refreshes a request paid show in the tail
                bench(f"{name}_max{sfx}{tag}", max(times), "ms")
            bench(f"{name}_queries{sfx}{tag}", queries[(name, side)], "count")
            if not side:
                worst = max(worst, p95(times))
    note(f"calibration loop {calibration():.3f} s, load average {os.getloadavg()[0]:.1f} on "
         f"{os.cpu_count()} CPUs (other work on the machine inflates every number)")
    note(f"goal p95 < 150 ms for every page: {'met' if worst < 150.0 else 'NOT met'} "
         f"(worst {worst:.0f} ms)")
    if vendor == "postgresql" and not args.keep:
        drop_postgres(os.environ["DATABASE_URL"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
