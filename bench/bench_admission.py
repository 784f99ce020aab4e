"""Admission and preemption benchmark (docs/scheduling.md, rules O1, A1-A5, R1-R8).

Questions and goals
  1. One planning pass with 100,000 queued jobs of 1,000 teams on 10,000 GPUs (1,250
     nodes of 8 GPUs, 5 GPU types): under 1 s and under 500 MB.
     This times the PURE POLICY, `plan_admissions(snapshot)`, on a snapshot built in
     memory (no database): the live fair-share order with entry penalties (O1, F6),
     quota and lending checks (Q1), bucketed best fit (A2-A3) and up to
     `max_searches` victim searches (R1-R4) for high-tier jobs that do not fit.
       BENCH calibration_1M_loop         a plain 1M-iteration loop: the machine's speed now
       BENCH cycle_100k_p50 / _min / _max seconds per pass (7 passes)
       BENCH cycle_100k_peak_alloc       tracemalloc peak of one pass (MB)
       BENCH cycle_100k_peak_rss         peak RSS of the process, snapshot included (MB)
     The same pass with rules A6 and A7 at work: every node reports CPU and memory (96
     CPUs, 1 TiB, racks of 8 nodes), half the running and queued jobs ask 8-16 CPUs and
     64-192 GiB per GPU, and a fifth of the gangs ask one rack (half required, half
     preferred): goal the same 1 s.
       BENCH cycle_100k_a6a7_p50 / _max  seconds per pass (7 passes)
  2. A preemption search with 10,000 running jobs: under 200 ms.
       BENCH preemption_search_10k_p50   `find_victims` alone on a full cluster
                                         (10,000 one-GPU jobs), a 2 × 8 high-tier gang
       BENCH preemption_plan_10k_p50     the whole pure pass for that snapshot
       BENCH preemption_cycle_10k_*      the real `scheduler_cycle` (reconcile →
                                         snapshot → decide → apply → stop and submit) on
                                         the simulated backend configured via settings
                                         (FAIRQ_SIM_NODES = 5 × 250x8), SQLite file in
                                         /tmp or $DATABASE_URL; per step and total.

  3. Question 1 with booked GPUs (rules W1-W4): three bookings, one on, two ahead.
       BENCH cycle_100k_booked_p50 / _max seconds per pass (7 passes), beside
                                         cycle_100k_p50 without bookings

Run: `.venv/bin/python bench/bench_admission.py` from the repo root (about a minute);
`... bench_admission.py booked` runs only the passes with and without bookings.
"""

from __future__ import annotations

import os
import random
import resource
import statistics
import sys
import time
import tracemalloc
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note  # noqa: E402  (bench/ is sys.path[0])

from queueing.policy.admission import Plan, plan_admissions  # noqa: E402
from queueing.policy.bookings import Booking  # noqa: E402
from queueing.policy.fairshare import FairShareState  # noqa: E402
from queueing.policy.preemption import find_victims  # noqa: E402
from queueing.policy.priority import PriorityWeights  # noqa: E402
from queueing.policy.snapshot import (  # noqa: E402
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
    Topology,
    TopologyMode,
)
from queueing.policy.workspace import Workspace  # noqa: E402

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
TYPES = ("t0", "t1", "t2", "t3", "t4")
NODES_PER_TYPE = 250
GPUS_PER_NODE = 8
TEAMS = 1000


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


CPU_PER_NODE, MEM_PER_NODE, RACK = 96_000, 2**40, 8


def _resources(rnd: random.Random, gpus: int) -> tuple[int | None, int | None]:
    """Rule A6: half the jobs ask CPU and memory in proportion to their GPUs."""
    if rnd.random() < 0.5:
        return None, None
    return gpus * rnd.choice((8, 12, 16)) * 1000, gpus * rnd.choice((64, 128, 192)) * 2**30


