"""A fleet of 5,000 nodes: the full cycle on PostgreSQL (docs/performance.md, "A fleet
of 5,000 nodes: the cycle on PostgreSQL").

The real `scheduler_cycle` (reconcile -> snapshot -> plan -> apply -> submit) on
bench_fleet.py's world written as rows: 1,110 teams in the tree with their quota rows,
the 150,000 running jobs (13,676 of whole GPUs on `h100`, `a100`, `l40s`, the rest
fractions of 1-2 slices on `a10`, time-sliced 16 ways: rule H1) placed on a simulated
cluster of the 5,000 nodes, and N queued. Preemption is off (FAIRQ_PREEMPTION_ENABLED:
with it on one pass over this world does not finish in minutes, bench_fleet.py).

The worker is a process of its own (`--worker N`): it fills its simulated cluster
with the running rows' workloads, runs one first cycle (an empty `ActiveJobs`: a full
read) and one more (what the first admitted gets submitted), then `--cycles` steady
cycles with churn before each: 5 submits, a cancel, and about 30 running jobs whose
workload ends (their FAIRQ_SIM_SECONDS run out; the cycles run on the real clock).
A second process submits jobs through
`services.jobs.job_submit` all along (4 a second); each submit counts as "during a
cycle" when it overlaps one.
  BENCH fleet_cycle_<n>_write          seconds to write the rows (COPY)
  BENCH fleet_cycle_<n>_first          seconds of the first cycle (a full read)
  BENCH fleet_cycle_<n>_<step>_p50/_p99  per steady cycle: total, reconcile, snapshot,
                                       decide (the pure pass), apply, submit
  BENCH fleet_cycle_<n>_peak_rss       the worker's peak RSS (MB, getrusage)
  BENCH fleet_cycle_<n>_submit_p99_idle / _busy  submit latency p99 (ms) outside and
                                       during cycles
  BENCH fleet_cycle_<n>_submit_<idle|busy>_<part>_mean  a submit's wall time, on a CPU,
                                       waiting for one, the rest (ms; /proc schedstat of
                                       the probe and its PostgreSQL backend)
  BENCH fleet_cycle_<n>_first_peak_rss / _after_first_rss / _end_rss  RSS (MB)
`--detail` also says how far each part of the first cycle raised the peak RSS.
`--reuse` runs on the rows already written (one size); `--plain-rows` reads them as the
driver gives them (`active_jobs.COMPACT_ROWS` off). `--read-memory K`: no cycle, K plain
and K compact full reads alternated, each in a process of its own
(BENCH fleet_read_<plain|compact>_<kept_rss|peak_rss|read_cpu|cpu|...>; docs/performance.md,
"Memory at 1,000,000 queued, and submits during cycles").
`--profile` runs one more steady cycle under cProfile (top 25 by cumulative time,
stderr). `--legacy` runs the worker's cycles on the paths before this bench's work
(`queueing.selectors.active_jobs.LEGACY`, `queueing.backends.simulated.KEEP_STATUSES`):
with `--alternate` the steady cycles take the paths before and after in turn, in one
worker, on the same rows (the collector's freeze after a cycle, `scheduler.GC_FREEZE`,
on for both: `--legacy` alone turns it off too, `--gc-off` only it).

Database: $DATABASE_URL (PostgreSQL; its job tables emptied first). The machine is
shared: read the figures beside calibration_1M_loop and the load average.
Run: `.venv/bin/python bench/bench_fleet_cycle.py --sizes 100000 250000 1000000`.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note, setup_django_sqlite  # noqa: E402  (bench/ is sys.path[0])
from bench_admission import NOW, calibrate, rss_mb  # noqa: E402
from bench_fleet import NODES_PER_TYPE, SLICED, SLICES, WHOLE, snapshot  # noqa: E402

TYPES = (*WHOLE, SLICED)
# The cycles run on the real clock (a cycle's `now` is when it starts: the cluster view
# a submit reads before the first publish asks the simulated cluster at the real time,
# so a clock of its own would jump). From ENDS_AFTER seconds after the cluster is filled,
# one running job in ENDS_EVERY ends, ENDS_PER_STEP of them every ENDS_STEP seconds.
ENDS_AFTER, ENDS_EVERY, ENDS_STEP, ENDS_PER_STEP = 90, 200, 3, 3


def setup(migrate: bool = True) -> None:
    if not os.environ.get("DATABASE_URL", "").startswith("postgres"):
        sys.exit("bench_fleet_cycle: set DATABASE_URL to a PostgreSQL database")
    if migrate:
        setup_django_sqlite("bench_fleet_cycle")
    else:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
        import django

        django.setup()
    from django.conf import settings

    settings.FAIRQ_SIM_NODES = ",".join(f"{NODES_PER_TYPE}x8x{t}" for t in TYPES)
    settings.FAIRQ_SIM_DEFAULT_SECONDS = 10 * 86400
    settings.FAIRQ_PREEMPTION_ENABLED = False
    settings.FAIRQ_CYCLE_BUDGET_SECONDS = 600  # steps 1 and 5 whole: the cost, not the budget
    # A worker sends its tasks (webhooks, log keeping) to the broker; the test settings'
    # eager mode would run them inside the cycle.
    from config.celery import app

    app.conf.task_always_eager = False
    import logging

    logging.getLogger("celery").setLevel(logging.WARNING)


PARTS: dict[str, float] = {}
# With --detail: per part, how far it raised the worker's peak RSS (MB) and the RSS at
# its end (MB), the first cycle's (where the peak is reached).
PEAKS: dict[str, float] = {}


def rss_now_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def time_parts() -> None:
    """Wall time per part of the cycle (a wrapper around each, no profiler) and the
    garbage collector's, summed per cycle into PARTS."""
    import functools
    import gc

    from queueing.backends import simulated
    from queueing.selectors import snapshot
    from queueing.services import scheduler

    def wrap(mod: object, name: str, label: str) -> None:
        real = getattr(mod, name)

        @functools.wraps(real)
        def timed(*a: object, **kw: object) -> object:
            t = time.perf_counter()
            peak = rss_mb()
            try:
                return real(*a, **kw)
            finally:
                PARTS[label] = PARTS.get(label, 0.0) + time.perf_counter() - t
                PEAKS[label] = PEAKS.get(label, 0.0) + rss_mb() - peak
                PEAKS[f"{label}@end"] = rss_now_mb()
        setattr(mod, name, timed)

    for mod, names in ((scheduler, ("_clean_statuses", "spot_reclaimed_requeue",
                                    "session_addresses_record", "stopped_logs_keep_again",
                                    "clusters_record", "clusters_drain", "_utilization",
                                    "arrays_top_up", "cluster_view_publish",
                                    "submit_admitted", "cycle_active_jobs",
                                    "unprovisioned_teams", "queue_plan_forget", "queue_plan_publish",
                                    "_unowned_stop", "apply_plan", "reconcile",
                                    "build_snapshot", "plan_admissions")),
                       (snapshot, ("policy_jobs", "packed_gpus", "fairshare_standings",
                                   "nominations", "snapshot_bookings", "dependency_counts",
                                   "array_limits", "team_parents", "flavor_fallbacks",
                                   "preemption_settings", "policy_settings")),
                       (simulated.SimulatedCluster, ("statuses", "nodes"))):
        for name in names:
            if hasattr(mod, name):
                wrap(mod, name, name)
    started: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[:] = [time.perf_counter()]
        elif started:
            key = f"gc{info['generation']}"
            PARTS[key] = PARTS.get(key, 0.0) + time.perf_counter() - started[0]
    gc.callbacks.append(on_gc)


