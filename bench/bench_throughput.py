"""Sustained admissions with 50,000 pending (docs/performance.md, "A fleet of 5,000 nodes:
admissions per second").

The world: a simulated cluster (FAIRQ_SIM_NODES, default 5,000 nodes x 8 h100) whose
jobs run FAIRQ_SIM_DEFAULT_SECONDS (default 20 s: its 40,000 GPUs turn over 2,000
one-GPU jobs a second, so the cluster is not what limits the rate); 50,000 queued
one-GPU jobs of `--teams` teams (a quota each, borrowing up to the whole cluster), three
tiers, bulk inserted; all but `--free` GPUs running jobs whose workloads started evenly
over the last run time (so they end evenly: the cluster's steady state from the first
cycle). The bench's clock is the wall clock minus the time the world took to write.

Full mode: the real `scheduler_cycle` back to back while a submitter process keeps ~50,000
jobs pending (`jobs_submit_bulk` through the service, as pipelines submit, topping up
every 0.2 s). Steps 4 and 1 each have two paths (`queueing.services.scheduler._BATCHED`,
`_BATCHED_STATUSES`); `--paths` names the pairs alternated: `reference` (both one job
at a time), `admit` (step 4 batched, step 1 one job at a time), `floor` (both batched,
step 5 within its fixed floor: `_SUBMIT_SCALED` off), `scaled` and `batched` (both
batched, step 5's floor scaled to the admitted jobs waiting: the default; `batched`
also took step 1's wider floor in the runs of "Sustained admissions with step 5 scaled
to what was admitted", since dropped). After a warm-up (batched), windows of
`--window` seconds of each alternate in one run:
  BENCH thru_<path>_<k>_admitted_per_s   jobs admitted per second over window k
  BENCH thru_<path>_<k>_started_per_s    jobs seen running per second (submitted ones)
  BENCH thru_<path>_<k>_finished_per_s   jobs step 1 recorded as ended, per second
  BENCH thru_<path>_<k>_reconcile_left   status changes step 1 left to the next cycle
                                         (its budget spent), at the window's last cycle
  BENCH thru_<path>_<k>_submit_left      admitted jobs step 5 left to the next cycle, same
  BENCH thru_<path>_<k>_cpu              the cycles' process's CPU seconds over the window
                                         (and `_cpu_ms_per_admitted`)
  BENCH thru_<path>_<k>_cycle_p50        seconds per cycle, and per step (`_<step>_p50`)
  BENCH thru_<path>_<k>_pending_min      fewest jobs pending at a cycle of the window
then one cycle of each path under CaptureQueriesContext: per admitted job, the queries
of the apply and of the submit step (`thru_<path>_apply_queries_per_job`,
`_submit_queries_per_job`) and their milliseconds per job.

`--steps N...`: steps 4 and 5 alone, the two paths alternated: the first cycle's plan
cut to N admissions, applied and rolled back `--repeats` times per path
(`thru_apply_<n>_<path>_ms_per_job`, `_jobs_per_s`: the best run), then step 5's two
paths (`scheduler._BATCHED_SUBMIT`) alternated, `--repeats` times per N, each run on N
jobs of its own newly admitted (`thru_submit_<n>_<plain|batched>_ms_per_job`, its CPU
`_cpu_ms_per_job`, and the simulated cluster's own create apart:
`_sim_create_ms_per_job`): the plan must hold repeats x 2 x sum(N) admissions (`--free`).
`--submit-only` skips step 4's; `--publish ROUNDS`: what a cycle publishes after step 5
with the standings kept or read afresh (`scheduler._STANDINGS_KEPT`), alternated
(`publish_ab`); PROFILE=1 prints each run's profile (in full mode, the
profile of each window's cycles after the warm-up).

The calibration loop and the load average are printed first and last. Database:
$DATABASE_URL (PostgreSQL; its job tables are emptied). Run:
  DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db> \\
      .venv/bin/python bench/bench_throughput.py --steps 100 1000 5000 --free 6000
  ... bench/bench_throughput.py --warmup 30 --window 30 --rounds 2 [--paths reference,batched]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note  # noqa: E402  (bench/ is sys.path[0])
from bench_admission import calibrate, rss_mb  # noqa: E402

PENDING = 50_000
PROFILE = bool(os.environ.get("PROFILE"))
SENT = [0, 0]  # webhook messages, events in them
# Every pod has a memory limit (as the service gives a job at submit): a row without one
# would have its launch spec read the cluster view, which before the first cycle
# publishes it reads the simulated cluster at the wall clock's time.
MEMORY = 64 * 2**30
STEPS = ("reconcile", "snapshot", "decide", "apply", "submit", "submit_stop",
         "submit_create", "submit_publish")


def setup(*, nodes: str, seconds: float, migrate: bool) -> None:
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("bench_throughput needs DATABASE_URL=postgres://... (PostgreSQL)")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    from django.conf import settings

    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)
    settings.FAIRQ_SIM_NODES = nodes
    settings.FAIRQ_SIM_DEFAULT_SECONDS = seconds
    # The webhooks' one message per committed transaction is counted, not sent: the
    # test settings would run its task here, in the cycle's process (no team of the
    # bench has an endpoint; production sends it to the worker's queue).
    from queueing.services import webhooks

    def dispatch(event_ids: list[int]) -> None:
        SENT[0] += 1
        SENT[1] += len(event_ids)

    webhooks.webhooks_dispatch_soon = dispatch


def superuser() -> object:
    from django.contrib.auth import get_user_model

    user = get_user_model().objects.filter(username="bench").first()
    return user or get_user_model().objects.create_superuser("bench", "bench@example.com", "x")


def world(*, teams: int, gpus: int, running: int, seconds: float) -> datetime:
    """PENDING queued one-GPU jobs and `running` running ones whose workloads started
    evenly over the `seconds` before the time returned (so they end evenly over the
    `seconds` after it: the cluster is in its steady state from the first cycle, which
    runs at that time, not filled by one huge first admission)."""
    from django.db import connection
    from django.utils import timezone

    from accounts.models import Team
    from queueing.composition import get_backend
    from queueing.models import GpuType, Job, Quota, Tier
    from queueing.services.scheduler import launch_spec

    with connection.cursor() as cur:
        cur.execute("TRUNCATE queueing_jobevent, queueing_usagerecord, queueing_joblog, "
                    "queueing_job CASCADE")
    Quota.objects.all().delete()
    superuser()
    h100 = GpuType.objects.get_or_create(slug="h100", defaults={"name": "H100"})[0]
    tiers = [Tier.objects.update_or_create(slug=s, defaults={
        "name": s, "rank": r, "priority_class_name": f"fq-{s}", "priority_value": r,
        "open_to_all_teams": True})[0] for s, r in (("low", 0), ("normal", 100), ("high", 200))]
    rows = [Team.objects.get_or_create(slug=f"team-{k}", defaults={
        "name": f"Team {k}", "weight": 1.0})[0] for k in range(teams)]
    Quota.objects.bulk_create([Quota(team=t, gpu_type=h100, nominal=gpus // teams,
                                     borrowing_limit=gpus) for t in rows])
    rnd = random.Random(1)
    now = timezone.now()
    t = time.perf_counter()
    backend = get_backend()
    slots = [n.name for n in backend.nodes() for _ in range(n.capacity)]
    starts = [now - timedelta(seconds=seconds * (i + 0.5) / running) for i in range(running)]
    held = Job.objects.bulk_create([
        Job(team=rows[i % teams], name=f"r{i}", image="x", gpu_type=h100,
            gpus_per_replica=1, replicas=1, tier=tiers[2], status="RUNNING",
            memory_bytes=MEMORY,
            created_at=at - timedelta(minutes=5), updated_at=at, admitted_at=at,
            started_at=at, submitted_to_backend_at=at, placement=[slots[i]])
        for i, at in enumerate(starts)], batch_size=5000)
    at_of = {j.pk: j.started_at for j in held}
    # Set-up only: each planned node is known to have room, so the simulated cluster's
    # search of all its nodes per submit (its `_place`) is skipped here.
    backend._place = lambda spec: tuple(spec.placement)  # type: ignore[attr-defined]
    try:
        for job in Job.objects.filter(status="RUNNING").select_related(
                "team", "tier", "gpu_type").iterator(chunk_size=5000):
            backend.submit(launch_spec(job), now=at_of[job.pk])
    finally:
        del backend._place
    Job.objects.bulk_create([
        Job(team=rnd.choice(rows), name=f"q{i}", image="x", gpu_type=h100,
            gpus_per_replica=1, replicas=1, tier=rnd.choice(tiers), status="QUEUED",
            memory_bytes=MEMORY,
            created_at=now - timedelta(seconds=rnd.uniform(0, 3600)), updated_at=now)
        for i in range(PENDING)], batch_size=5000)
    with connection.cursor() as cur:
        cur.execute("VACUUM ANALYZE queueing_job")
    note(f"world: {PENDING} queued and {running} running one-GPU jobs of {teams} teams "
         f"written in {time.perf_counter() - t:.1f} s")
    return now


# The bench's clock: the wall clock minus the time the world took to write (`world`'s
# time is the first cycle's), for the cycles and the submitter alike.
OFFSET = timedelta(0)


def clock() -> datetime:
    from django.utils import timezone

    return timezone.now() - OFFSET


def pending() -> int:
    from queueing.models import Job

    return Job.objects.filter(status="QUEUED").count()


def submitter(*, teams: int, stop_file: Path) -> None:
    """Keep ~PENDING jobs queued: bulk submits through the service, until `stop_file`
    exists; prints how many it submitted and how long its submits took."""
    from queueing.services.jobs import job_input_build, jobs_submit_bulk

    user = superuser()
    rnd = random.Random(os.getpid())
    total, took, k = 0, [], 0
    while not stop_file.exists():
        missing = PENDING - pending()
        if missing < 200:
            time.sleep(0.2)
            continue
        k += 1
        count = min(missing, 2000)
        data = job_input_build(actor=user, team=f"team-{rnd.randrange(teams)}",
                               name=f"s{k}", image="x", gpu_type="h100", gpus=1,
                               tier=rnd.choice(("low", "normal", "high")))
        t = time.perf_counter()
        jobs_submit_bulk(actor=user, data=data, count=count, now=clock())
        took.append(time.perf_counter() - t)
        total += count
    print(f"submitted {total} jobs in {len(took)} bulk submits; p50 "
          f"{statistics.median(took) * 1000 if took else 0:.0f} ms, max "
          f"{max(took, default=0) * 1000:.0f} ms", flush=True)


# `--paths`: (step 4 batched, step 1 batched, step 5's floor scaled to the admitted jobs
# waiting, step 1's floor wide).
PATHS = {"reference": (False, False, False), "admit": (True, False, False),
         "floor": (True, True, False), "scaled": (True, True, True),
         "batched": (True, True, True)}


def set_path(path: str) -> None:
    from queueing.services import scheduler

    scheduler._BATCHED, scheduler._BATCHED_STATUSES, scheduler._SUBMIT_SCALED = PATHS[path]


def run_window(label: str, seconds: float) -> None:
    from queueing.services.scheduler import scheduler_cycle

    admitted = started = finished = cycles = left = submitted = submit_left = 0
    timings: dict[str, list[float]] = {s: [] for s in (*STEPS, "total")}
    low = PENDING * 10
    prof = None
    if PROFILE and label != "warmup":
        import cProfile

        prof = cProfile.Profile()
    t0, c0 = time.perf_counter(), time.process_time()
    while time.perf_counter() - t0 < seconds:
        if prof is not None:
            prof.enable()
        r = scheduler_cycle(now=clock())
        if prof is not None:
            prof.disable()
        cycles += 1
        admitted += len(r.admitted)
        started += len(r.started)
        submitted += len(r.submitted)
        finished += len(r.finished)
        left = r.deferred.get("reconcile", 0)
        submit_left = r.deferred.get("submit", 0)
        for s in timings:
            timings[s].append(r.timings.get(s, 0.0))
        if r.plan is not None:
            low = min(low, len(r.plan.waits) + len(r.plan.admissions))
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    if prof is not None:
        import pstats

        pstats.Stats(prof).sort_stats("cumulative").print_stats(60)
    bench(f"thru_{label}_admitted_per_s", admitted / took, "jobs/s")
    bench(f"thru_{label}_started_per_s", started / took, "jobs/s")
    bench(f"thru_{label}_finished_per_s", finished / took, "jobs/s")
    bench(f"thru_{label}_submitted_per_s", submitted / took, "jobs/s")
    bench(f"thru_{label}_reconcile_left", left, "changes")
    bench(f"thru_{label}_submit_left", submit_left, "jobs")
    # The cycles' process's CPU over the window (PostgreSQL's and the submitter's apart).
    bench(f"thru_{label}_cpu", cpu, "s")
    bench(f"thru_{label}_cpu_ms_per_admitted", cpu * 1000 / max(1, admitted), "ms")
    bench(f"thru_{label}_cycle_p50", statistics.median(timings["total"]), "s")
    for s in STEPS:
        bench(f"thru_{label}_{s}_p50", statistics.median(timings[s]), "s")
    bench(f"thru_{label}_pending_min", low, "jobs")
    note(f"{label}: {cycles} cycles in {took:.1f} s, {admitted} admitted, {started} started, "
         f"{finished} finished; "
         f"load average {os.getloadavg()[0]:.1f}")


def one_cycle_costs(label: str) -> None:
    """One cycle under CaptureQueriesContext: queries, events and time per admitted job
    in the apply and the submit step."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from queueing.models import JobEvent
    from queueing.services import scheduler

    marks: dict[str, tuple[int, int]] = {}
    real_apply, real_submit = scheduler.apply_plan, scheduler.submit_admitted

    def counted(name: str, fn: object) -> object:
        def wrapper(**kwargs: object) -> object:
            before = len(ctx.captured_queries)
            try:
                return fn(**kwargs)  # type: ignore[operator]
            finally:
                marks[name] = (before, len(ctx.captured_queries))
        return wrapper

    scheduler.apply_plan = counted("apply", real_apply)  # type: ignore[assignment]
    scheduler.submit_admitted = counted("submit", real_submit)  # type: ignore[assignment]
    events_before = JobEvent.objects.count()
    try:
        with CaptureQueriesContext(connection) as ctx:
            r = scheduler.scheduler_cycle(now=clock())
    finally:
        scheduler.apply_plan, scheduler.submit_admitted = real_apply, real_submit
    n = max(1, len(r.admitted))
    events = JobEvent.objects.count() - events_before
    apply_q = marks["apply"][1] - marks["apply"][0]
    submit_q = marks["submit"][1] - marks["submit"][0]
    note(f"{label}: one cycle admitted {len(r.admitted)}, started {len(r.started)}, "
         f"finished {len(r.finished)}; {len(ctx.captured_queries)} queries in all, "
         f"apply {apply_q}, submit {submit_q}; {events} events written")
    bench(f"thru_{label}_cycle_admitted", len(r.admitted), "jobs")
    bench(f"thru_{label}_apply_queries_per_job", apply_q / n, "queries")
    bench(f"thru_{label}_submit_queries_per_job", submit_q / n, "queries")
    bench(f"thru_{label}_apply_ms_per_job", r.timings["apply"] * 1000 / n, "ms")
    bench(f"thru_{label}_submit_ms_per_job", r.timings["submit"] * 1000 / n, "ms")
    # Step 5's creates per job it submitted (the line above divides the whole step, the
    # victims' stops and the publishing after it included, by the jobs admitted).
    bench(f"thru_{label}_cycle_submitted", len(r.submitted), "jobs")
    bench(f"thru_{label}_create_ms_per_submitted",
          r.timings["submit_create"] * 1000 / max(1, len(r.submitted)), "ms")
    for part in ("submit_stop", "submit_create", "submit_publish"):
        bench(f"thru_{label}_{part}", r.timings[part], "s")
    bench(f"thru_{label}_cycle_preempted", len(r.preempted), "jobs")
    bench(f"thru_{label}_cycle_events", events, "events")


