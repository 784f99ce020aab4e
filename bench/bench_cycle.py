"""Scheduler cycle benchmark (docs/scheduling.md, "The cycle"; docs/architecture.md,
"The incremental snapshot").

Questions:
  1. How long does one real `scheduler_cycle` take with 10,000 queued jobs of 50 teams on
     a 1,000-GPU simulated cluster (125 nodes × 8 h100)? Goal: under 1 s.
  2. With 100,000 queued and 10,000 running jobs (100 teams, 10,000 simulated GPUs:
     1,250 nodes × 8 h100) on PostgreSQL? Goal: a full cycle under 1 s.

How it works
  * Django with `config.settings.test`, the simulated backend configured via settings;
    database: $DATABASE_URL, or a fresh SQLite file in /tmp. The bench empties the job
    tables of that database.
  * Scenario 1: 50 teams with a quota each (nominal 20, borrowing limit 40), 3 tiers,
    10,000 queued jobs of 1-8 GPUs × 1-2 replicas submitted over the last day.
    `cycle_10k_first`: the first cycle, which fills the cluster: reconcile (nothing yet),
    snapshot, decide (the pure plan over 10,000 jobs), apply (one compare-and-swap and
    one event per admitted job, one transaction), submit (to the simulated cluster).
    `cycle_10k_steady`: the next cycles: reconcile of every running workload, then a full
    plan in which nothing fits (the common case of a busy cluster). p50 of 5.
  * Scenario 2: 100 teams (quota nominal 100, borrowing limit 100), 100,000 queued and
    10,000 running one-GPU jobs (set up directly: rows and simulated workloads; the
    running ones of the top tier, 100 per team: a settled busy cluster, where the plan
    finds nothing to admit or preempt), the running ones for the rest of the bench; the
    job table vacuumed after the bulk load, as autovacuum would. `cycle_100k_queued_10k_running_<db>_first`
    is the first cycle of the process (nothing kept from an earlier one);
    `_steady_p50` the p50 of the next cycles, each after a little churn between cycles
    (a few submits, a cancel, a priority change: what a busy queue sees), with the p50
    of each step (`_snapshot`, `_plan`, `_reconcile`, `_apply`, `_submit`).
  * The peak RSS of the process after each scenario.

Output: `BENCH <name> <value> <unit>`. Run: `.venv/bin/python bench/bench_cycle.py`
(`--only 10k` or `--only 100k` for one scenario;
`DATABASE_URL=postgres://postgres@127.0.0.1:5432/<db>` for PostgreSQL).
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note, setup_django_sqlite  # noqa: E402  (bench/ is sys.path[0])

TEAMS = 50
QUEUED = 10_000
BIG_TEAMS = 100
BIG_RUNNING = 10_000
BIG_QUEUED = 100_000
STEADY_CYCLES = 7
STEPS = ("reconcile", "snapshot", "decide", "apply", "submit")


def setup() -> None:
    setup_django_sqlite("fairq_bench_cycle")
    from django.conf import settings

    settings.FAIRQ_SIM_DEFAULT_SECONDS = 86400.0


def use_cluster(spec: str) -> None:
    from django.conf import settings

    from queueing.composition import reset_backends

    settings.FAIRQ_SIM_NODES = spec
    reset_backends()


def build_world(now: datetime, *, teams: int, queued: int, nominal: int, borrowing: int,
                sizes: tuple[int, ...], replicas: tuple[int, ...]) -> None:
    from accounts.models import Team
    from queueing.models import GpuType, Job, JobEvent, Quota, Tier, UsageRecord

    UsageRecord.objects.all().delete()
    JobEvent.objects.all().delete()
    Job.objects.all().delete()
    rnd = random.Random(1)
    h100 = GpuType.objects.get_or_create(slug="h100", defaults={"name": "H100"})[0]
    tiers = [Tier.objects.update_or_create(slug=s, defaults={
        "name": s, "rank": r, "priority_class_name": f"fq-{s}", "priority_value": r,
        "open_to_all_teams": True})[0]
        for s, r in (("low", 0), ("normal", 100), ("high", 200))]
    team_rows = [Team.objects.get_or_create(slug=f"team-{k}", defaults={
        "name": f"Team {k}", "weight": 1.0 + k % 3})[0] for k in range(teams)]
    Quota.objects.all().delete()
    Quota.objects.bulk_create([Quota(team=t, gpu_type=h100, nominal=nominal,
                                     borrowing_limit=borrowing) for t in team_rows])
    Job.objects.bulk_create([
        Job(team=rnd.choice(team_rows), name=f"q{i}", image="x", gpu_type=h100,
            gpus_per_replica=rnd.choice(sizes), replicas=rnd.choice(replicas),
            tier=rnd.choice(tiers), status="QUEUED",
            created_at=now - timedelta(seconds=rnd.uniform(0, 86400)), updated_at=now)
        for i in range(queued)
    ], batch_size=5000)


def start_running(at: datetime, n: int) -> None:
    """`n` queued jobs running since `at`, one per GPU, the same number of each team (its
    nominal quota: no team is owed GPUs, rule Q2) and of the top tier (what a busy
    cluster runs once the queue's order has had its way), their workloads on the
    simulated cluster: set up directly (the first scenario times admitting jobs)."""
    from accounts.models import Team
    from queueing.composition import get_backend
    from queueing.models import Job, Tier
    from queueing.policy.states import JobState
    from queueing.services.scheduler import launch_spec

    backend = get_backend()
    slots = [node.name for node in backend.nodes() for _ in range(node.capacity)]
    teams = list(Team.objects.filter(slug__startswith="team-").values_list("id", flat=True))
    ids: list[int] = []
    for team in teams:
        ids += list(Job.objects.filter(status=JobState.QUEUED, team_id=team)
                    .order_by("created_at", "id").values_list("id", flat=True)[:n // len(teams)])
    top = Tier.objects.order_by("-rank").first()
    on: dict[str, list[int]] = {}
    for pk, node in zip(ids, slots, strict=False):
        on.setdefault(node, []).append(pk)
    for node, pks in on.items():
        Job.objects.filter(pk__in=pks).update(status=JobState.RUNNING, placement=[node],
                                              admitted_at=at, started_at=at, tier=top,
                                              submitted_to_backend_at=at)
    for job in Job.objects.filter(pk__in=ids).select_related("team", "tier", "gpu_type"):
        backend.submit(launch_spec(job), now=at)


def vacuum() -> None:
    """What autovacuum does to a table soon after a bulk load (statistics, the visibility
    map): without it the first cycles plan on a table PostgreSQL thinks is empty."""
    from django.db import connection

    if connection.vendor == "postgresql":
        with connection.cursor() as cur:
            cur.execute("VACUUM ANALYZE queueing_job")
            cur.execute("VACUUM ANALYZE queueing_jobevent")


def churn(now: datetime, k: int) -> None:
    """What happens to a busy queue between two cycles: 20 submits, a cancel, a tier
    change (all through the services, so every change goes the way production's does)."""
    from django.contrib.auth import get_user_model

    from accounts.models import Team
    from queueing.models import Job, Tier
    from queueing.policy.states import JobState
    from queueing.services.jobs import job_cancel, job_input_build, job_submit_with_event

    user = get_user_model().objects.filter(is_superuser=True).first()
    if user is None:
        user = get_user_model().objects.create_superuser("bench", "bench@example.com", "x")
    team = Team.objects.get(slug=f"team-{k % BIG_TEAMS}")
    for i in range(20):
        job_submit_with_event(actor=user, now=now, data=job_input_build(
            actor=user, team=team.slug, name=f"late-{k}-{i}", image="ghcr.io/acme/train:1",
            gpu_type="h100", gpus=1, replicas=1, tier="normal"))
    victim = Job.objects.filter(status=JobState.QUEUED).order_by("id")[k:k + 1].first()
    if victim is not None:
        job_cancel(actor=user, job=victim, now=now)
    last = Job.objects.filter(status=JobState.QUEUED, team=team).order_by("-id").first()
    if last is not None:
        Job.objects.filter(pk=last.pk).update(tier=Tier.objects.get(slug="high"))


def scenario_10k() -> None:
    from django.db import connection

    from queueing.services.scheduler import scheduler_cycle

    use_cluster("125x8xh100")
    now = datetime.now(UTC)
    build_world(now, teams=TEAMS, queued=QUEUED, nominal=20, borrowing=40,
                sizes=(1, 1, 2, 4, 8), replicas=(1, 1, 2))
    note(f"database: {connection.vendor}; {QUEUED} queued jobs of {TEAMS} teams; "
         "1,000 simulated h100 GPUs")
    t = time.perf_counter()
    r = scheduler_cycle(now=now)
    first = time.perf_counter() - t
    note(f"first cycle admitted {len(r.admitted)} jobs "
         f"({len(r.plan.waits) if r.plan else 0} waiting)")
    for step in STEPS:
        bench(f"cycle_10k_first_{step}", r.timings[step] * 1000, "ms")
    bench("cycle_10k_first", first, "s")
    steady = []
    for k in range(1, 6):
        t = time.perf_counter()
        r = scheduler_cycle(now=now + timedelta(seconds=k))
        steady.append(time.perf_counter() - t)
        note(f"cycle {k + 1}: {len(r.started)} started, {len(r.admitted)} admitted, "
             f"{len(r.preempted)} preempted (rules R1/R2, rate-limited by R5)")
    bench("cycle_10k_steady_p50", statistics.median(steady), "s")
    bench("cycle_10k_peak_rss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
          "MB")


def scenario_100k(*, profile: bool) -> None:
    from django.db import connection

    from queueing.services.scheduler import scheduler_cycle

    use_cluster(f"{BIG_RUNNING // 8}x8xh100")
    db = "pg" if connection.vendor == "postgresql" else connection.vendor
    name = f"cycle_100k_queued_10k_running_{db}"
    now = datetime.now(UTC)
    t = time.perf_counter()
    build_world(now, teams=BIG_TEAMS, queued=BIG_QUEUED + BIG_RUNNING, nominal=100,
                borrowing=100, sizes=(1,), replicas=(1,))
    start_running(now - timedelta(minutes=10), BIG_RUNNING)
    vacuum()
    note(f"database: {connection.vendor}; {BIG_QUEUED} queued and {BIG_RUNNING} running "
         f"one-GPU jobs of {BIG_TEAMS} teams; {BIG_RUNNING} simulated h100 GPUs "
         f"(built in {time.perf_counter() - t:.1f} s)")
    # The first cycle of a new worker process: nothing kept from an earlier cycle.
    t = time.perf_counter()
    r = scheduler_cycle(now=now)
    first = time.perf_counter() - t
    note(f"first cycle: {len(r.started)} started, {len(r.admitted)} admitted "
         f"({len(r.plan.waits) if r.plan else 0} waiting)")
    bench(f"{name}_first", first, "s")
    for step in STEPS:
        bench(f"{name}_first_{step}", r.timings[step] * 1000, "ms")
    totals: list[float] = []
    steps: dict[str, list[float]] = {s: [] for s in STEPS}
    for k in range(1, STEADY_CYCLES + 1):
        at = now + timedelta(seconds=k)
        churn(at, k)
        prof = None
        if profile and k == STEADY_CYCLES:
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        t = time.perf_counter()
        r = scheduler_cycle(now=at)
        totals.append(time.perf_counter() - t)
        if prof is not None:
            prof.disable()
            import pstats

            pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(45)
        for s in STEPS:
            steps[s].append(r.timings[s])
        note(f"cycle {k + 1}: {totals[-1] * 1000:.0f} ms; {len(r.started)} started, "
             f"{len(r.admitted)} admitted, {len(r.preempted)} preempted; "
             + ", ".join(f"{s} {r.timings[s] * 1000:.0f}" for s in STEPS))
    bench(f"{name}_steady_p50", statistics.median(totals), "s")
    bench(f"{name}_p50", statistics.median(totals), "s")
    # The brief's breakdown: snapshot, plan (decide), reconcile, apply (+ submit).
    for s, label in (("snapshot", "snapshot"), ("decide", "plan"), ("reconcile", "reconcile"),
                     ("apply", "apply"), ("submit", "submit")):
        bench(f"{name}_{label}_p50", statistics.median(steps[s]) * 1000, "ms")
    bench(f"{name}_peak_rss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
          "MB")  # (the process's: after the 10k scenario when both ran)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("10k", "100k"), default=None)
    parser.add_argument("--profile", action="store_true",
                        help="cProfile the last steady cycle of the 100k scenario (stderr)")
    args = parser.parse_args()
    setup()
    if args.only in (None, "10k"):
        scenario_10k()
    if args.only in (None, "100k"):
        scenario_100k(profile=args.profile)


if __name__ == "__main__":
    main()