def sim_node(name: str) -> str:
    """bench_fleet's node name ("h100-0007") as the simulated cluster names it."""
    t, _, i = name.rpartition("-")
    return f"sim-{t}-{int(i):03d}"


def world(n: int, start: object) -> None:
    """Write the rows (COPY into a scratch table, then one INSERT from a template row)."""
    from django.db import connection

    from accounts.models import Team
    from queueing.models import GpuType, Job, JobEvent, Quota, Tier, UsageRecord

    snap = snapshot(n)
    shift = start - NOW  # type: ignore[operator]
    with connection.cursor() as cur:
        cur.execute("TRUNCATE queueing_jobevent, queueing_usagerecord, queueing_job CASCADE")
    JobEvent.objects.all().delete()
    UsageRecord.objects.all().delete()
    Quota.objects.all().delete()
    gpu = {}
    for t in TYPES:
        sliced = t == SLICED
        gpu[t] = GpuType.objects.update_or_create(slug=t, defaults={
            "name": t, "sharing": "time-sliced" if sliced else "exclusive",
            "slices_per_gpu": SLICES if sliced else 1,
            "billing_weight": snap.billing_weights[t]})[0]
    tiers = {r: Tier.objects.update_or_create(slug=f"t{r}", defaults={
        "name": f"t{r}", "rank": r, "priority_class_name": f"fq-t{r}", "priority_value": r,
        "open_to_all_teams": True})[0] for r in (0, 100, 200)}
    teams: dict[str, Team] = {}
    for slug, parent in snap.team_parent.items():  # parents come before their children
        teams[slug] = Team.objects.update_or_create(slug=slug, defaults={
            "name": slug, "parent": teams[parent] if parent else None})[0]

    def devices(units: int | None, t: str) -> int | None:  # rule H4: rows in GPUs
        return None if units is None else (max(1, round(units / SLICES)) if t == SLICED
                                           else units)

    Quota.objects.bulk_create([
        Quota(team=teams[k], gpu_type=gpu[t], nominal=devices(q.nominal, t) or 0,
              borrowing_limit=devices(q.borrowing_limit, t),
              lending_limit=devices(q.lending_limit, t))
        for (k, t), q in snap.quotas.items()])
    template = Job.objects.create(team=teams[snap.running[0].team], name="template",
                                  image="x", gpu_type=gpu[WHOLE[0]], gpus_per_replica=1,
                                  tier=tiers[0], status="QUEUED", created_at=start)
    t = time.perf_counter()
    cols = ["name", "team_id", "gpu_type_id", "tier_id", "gpus_per_replica", "replicas",
            "created_at", "updated_at", "status", "gpu_slices", "placement", "gpu_slots",
            "admitted_at", "started_at", "submitted_to_backend_at"]

    def rows():
        for r in snap.running:
            at = (r.started_at + shift).isoformat()
            sliced = r.gpu_type == SLICED
            yield (f"r{r.id}", teams[r.team].pk, gpu[r.gpu_type].pk, tiers[r.tier_rank].pk,
                   1 if sliced else r.gpus_per_replica, 1, at, at, "RUNNING",
                   r.gpus_per_replica if sliced else 0,
                   json.dumps([sim_node(r.nodes[0])]), json.dumps(list(r.gpu_slots)),
                   at, at, at)
        for q in snap.queued:
            at = (q.submitted_at + shift).isoformat()
            sliced = q.gpu_type == SLICED
            fraction = sliced and q.gpus_per_replica < SLICES
            yield (f"q{q.id}", teams[q.team].pk, gpu[q.gpu_type].pk, tiers[q.tier_rank].pk,
                   1 if sliced else q.gpus_per_replica, q.replicas, at, at, "QUEUED",
                   q.gpus_per_replica if fraction else 0, "[]", "[]", None, None, None)

    fields = [f.column for f in Job._meta.concrete_fields if f.column != "id"]
    with connection.cursor() as cur:
        cur.execute("CREATE TEMP TABLE w (name text, team_id bigint, gpu_type_id bigint, "
                    "tier_id bigint, gpus_per_replica int, replicas int, "
                    "created_at timestamptz, updated_at timestamptz, status text, "
                    "gpu_slices int, placement jsonb, gpu_slots jsonb, "
                    "admitted_at timestamptz, started_at timestamptz, "
                    "submitted_to_backend_at timestamptz)")
        with cur.cursor.copy(f"COPY w ({', '.join(cols)}) FROM STDIN") as cp:
            for row in rows():
                cp.write_row(row)
        pick = ", ".join(f"w.{c}" if c in cols else f"t.{c}" for c in fields)
        cur.execute(f"INSERT INTO queueing_job ({', '.join(fields)}) SELECT {pick} "
                    "FROM w CROSS JOIN (SELECT * FROM queueing_job WHERE id = %s) t",
                    [template.pk])
        cur.execute("DROP TABLE w")
        cur.execute("DELETE FROM queueing_job WHERE id = %s", [template.pk])
        cur.execute("VACUUM ANALYZE queueing_job")
    bench(f"fleet_cycle_{n // 1000}k_write", time.perf_counter() - t, "s")
    note(f"{n} queued: {len(snap.running)} running, {len(teams)} teams")