def snapshot_100k(seed: int = 42, *, a6a7: bool = False) -> Snapshot:
    """60 % of the cluster busy with low-tier jobs; 100k queued over 3 tiers. With
    `a6a7`, nodes report CPU, memory and racks and jobs ask them (rules A6, A7)."""
    rnd = random.Random(seed)
    nodes: list[NodeState] = []
    running: list[RunningJob] = []
    job_id = 1
    for t in TYPES:
        for i in range(NODES_PER_TYPE):
            name = f"{t}-{i:03d}"
            used = used_cpu = used_mem = 0
            while used < GPUS_PER_NODE * 0.6:
                g = rnd.choice((1, 2, 4))
                if used + g > GPUS_PER_NODE:
                    break
                cpu, mem = _resources(rnd, g) if a6a7 else (None, None)
                running.append(RunningJob(
                    id=job_id, team=f"team-{rnd.randrange(TEAMS)}", gpu_type=t,
                    gpus_per_replica=g, replicas=1, tier_rank=rnd.choice((0, 0, 100)),
                    preemptible=True, started_at=NOW - timedelta(hours=rnd.uniform(0.1, 9)),
                    min_runtime_seconds=rnd.choice((0, 600)), nodes=(name,),
                    cpu_millicores=cpu, memory_bytes=mem))
                job_id += 1
                used += g
                used_cpu += cpu or 0
                used_mem += mem or 0
            if a6a7:
                nodes.append(NodeState(
                    name, t, GPUS_PER_NODE, GPUS_PER_NODE - used,
                    cpu_free=CPU_PER_NODE - used_cpu, memory_free=MEM_PER_NODE - used_mem,
                    topology={"rack": f"{t}-rack-{i // RACK}"}, cpu_allocatable=CPU_PER_NODE,
                    memory_allocatable=MEM_PER_NODE))
            else:
                nodes.append(NodeState(name, t, GPUS_PER_NODE, GPUS_PER_NODE - used))
    queued = [
        QueuedJob(id=1_000_000 + i, team=f"team-{rnd.randrange(TEAMS)}", gpu_type=rnd.choice(TYPES),
                  gpus_per_replica=rnd.choice((1, 1, 2, 4, 8)),
                  replicas=rnd.choice((1, 1, 1, 2, 4)), tier_rank=rnd.choice((0, 100, 100, 200)),
                  submitted_at=NOW - timedelta(seconds=rnd.uniform(0, 7 * 86400)))
        for i in range(100_000)
    ]
    if a6a7:
        topologies = (Topology("rack", TopologyMode.REQUIRED),
                      Topology("rack", TopologyMode.PREFERRED))
        queued = [replace(q, cpu_millicores=cpu, memory_bytes=mem,
                          topology=rnd.choice(topologies)
                          if q.replicas > 1 and rnd.random() < 0.2 else None)
                  for q in queued for cpu, mem in (_resources(rnd, q.gpus_per_replica),)]
    quotas = {(f"team-{k}", t): QuotaLimit(nominal=2, borrowing_limit=6, lending_limit=None)
              for k in range(TEAMS) for t in TYPES}
    usage = {f"team-{k}": rnd.expovariate(1 / 50.0) for k in range(TEAMS)}
    state = FairShareState(usage, {f"team-{k}": 1 / TEAMS for k in range(TEAMS)})
    return Snapshot(
        now=NOW, nodes=tuple(nodes), queued=tuple(queued), running=tuple(running),
        quotas=quotas, fair_share_state=state, priority_weights=PriorityWeights(),
        billing_weights={t: 1.0 + i for i, t in enumerate(TYPES)}, interval_seconds=3.0,
        preemption=PreemptionSettings(max_per_team=20, max_searches=32),
    )


def snapshot_10k_running() -> Snapshot:
    """Every GPU busy with a one-GPU low-tier job; one 2 × 8 high-tier gang queued."""
    rnd = random.Random(7)
    nodes, running = [], []
    job_id = 1
    for t in TYPES:
        for i in range(NODES_PER_TYPE):
            name = f"{t}-{i:03d}"
            nodes.append(NodeState(name, t, GPUS_PER_NODE, 0))
            for _ in range(GPUS_PER_NODE):
                running.append(RunningJob(
                    id=job_id, team=f"team-{rnd.randrange(TEAMS)}", gpu_type=t,
                    gpus_per_replica=1, replicas=1, tier_rank=0,
                    started_at=NOW - timedelta(seconds=rnd.uniform(60, 36000)),
                    nodes=(name,)))
                job_id += 1
    queued = (QueuedJob(id=999_999, team="team-0", gpu_type="t0", gpus_per_replica=8,
                        replicas=2, tier_rank=200, submitted_at=NOW),)
    return Snapshot(now=NOW, nodes=tuple(nodes), queued=queued, running=tuple(running),
                    priority_weights=PriorityWeights(),
                    # Rule R9 off: the gang has just been submitted, and this times the search.
                    preemption=PreemptionSettings(lost_per_wait=None))


def timed_passes(snap: Snapshot, n: int = 7) -> tuple[list[float], Plan]:
    """`n` passes of `plan_admissions` on `snap`: the seconds of each, and the plan."""
    times = []
    plan = None
    for _ in range(n):
        t = time.perf_counter()
        plan = plan_admissions(snap)
        times.append(time.perf_counter() - t)
    assert plan is not None
    return times, plan