def steps_ab(sizes: list[int], repeats: int, *, apply: bool = True) -> None:
    """Steps 4 and 5 alone, per admitted job, both paths alternated: the plan of the
    world's first cycle (what fits in the free GPUs) cut to `n` admissions, applied and
    rolled back `repeats` times per path (not with `apply` False); then step 5's two
    paths alternated (`submit_ab`)."""
    from django.db import transaction

    from queueing.composition import get_backend
    from queueing.policy.admission import Plan, plan_admissions
    from queueing.selectors.snapshot import build_snapshot
    from queueing.services import scheduler

    backend = get_backend()
    now = clock()
    snap = build_snapshot(backend=backend, now=now)
    full = plan_admissions(snap)
    note(f"plan of the first cycle: {len(full.admissions)} admissions")
    for n in sizes if apply else ():
        plan = Plan(admissions=full.admissions[:n], waits={})
        took: dict[str, list[float]] = {"reference": [], "batched": []}
        for _ in range(repeats):
            for path in ("reference", "batched"):
                set_path(path)
                with transaction.atomic():
                    t = time.perf_counter()
                    got = scheduler.apply_plan(plan=plan, now=now, nodes=snap.nodes)
                    took[path].append(time.perf_counter() - t)
                    assert len(got) == n, (len(got), n)
                    transaction.set_rollback(True)
        for path, times in took.items():
            best = min(times)
            bench(f"thru_apply_{n}_{path}_ms_per_job", best * 1000 / n, "ms")
            bench(f"thru_apply_{n}_{path}_jobs_per_s", n / best, "jobs/s")
        note(f"apply {n}: " + "; ".join(f"{p} " + ", ".join(f"{x:.2f}" for x in v) + " s"
                                        for p, v in took.items()))
    submit_ab(backend, full, snap.nodes, sizes, repeats, start=0)