def fill_cluster(filled: object) -> None:
    """The worker's simulated cluster runs the running rows' workloads; some of them end
    from ENDS_AFTER seconds after `filled` on (their FAIRQ_SIM_SECONDS)."""
    from queueing.backends.base import LaunchSpec, workload_name
    from queueing.composition import get_backend
    from queueing.models import GpuType, Job

    backend = get_backend()
    types = {g.pk: g for g in GpuType.objects.all()}
    rows = Job.objects.filter(status="RUNNING").order_by("id").values_list(
        "id", "gpu_type_id", "gpus_per_replica", "gpu_slices", "placement", "gpu_slots",
        "started_at")
    for k, (pk, type_id, gpus, slices, placement, slots, started) in enumerate(rows):
        g = types[type_id]
        env = {}
        if k % ENDS_EVERY == 0:
            ends = filled + timedelta(seconds=ENDS_AFTER + ENDS_STEP * (
                k // ENDS_EVERY // ENDS_PER_STEP))
            env["FAIRQ_SIM_SECONDS"] = str(int((ends - started).total_seconds()))
        backend.submit(LaunchSpec(
            name=workload_name(pk, 1), job_id=pk, attempt=1, team="t", tier="t",
            priority_class_name="p", gpu_type=g.slug, resource_name=g.resource_name,
            node_labels={}, gpus_per_replica=gpus, replicas=1, image="x", command=[],
            args=[], env=env, max_runtime_seconds=None, placement=tuple(placement),
            units_per_replica=slices or gpus * g.units_per_device, gpu_slots=tuple(slots),
            sharing=g.sharing, slices_per_gpu=g.slices_per_gpu, gpu_slices=slices),
            now=started)


def p99(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(0.99 * len(s)))] if s else float("nan")


def churn(rnd: random.Random, user: object, now: object) -> None:
    """Between cycles: 5 submits and a cancel (the cycles' own clock makes jobs end)."""
    from queueing.models import Job
    from queueing.services.jobs import job_cancel, job_input_build, job_submit

    for _ in range(5):
        data = job_input_build(actor=user, team=user.bench_team, name="churn", image="x",  # type: ignore[attr-defined]
                               gpu_type=rnd.choice(WHOLE), gpus=rnd.choice((1, 2)),
                               tier="t100")
        job_submit(actor=user, data=data, now=now)  # type: ignore[arg-type]
    victim = Job.objects.filter(status="QUEUED").order_by("?").first()
    if victim is not None:
        job_cancel(actor=user, job=victim)


def bench_user() -> object:
    from django.contrib.auth import get_user_model

    from accounts.models import Membership, Role, Team

    team = Team.objects.filter(parent__parent__isnull=False).order_by("slug").first()
    user, _ = get_user_model().objects.get_or_create(username="bench-fleet", defaults={
        "is_staff": True, "is_superuser": True})
    Membership.objects.get_or_create(user=user, team=team, defaults={"role": Role.TEAM_ADMIN})
    user.bench_team = team.slug  # type: ignore[attr-defined]
    return user


def submitter(seconds: float, rate: float) -> None:
    """Submit `rate` jobs a second for `seconds`; print [start, end] of each, a line each."""
    setup(migrate=False)
    from django.db import connection
    from django.utils import timezone

    from queueing.services.jobs import job_input_build, job_submit

    user = bench_user()
    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        server = f"/proc/{cur.fetchone()[0]}/schedstat"

    def sched() -> list[float]:
        """Seconds on a CPU and waiting for one (the run queue), of this process and of
        its PostgreSQL backend (/proc/<pid>/schedstat; 0 where it cannot be read)."""
        out = []
        for path in ("/proc/self/schedstat", server):
            try:
                with open(path) as f:
                    out += [int(x) / 1e9 for x in f.read().split()[:2]]
            except OSError:
                out += [0.0, 0.0]
        return out

    stop = time.time() + seconds
    while time.time() < stop:
        t0, s0 = time.time(), sched()
        data = job_input_build(actor=user, team=user.bench_team, name="probe", image="x",  # type: ignore[attr-defined]
                               gpu_type="h100", gpus=1, tier="t100")
        job_submit(actor=user, data=data, now=timezone.now())  # type: ignore[arg-type]
        t1, s1 = time.time(), sched()
        print(json.dumps([t0, t1, *(b - a for a, b in zip(s0, s1, strict=True))]), flush=True)
        time.sleep(max(0.0, 1 / rate - (t1 - t0)))


def worker(n: int, cycles: int, profile: bool, legacy: bool, start_iso: str,
           detail: bool, alternate: bool, gc_off: bool, plain_rows: bool = False) -> None:
    setup(migrate=False)
    from django.utils import timezone

    from queueing.backends import simulated
    from queueing.selectors import active_jobs
    from queueing.services import scheduler

    def paths(old: bool) -> None:  # the paths before this bench's work, or after
        active_jobs.LEGACY = old
        simulated.KEEP_STATUSES = not old

    paths(legacy)
    active_jobs.COMPACT_ROWS = not plain_rows
    scheduler.GC_FREEZE = not (gc_off or (legacy and not alternate))
    from queueing.services.scheduler import scheduler_cycle

    size = k = f"{n // 1000}k"
    t = time.perf_counter()
    fill_cluster(timezone.now())
    note(f"{k}: cluster filled in {time.perf_counter() - t:.1f} s, RSS {rss_now_mb():.0f} MB")
    user = bench_user()
    probe = subprocess.Popen([sys.executable, __file__, "--submitter", "36000"],
                             stdout=subprocess.PIPE, text=True)
    rnd = random.Random(7)
    now = timezone.now()
    if detail:
        time_parts()
    t = time.perf_counter()
    first = scheduler_cycle(now=now)
    bench(f"fleet_cycle_{size}_first", time.perf_counter() - t, "s")
    note(f"{k}: first cycle {first.timings} admitted {len(first.admitted)}")
    bench(f"fleet_cycle_{size}_first_peak_rss", rss_mb(), "MB")
    bench(f"fleet_cycle_{size}_after_first_rss", rss_now_mb(), "MB")
    if detail:
        note("  peak raised by (MB): " + ", ".join(
            f"{key} {v:.0f}" for key, v in sorted(PEAKS.items(), key=lambda kv: -kv[1])
            if "@" not in key and v >= 1))
        note("  RSS at the end (MB): " + ", ".join(
            f"{key[:-4]} {v:.0f}" for key, v in PEAKS.items() if "@" in key))
    PEAKS.clear()
    note("  parts: " + ", ".join(f"{key} {v:.2f}" for key, v in
                                 sorted(PARTS.items(), key=lambda kv: -kv[1]) if v >= 0.01))
    PARTS.clear()
    now = timezone.now()
    second = scheduler_cycle(now=now)
    note(f"{k}: second cycle {second.timings} started {len(second.started)}")
    note("  parts: " + ", ".join(f"{key} {v:.2f}" for key, v in
                                 sorted(PARTS.items(), key=lambda kv: -kv[1]) if v >= 0.01))
    steady = time.time()
    steps: dict[str, dict[str, list[float]]] = {}
    spans: list[tuple[float, float]] = []
    k = size
    for i in range(cycles):
        now = timezone.now()
        churn(rnd, user, now)
        time.sleep(2.0)  # idle time for the submit probe
        if alternate:  # the paths before and after, in turn, on the same rows
            paths(i % 2 == 0)
        k = size + ("_legacy" if active_jobs.LEGACY else "")
        PARTS.clear()
        a = time.time()
        r = scheduler_cycle(now=now)
        spans.append((a, time.time()))
        for key, v in r.timings.items():
            steps.setdefault(k, {}).setdefault(key, []).append(v)
        note(f"{k}: cycle {i}: " + " ".join(f"{key} {v:.2f}" for key, v in r.timings.items())
             + f"; admitted {len(r.admitted)} started {len(r.started)} finished "
             f"{len(r.finished)}")
        if detail:
            note("  parts: " + ", ".join(f"{key} {v:.2f}" for key, v in
                                         sorted(PARTS.items(), key=lambda kv: -kv[1])
                                         if v >= 0.01))
    time.sleep(1.0)
    for k, by_step in sorted(steps.items()):
        for key in ("total", "reconcile", "snapshot", "decide", "apply", "submit"):
            bench(f"fleet_cycle_{k}_{key}_p50", statistics.median(by_step[key]), "s")
            bench(f"fleet_cycle_{k}_{key}_p99", p99(by_step[key]), "s")
    k = size
    bench(f"fleet_cycle_{k}_peak_rss", rss_mb(), "MB")
    bench(f"fleet_cycle_{k}_end_rss", rss_now_mb(), "MB")
    probe.terminate()
    out, _ = probe.communicate()
    idle: list[list[float]] = []
    busy: list[list[float]] = []
    for line in out.splitlines():
        a, b, *cpu = json.loads(line)
        if a >= steady:  # from the steady cycles on
            (busy if any(a < e and b > s for s, e in spans) else idle).append([b - a, *cpu])
    for tag, xs in (("idle", idle), ("busy", busy)):
        if not xs:
            continue
        bench(f"fleet_cycle_{k}_submit_p99_{tag}", p99([x[0] * 1000 for x in xs]), "ms")
        # Where a submit's wall time went (means, ms): on a CPU (the probe process and its
        # PostgreSQL backend), waiting for a CPU (their run queue), and the rest (both
        # blocked: the commit's WAL flush, a lock, the network).
        on_cpu = [x[1] + x[3] for x in xs]
        runq = [x[2] + x[4] for x in xs]
        rest = [x[0] - c - r for x, c, r in zip(xs, on_cpu, runq, strict=True)]
        for part, v in (("wall", [x[0] for x in xs]), ("on_cpu", on_cpu),
                        ("cpu_wait", runq), ("rest", rest)):
            bench(f"fleet_cycle_{k}_submit_{tag}_{part}_mean", statistics.mean(v) * 1000, "ms")
        slow = sorted(xs, key=lambda x: -x[0])[:max(1, len(xs) // 20)]  # the slowest 5 %
        bench(f"fleet_cycle_{k}_submit_{tag}_slowest5pct_cpu_wait_share",
              sum(x[2] + x[4] for x in slow) / sum(x[0] for x in slow), "")
    note(f"{k}: submits {len(idle)} outside cycles, {len(busy)} during")
    if profile:
        now = timezone.now()
        churn(rnd, user, now)
        prof = cProfile.Profile()
        prof.enable()
        scheduler_cycle(now=now)
        prof.disable()
        s = io.StringIO()
        pstats.Stats(prof, stream=s).strip_dirs().sort_stats("cumulative").print_stats(45)
        print(s.getvalue(), file=sys.stderr, flush=True)


def reader(plain: bool) -> None:
    """One full read of the active jobs (`ActiveJobs.refresh` with nothing kept) and the
    policy's jobs built from them, in a process of its own: its peak and end RSS and its
    CPU time (`--read-memory`)."""
    setup(migrate=False)
    from queueing.selectors import active_jobs
    from queueing.selectors.snapshot import policy_jobs

    active_jobs.COMPACT_ROWS = not plain
    tag = "plain" if plain else "compact"
    base, cpu, t = rss_now_mb(), time.process_time(), time.perf_counter()
    jobs = active_jobs.ActiveJobs()
    jobs.refresh()
    read_cpu, read_wall = time.process_time() - cpu, time.perf_counter() - t
    queued, running = policy_jobs(jobs, {})
    bench(f"fleet_read_{tag}_rows", len(jobs), "rows")
    bench(f"fleet_read_{tag}_read_cpu", read_cpu, "s")
    bench(f"fleet_read_{tag}_read_wall", read_wall, "s")
    bench(f"fleet_read_{tag}_cpu", time.process_time() - cpu, "s")
    bench(f"fleet_read_{tag}_kept_rss", rss_now_mb() - base, "MB")
    bench(f"fleet_read_{tag}_peak_rss", rss_mb(), "MB")
    assert len(queued) + len(running) == len(jobs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[100_000, 250_000, 1_000_000])
    ap.add_argument("--cycles", type=int, default=8)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--legacy", action="store_true")
    ap.add_argument("--detail", action="store_true", help="each cycle's parts (stderr)")
    ap.add_argument("--gc-off", action="store_true", help="no gc.freeze after cycles")
    ap.add_argument("--alternate", action="store_true")
    ap.add_argument("--plain-rows", action="store_true",
                    help="the rows read as the driver gives them (active_jobs.COMPACT_ROWS "
                    "off): the read before the memory work")
    ap.add_argument("--read-memory", type=int, metavar="K",
                    help="on the rows already written, K full reads with the rows plain "
                    "and K compact, alternated, each in a process of its own; no cycle")
    ap.add_argument("--reader", choices=("plain", "compact"), help=argparse.SUPPRESS)
    ap.add_argument("--reuse", action="store_true",
                    help="the rows already written (one size): no write")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--start", help=argparse.SUPPRESS)
    ap.add_argument("--submitter", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.submitter:
        import signal

        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # the worker stops it
        submitter(args.submitter, 4.0)
        return
    if args.reader:
        reader(args.reader == "plain")
        return
    if args.read_memory:
        calibrate()
        for i in range(2 * args.read_memory):
            note(f"load average {os.getloadavg()}")
            subprocess.run([sys.executable, __file__, "--reader",
                            ("plain", "compact")[i % 2]], check=True)
        note(f"load average {os.getloadavg()}")
        return
    if args.worker:
        worker(args.worker, args.cycles, args.profile, args.legacy, args.start, args.detail,
               args.alternate, args.gc_off, args.plain_rows)
        return
    calibrate()
    note(f"load average {os.getloadavg()}")
    setup()
    from django.db import connections
    from django.utils import timezone

    for n in args.sizes:
        start = timezone.now().replace(microsecond=0)
        if not args.reuse:
            world(n, start)
        connections.close_all()
        cmd = [sys.executable, __file__, "--worker", str(n), "--cycles", str(args.cycles),
               "--start", start.isoformat()]
        for flag in ("profile", "detail", "legacy", "alternate", "gc_off", "plain_rows"):
            cmd += [f"--{flag.replace('_', '-')}"] if getattr(args, flag) else []
        note(f"load average {os.getloadavg()}")
        subprocess.run(cmd, check=True)


if __name__ == "__main__":
    main()