def bench_100k() -> None:
    t = time.perf_counter()
    snap = snapshot_100k()
    note(f"built the 100k snapshot in {time.perf_counter() - t:.2f} s: "
         f"{len(snap.queued)} queued, {len(snap.running)} running, {len(snap.nodes)} nodes, "
         f"{sum(n.capacity for n in snap.nodes)} GPUs ({sum(n.free for n in snap.nodes)} free)")
    times, plan = timed_passes(snap)
    note(f"pure policy pass: {len(plan.admissions)} admitted, {len(plan.preemptions)} "
         f"preemptions ({sum(len(p.victims) for p in plan.preemptions)} victims), "
         f"{len(plan.waits)} waiting")
    tracemalloc.start()
    plan_admissions(snap)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    bench("cycle_100k_p50", statistics.median(times), "s")
    bench("cycle_100k_min", min(times), "s")
    bench("cycle_100k_max", max(times), "s")
    bench("cycle_100k_peak_alloc", peak / 2**20, "MB")
    bench("cycle_100k_peak_rss", rss_mb(), "MB")


def snapshot_100k_booked() -> Snapshot:
    """`snapshot_100k` with booked GPUs (rules W1-W4): a booking on now of 64 t0 GPUs
    (team-1, lending), one of 128 t1 GPUs from 2 h on (team-2), and a weekly one of 32
    t2 GPUs from 30 min on (team-3). The queued jobs have no estimate: every t1 and t2
    job would cross its start (rule W1 places each of them)."""
    snap = snapshot_100k()
    on = Booking(1, "team-1", "t0", 64, NOW - timedelta(minutes=10), NOW + timedelta(hours=4))
    ahead = Booking(2, "team-2", "t1", 128, NOW + timedelta(hours=2), NOW + timedelta(hours=6),
                    lend=False)
    soon = Booking(3, "team-3", "t2", 32, NOW + timedelta(minutes=30),
                   NOW + timedelta(hours=1))
    return replace(snap, bookings=(on, ahead, soon), lend_tiers=frozenset({0}))


def bench_100k_booked() -> None:
    """Question 1 with booked GPUs, beside the same pass without (`cycle_100k_p50`)."""
    snap = snapshot_100k_booked()
    times, plan = timed_passes(snap)
    held = sum(1 for w in plan.waits.values() if "rule W1" in w.message)
    note(f"with 3 bookings: {len(plan.admissions)} admitted, {len(plan.preemptions)} "
         f"preemptions, {held} held back by rule W1")
    bench("cycle_100k_booked_p50", statistics.median(times), "s")
    bench("cycle_100k_booked_max", max(times), "s")


def bench_100k_a6a7() -> None:
    snap = snapshot_100k(a6a7=True)
    times = []
    plan = None
    for _ in range(7):
        t = time.perf_counter()
        plan = plan_admissions(snap)
        times.append(time.perf_counter() - t)
    assert plan is not None
    reasons: dict[str, int] = {}
    for w in plan.waits.values():
        reasons[str(w.reason)] = reasons.get(str(w.reason), 0) + 1
    note(f"with CPU, memory and racks: {len(plan.admissions)} admitted, "
         f"{len(plan.preemptions)} preemptions; waits by reason {dict(sorted(reasons.items()))}")
    bench("cycle_100k_a6a7_p50", statistics.median(times), "s")
    bench("cycle_100k_a6a7_max", max(times), "s")


def bench_search_pure() -> None:
    snap = snapshot_10k_running()
    job = snap.queued[0]
    search, whole = [], []
    found = None
    for _ in range(9):
        ws = Workspace(snap)
        t = time.perf_counter()
        found = find_victims(ws, job, now=NOW, factor=lambda _team: 1.0)
        search.append(time.perf_counter() - t)
        t = time.perf_counter()
        plan = plan_admissions(snap)
        whole.append(time.perf_counter() - t)
    assert found is not None and len(plan.preemptions) == 1
    note(f"victims for the 2 × 8 gang among 10,000 running: {len(found[0].victims)}")
    bench("preemption_search_10k_p50", statistics.median(search) * 1000, "ms")
    bench("preemption_plan_10k_p50", statistics.median(whole) * 1000, "ms")