def submit_ab(backend: object, full: object, nodes: object, sizes: list[int], repeats: int,
              *, start: int) -> None:
    """Step 5 alone, its two paths alternated (`scheduler._BATCHED_SUBMIT`): per size and
    repeat, the next `n` admissions of the first cycle's plan admitted (batched,
    committed) and submitted to the simulated cluster (`submit_admitted`, no budget);
    wall and CPU (this process's) per job, the simulated cluster's own create apart.
    Each run submits jobs of its own, so the plan needs repeats x 2 x sum(sizes)
    admissions (`--free`)."""
    import cProfile
    import pstats

    from django.db import transaction

    from queueing.models import Job
    from queueing.policy.admission import Plan
    from queueing.services import scheduler

    real_submit, spent = backend.submit, [0.0]  # type: ignore[attr-defined]

    def timed(spec: object, *, now: object) -> None:
        t = time.perf_counter()
        try:
            real_submit(spec, now=now)
        finally:
            spent[0] += time.perf_counter() - t

    admissions = full.admissions  # type: ignore[attr-defined]
    paths = {"plain": False, "batched": True}
    got: dict[tuple[int, str], list[tuple[float, float, float]]] = {}
    now = clock()
    for r in range(repeats):
        for n in sizes:
            order = list(paths) if r % 2 == 0 else list(reversed(paths))
            for path in order:
                if start + n > len(admissions):
                    sys.exit(f"the plan has {len(admissions)} admissions: raise --free")
                set_path("batched")
                with transaction.atomic():
                    scheduler.apply_plan(plan=Plan(admissions=admissions[start:start + n],
                                                   waits={}), now=now, nodes=nodes)
                start += n
                scheduler._BATCHED_SUBMIT = paths[path]
                spent[0] = 0.0
                backend.submit = timed  # type: ignore[attr-defined]
                prof = cProfile.Profile() if PROFILE else None
                try:
                    w, c = time.perf_counter(), time.process_time()
                    if prof:
                        prof.enable()
                    result = scheduler.CycleResult()
                    scheduler.submit_admitted(backend=backend, now=now, result=result)
                    if prof:
                        prof.disable()
                    w, c = time.perf_counter() - w, time.process_time() - c
                finally:
                    del backend.submit  # type: ignore[attr-defined]
                    scheduler._BATCHED_SUBMIT = True
                left = Job.objects.filter(status="ADMITTED",
                                          submitted_to_backend_at__isnull=True).count()
                assert len(result.submitted) == n and not left, (len(result.submitted), left)
                got.setdefault((n, path), []).append((w, c, spent[0]))
                note(f"submit {n} {path}: {w:.2f} s wall, {c:.2f} s CPU, of which the "
                     f"simulated cluster's create {spent[0]:.2f} s; load average "
                     f"{os.getloadavg()[0]:.1f}")
                if prof:
                    pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    for (n, path), runs in got.items():
        w, c, sim = min(runs)
        bench(f"thru_submit_{n}_{path}_ms_per_job", w * 1000 / n, "ms")
        bench(f"thru_submit_{n}_{path}_cpu_ms_per_job", min(x[1] for x in runs) * 1000 / n,
              "ms")
        bench(f"thru_submit_{n}_{path}_sim_create_ms_per_job", sim * 1000 / n, "ms")
        bench(f"thru_submit_{n}_{path}_jobs_per_s", n / w, "jobs/s")


def publish_ab(rounds: int) -> None:
    """What a cycle publishes after step 5 (`page_reads_publish`), the standings kept
    (`scheduler._STANDINGS_KEPT`) against read afresh, one real cycle of each per round,
    in alternating order, after one warm-up cycle of each (the world drains: no
    submitter). The kept path reads the rows steps 4 and 5 wrote (the active jobs'
    refresh), which the next cycle's first refresh then does not read: that refresh is
    counted with the cycle before it. Per path the p50 of the rounds:
      thru_publish_<kept|fresh>_cpu_p50         CPU seconds of the publish (this thread)
      thru_publish_<kept|fresh>_wall_p50        its wall seconds
      thru_publish_<kept|fresh>_standings_cpu_p50  ... of the standings in it (the
                                                refresh apart)
      thru_publish_<kept|fresh>_refresh_cpu_p50 CPU seconds of the refresh in it (kept)
      thru_publish_<kept|fresh>_next_cpu_p50    CPU seconds of the next cycle's first
                                                refresh (the rows left to it)
      thru_publish_<kept|fresh>_sum_cpu_p50     the publish and that refresh together"""
    from queueing.selectors import dashboard
    from queueing.services import scheduler

    real, real_jobs = scheduler.page_reads_publish, scheduler.cycle_active_jobs
    real_standings = (scheduler.fairshare_standings, dashboard.fairshare_standings)
    took: list[tuple[float, float]] = []
    refreshes: list[float] = []
    standings: list[float] = []

    def standings_timed(**kw: object) -> object:
        c = time.thread_time()
        try:
            return real_standings[0](**kw)  # type: ignore[arg-type]
        finally:
            standings.append(time.thread_time() - c)

    def timed(**kw: object) -> bool:
        c, w = time.thread_time(), time.perf_counter()
        try:
            return real(**kw)  # type: ignore[arg-type]
        finally:
            took.append((time.thread_time() - c, time.perf_counter() - w))

    def jobs_timed(**kw: object) -> object:
        c = time.thread_time()
        try:
            return real_jobs(**kw)  # type: ignore[arg-type]
        finally:
            refreshes.append(time.thread_time() - c)

    scheduler.page_reads_publish = timed  # type: ignore[assignment]
    scheduler.cycle_active_jobs = jobs_timed  # type: ignore[assignment]
    scheduler.fairshare_standings = standings_timed  # type: ignore[assignment]
    dashboard.fairshare_standings = standings_timed  # type: ignore[assignment]
    keys = ("cpu", "wall", "standings_cpu", "refresh_cpu", "next_cpu", "sum_cpu", "admitted")
    out: dict[str, dict[str, list[float]]] = {p: {k: [] for k in keys}
                                              for p in ("kept", "fresh")}
    last: tuple[str, dict[str, float], int] | None = None
    try:
        for k in range(-1, rounds + 1):
            order = ["kept", "fresh"] if k % 2 == 0 else ["fresh", "kept"]
            for path in order:
                scheduler._STANDINGS_KEPT = path == "kept"
                took.clear()
                refreshes.clear()
                standings.clear()
                r = scheduler.scheduler_cycle(now=clock())
                if last is not None:  # this cycle's first refresh: the one before's rows
                    prev, done, prev_k = last
                    done["next_cpu"] = refreshes[0]
                    done["sum_cpu"] = done["cpu"] + refreshes[0]
                    note(f"  next refresh {refreshes[0]:.3f} s CPU")
                    if prev_k >= 0:  # not a warm-up cycle's
                        for key in keys:
                            out[prev][key].append(done[key])
                if k == rounds:
                    break
                cur = {"cpu": took[0][0], "wall": took[0][1], "admitted": len(r.admitted),
                       "standings_cpu": sum(standings),
                       "refresh_cpu": refreshes[2] if len(refreshes) > 2 else 0.0}
                last = (path, cur, k)
                note(f"round {k} {path}: admitted {len(r.admitted)}, publish "
                     f"{cur['cpu']:.3f} s CPU (standings {cur['standings_cpu']:.3f}, "
                     f"refresh {cur['refresh_cpu']:.3f}), "
                     f"{cur['wall']:.3f} s wall; cycle {r.timings['total']:.2f} s wall; "
                     f"load {os.getloadavg()[0]:.1f}")
    finally:
        scheduler.page_reads_publish = real  # type: ignore[assignment]
        scheduler.cycle_active_jobs = real_jobs  # type: ignore[assignment]
        scheduler.fairshare_standings, dashboard.fairshare_standings = real_standings
        scheduler._STANDINGS_KEPT = True
    for path, got in out.items():
        for key in keys[:-1]:
            bench(f"thru_publish_{path}_{key}_p50", statistics.median(got[key]), "s")
        bench(f"thru_publish_{path}_admitted_p50", statistics.median(got["admitted"]), "jobs")
        bench(f"thru_publish_{path}_cycles", len(got["cpu"]), "cycles")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="5000x8xh100")
    ap.add_argument("--seconds", type=float, default=20.0,
                    help="each job's run time on the simulated cluster (wall seconds)")
    ap.add_argument("--teams", type=int, default=200)
    ap.add_argument("--free", type=int, default=2000,
                    help="GPUs free at the start (the rest run jobs ending evenly)")
    ap.add_argument("--warmup", type=float, default=30.0)
    ap.add_argument("--window", type=float, default=30.0)
    ap.add_argument("--rounds", type=int, default=2,
                    help="rounds of windows (one per path of --paths) after the warm-up")
    ap.add_argument("--paths", default="admit,batched")
    ap.add_argument("--steps", type=int, nargs="*", default=None,
                    help="only steps 4 and 5, per job, for these numbers of admissions")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--submit-only", action="store_true",
                    help="with --steps: step 5 alone (its two paths), not step 4")
    ap.add_argument("--publish", type=int, default=0, metavar="ROUNDS",
                    help="only what a cycle publishes after step 5, standings kept or "
                         "read afresh, alternated over ROUNDS rounds of one cycle each")
    ap.add_argument("--submitter", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--stop-file", default="", help=argparse.SUPPRESS)
    ap.add_argument("--offset", type=float, default=0.0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    setup(nodes=args.nodes, seconds=args.seconds, migrate=not args.submitter)
    global OFFSET
    OFFSET = timedelta(seconds=args.offset)
    if args.submitter:
        submitter(teams=args.teams, stop_file=Path(args.stop_file))
        return
    calibrate()
    from queueing.backends.simulated import parse_node_spec
    from queueing.composition import reset_backends

    reset_backends()
    gpus = sum(p.count * p.gpus for p in parse_node_spec(args.nodes))
    start = world(teams=args.teams, gpus=gpus, running=max(0, gpus - args.free),
                  seconds=args.seconds)
    from django.utils import timezone

    OFFSET = timezone.now() - start
    if args.publish:
        publish_ab(args.publish)
        calibrate()
        return
    if args.steps:
        steps_ab(args.steps, args.repeats, apply=not args.submit_only)
        calibrate()
        return
    note(f"cluster {args.nodes} ({gpus} GPUs), jobs run {args.seconds:.0f} s; "
         f"{PENDING} pending kept by a submitter process")
    stop = Path(f"/tmp/bench_throughput_stop_{os.getpid()}")
    stop.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, __file__, "--submitter", "--stop-file", str(stop),
         "--teams", str(args.teams), "--nodes", args.nodes,
         "--offset", str(OFFSET.total_seconds())], stdout=subprocess.PIPE, text=True)
    try:
        paths = args.paths.split(",")
        set_path("batched")
        run_window("warmup", args.warmup)
        for k in range(args.rounds):
            for path in paths:
                set_path(path)
                run_window(f"{path}_{k}", args.window)
        for path in paths:
            set_path(path)
            one_cycle_costs(path)
    finally:
        stop.touch()
        out, _ = proc.communicate(timeout=120)
        stop.unlink(missing_ok=True)
        note(f"submitter: {out.strip()}")
        set_path("batched")
    bench("thru_rss", rss_mb(), "MB")
    calibrate()


if __name__ == "__main__":
    main()