def bench_search_cycle() -> None:
    """The real scheduler cycle with 10,000 running jobs and one high-tier gang."""
    url = os.environ.get("DATABASE_URL", "")
    if not url:
        path = Path("/tmp/fairq_bench_admission.sqlite3")
        path.unlink(missing_ok=True)
        os.environ["DATABASE_URL"] = f"sqlite:///{path}"
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0, interactive=False)
    settings.FAIRQ_SIM_NODES = ",".join(f"{NODES_PER_TYPE}x{GPUS_PER_NODE}x{t}" for t in TYPES)
    settings.FAIRQ_SIM_DEFAULT_SECONDS = 10 * 86400
    settings.FAIRQ_PREEMPTION_MAX_PER_TEAM = -1
    settings.FAIRQ_PREEMPTION_LOST_PER_WAIT = -1.0  # rule R9 off: this times the search

    from accounts.models import Team
    from queueing.composition import get_backend, reset_backends
    from queueing.models import GpuType, Job, JobEvent, Tier
    from queueing.services.scheduler import launch_spec, scheduler_cycle

    reset_backends()
    backend = get_backend()
    note(f"database: {connection.vendor}; simulated cluster: {settings.FAIRQ_SIM_NODES}")
    Job.objects.all().delete()
    gpu = {t: GpuType.objects.get_or_create(slug=t, defaults={"name": t})[0] for t in TYPES}
    low = Tier.objects.get_or_create(slug="low", defaults={
        "name": "Low", "rank": 0, "priority_class_name": "fq-low", "priority_value": 0})[0]
    high = Tier.objects.get_or_create(slug="high", defaults={
        "name": "High", "rank": 200, "priority_class_name": "fq-high", "priority_value": 2000})[0]
    teams = [Team.objects.get_or_create(slug=f"team-{k}", defaults={"name": f"T{k}"})[0]
             for k in range(100)]
    t0 = datetime.now(UTC)
    rows = []
    for t in TYPES:
        for i in range(NODES_PER_TYPE):
            for s in range(GPUS_PER_NODE):
                rows.append(Job(
                    team=teams[len(rows) % len(teams)], name=f"r{len(rows)}", image="x",
                    gpu_type=gpu[t], gpus_per_replica=1, replicas=1, tier=low,
                    status="RUNNING", created_at=t0 - timedelta(hours=2),
                    admitted_at=t0 - timedelta(hours=1),
                    started_at=t0 - timedelta(seconds=3600 - len(rows) * 0.1 - s),
                    submitted_to_backend_at=t0 - timedelta(hours=1),
                    placement=[f"sim-{t}-{i:03d}"]))
    t = time.perf_counter()
    jobs = Job.objects.bulk_create(rows, batch_size=2000)
    for job in Job.objects.filter(pk__in=[j.pk for j in jobs]).select_related(
            "team", "tier", "gpu_type").iterator(chunk_size=2000):
        backend.submit(launch_spec(job), now=t0 - timedelta(hours=1))
    gang = Job.objects.create(team=teams[0], name="gang", image="x", gpu_type=gpu["t0"],
                              gpus_per_replica=8, replicas=2, tier=high, status="QUEUED",
                              created_at=t0, updated_at=t0)
    note(f"set up 10,000 running jobs on the simulated cluster in "
         f"{time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    r = scheduler_cycle(now=t0)
    total = time.perf_counter() - t
    assert r.plan is not None and len(r.preempted) >= 2, r.plan.waits if r.plan else r
    note(f"cycle preempted {len(r.preempted)} job(s) for gang #{gang.pk}: "
         f"{JobEvent.objects.get(job=gang, kind=JobEvent.Kind.PREEMPTING).reason}")
    for step in ("reconcile", "snapshot", "decide", "apply", "submit"):
        bench(f"preemption_cycle_10k_{step}", r.timings[step] * 1000, "ms")
    bench("preemption_cycle_10k_total", total * 1000, "ms")
    r = scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert gang.pk in r.admitted
    note(f"next cycle admitted the gang in {r.timings['total'] * 1000:.0f} ms")


def calibrate() -> None:
    """How fast this machine runs plain Python right now (a loaded CI box can be several
    times slower than an idle laptop, where this takes about 0.03 s)."""
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        x = 0
        for i in range(1_000_000):
            x += i
        best = min(best, time.perf_counter() - t)
    bench("calibration_1M_loop", best, "s")
    note(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


def main() -> None:
    calibrate()
    if sys.argv[1:] == ["booked"]:  # the pass with and without booked GPUs only
        bench_100k()
        bench_100k_booked()
        return
    bench_100k()
    bench_100k_a6a7()
    bench_search_pure()
    bench_search_cycle()


if __name__ == "__main__":
    main()
