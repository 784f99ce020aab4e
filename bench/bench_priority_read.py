"""The priority read (`GET /api/v1/jobs/{id}/` of a queued job: what `fairq prio` reads,
rule P3) and the standings read (`GET /api/v1/fairshare/`) with a large queue.

Question: does reading many queued jobs between two scheduler cycles plan the queue once
(docs/scheduling.md, P3), and what does one read cost? (218 ms against
`sprio`'s 10.5 ms in bench/bench_vs_slurm.py.)

How it works
  * PostgreSQL at $FAIRQ_PRIO_BENCH_DATABASE_URL (default fairq_prio_bench on
    127.0.0.1), dropped and created afresh; the shared cache in Redis ($REDIS_URL, else
    the local Redis db 8) as in production, else local memory.
  * World: 3 teams, 2 GPU types, `--queued` queued jobs (default 10,000), the simulated
    cluster; no scheduler runs, so the plan is only dropped by its TTL.
  * Reads go through Django's test Client with a token (the whole API stack): `--reads`
    details of distinct queued jobs per round, `before` (this process's copy of the plan
    dropped before each read, so every read unpickles the shared plan, as before issue
    20's fix) and `after` alternated over `--rounds` rounds; then the standings, each
    timed. `plans` counts the plans of the whole queue computed while reading.
  * Concurrent misses: `--procs` processes (as gunicorn workers) each read a queued job at
    once right after the plan was dropped, `before` (every process plans, as before the
    build mark) and `after` (one plans, the others wait for its plan) alternated: the
    slowest read, the CPU of all of them, and plans per miss.

Output: `BENCH <name> <value> <unit>`. Run: `.venv/bin/python bench/bench_priority_read.py`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, drop_postgres, note, recreate_postgres  # noqa: E402  (bench/ is sys.path[0])

DEFAULT_PG = "postgres://postgres@127.0.0.1:5432/fairq_prio_bench"


def setup(url: str, queued: int) -> tuple[str, list[int]]:
    os.environ["DATABASE_URL"] = url
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/8")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.utils import timezone

    call_command("migrate", verbosity=0, interactive=False)
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    from accounts.models import Membership, Role, Team
    from accounts.services import token_issue
    from queueing.models import GpuType, Job, Quota, Tier
    from queueing.policy.states import JobState

    gpus = [GpuType.objects.create(slug=s, name=s.upper(), billing_weight=w)
            for s, w in (("h100", 2.0), ("a100", 1.0))]
    tier = Tier.objects.create(slug="normal", name="normal", rank=100,
                               priority_class_name="fq-normal", priority_value=1000,
                               open_to_all_teams=True)
    user = get_user_model().objects.create(username="bench", is_staff=True)
    teams = [Team.objects.create(slug=s, name=s, weight=w)
             for s, w in (("vision", 3.0), ("nlp", 2.0), ("speech", 1.0))]
    for t in teams:
        for g in gpus:
            Quota.objects.create(team=t, gpu_type=g, nominal=8)
        Membership.objects.create(user=user, team=t, role=Role.MEMBER)
    now = timezone.now()
    Job.objects.bulk_create([
        Job(team=teams[i % 3], submitter=user, name=f"job-{i}", image="busybox",
            command=["true"], gpu_type=gpus[i % 2], gpus_per_replica=1 + i % 4, replicas=1,
            tier=tier, status=JobState.QUEUED,
            created_at=now - timedelta(seconds=queued - i), updated_at=now)
        for i in range(queued)], batch_size=5000)
    from django.db import connection

    with connection.cursor() as cur:  # as autovacuum would: planner statistics of the queue
        cur.execute("VACUUM ANALYZE")
    ids = list(Job.objects.filter(status=JobState.QUEUED).order_by("id").values_list("id", flat=True))
    return token_issue(user=user, name="bench").key, ids


def child(mode: str, job_id: int) -> int:
    """One web process's read after a miss: waits for "go" on stdin, reads, prints
    `<ms> <plans made here> <cpu ms>`. `all`: every process plans (no build mark)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()
    from unittest import mock

    from django.conf import settings

    # The test settings prefix the cache per process: these share one, empty each round.
    settings.CACHES["default"]["KEY_PREFIX"] = os.environ["FAIRQ_PRIO_BENCH_PREFIX"]
    from django.core.cache import cache
    from django.utils import timezone

    from queueing.models import Job
    from queueing.selectors import queue_plan as qp

    job = Job.objects.get(pk=job_id)
    cache.get(qp._GEN_KEY)  # connect before the clock starts
    print("ready", flush=True)
    sys.stdin.readline()
    with mock.patch.object(qp, "_plan_compute", wraps=qp._plan_compute) as made, \
            mock.patch.object(cache, "add", return_value=True) if mode == "all" \
            else mock.patch.object(qp, "PLAN_BUILD_WAIT", qp.PLAN_BUILD_WAIT):
        t0, c0 = time.perf_counter(), time.process_time()
        qp.job_explain(job=job, now=timezone.now())
        t1, c1 = time.perf_counter(), time.process_time()
    print(f"{(t1 - t0) * 1000:.3f} {made.call_count} {(c1 - c0) * 1000:.3f}", flush=True)
    return 0


def compare_concurrent(url: str, ids: list[int], procs: int, rounds: int) -> None:
    """`procs` processes read distinct queued jobs at once right after the plan was
    dropped (as a cycle that moved a job does): every one planning (`all`, as before)
    against one planning while the others wait for its plan (`one`), alternated."""
    import subprocess
    import uuid

    walls: dict[str, list[float]] = {"all": [], "one": []}
    plans: dict[str, int] = {"all": 0, "one": 0}
    cpus: dict[str, list[float]] = {"all": [], "one": []}
    for n in range(rounds):
        for mode in (("all", "one") if n % 2 == 0 else ("one", "all")):
            # A cache of their own, empty: the miss a cycle that moved a job leaves.
            env = {**os.environ, "DATABASE_URL": url,
                   "FAIRQ_PRIO_BENCH_PREFIX": f"fairq-prio-bench-{uuid.uuid4().hex}"}
            kids = [subprocess.Popen([sys.executable, __file__, "--child", mode, str(ids[k])],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     env=env) for k in range(procs)]
            for k in kids:
                assert k.stdout is not None and k.stdout.readline().strip() == "ready"
            for k in kids:
                assert k.stdin is not None
                k.stdin.write("go\n")
                k.stdin.flush()
            outs = [k.communicate()[0].split() for k in kids]
            walls[mode].append(max(float(o[0]) for o in outs))
            plans[mode] += sum(int(o[1]) for o in outs)
            cpus[mode].append(sum(float(o[2]) for o in outs))
    for mode, label in (("all", "before"), ("one", "after")):
        bench(f"prio_concurrent_{label}_wall_p50", statistics.median(walls[mode]), "ms")
        bench(f"prio_concurrent_{label}_cpu_p50", statistics.median(cpus[mode]), "ms")
        bench(f"prio_concurrent_{label}_plans_per_miss", plans[mode] / rounds, "count")


def main() -> int:
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        return child(sys.argv[2], int(sys.argv[3]))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queued", type=int, default=10_000)
    p.add_argument("--reads", type=int, default=20)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--procs", type=int, default=2, help="processes reading at once after a miss")
    p.add_argument("--keep", action="store_true", help="keep the PostgreSQL database")
    a = p.parse_args()
    url = os.environ.get("FAIRQ_PRIO_BENCH_DATABASE_URL", DEFAULT_PG)
    if not recreate_postgres(url):
        note("skipping: needs PostgreSQL")
        return 0
    key, ids = setup(url, a.queued)
    from unittest import mock

    from django.core.cache import cache
    from django.test import Client

    from queueing.selectors import queue_plan as qp

    cache.clear()
    client = Client(HTTP_AUTHORIZATION=f"Token {key}")
    step = max(1, len(ids) // a.reads)
    picks = ids[::step][: a.reads]
    assert client.get(f"/api/v1/jobs/{picks[0]}/").status_code == 200  # warm-up, plans once

    def read_all(shared_only: bool) -> list[float]:
        times = []
        for job_id in picks:
            if shared_only:  # as before the shared plan's fix: every read unpickles the shared plan
                qp._Local.plan = None
            t0 = time.perf_counter()
            r = client.get(f"/api/v1/jobs/{job_id}/")
            times.append((time.perf_counter() - t0) * 1000)
            assert r.status_code == 200 and r.json()["queue"]["position"] is not None, r.content
        return times

    # Alternated, the order flipped each round; the plan stays cached (no cycle runs) as
    # long as a round is shorter than QUEUE_PLAN_TTL, else it is planned again: counted.
    times: dict[bool, list[float]] = {True: [], False: []}
    plans: dict[bool, int] = {True: 0, False: 0}
    for n in range(a.rounds):
        for shared_only in ((True, False) if n % 2 == 0 else (False, True)):
            with mock.patch.object(qp, "_plan_compute", wraps=qp._plan_compute) as computed:
                times[shared_only] += read_all(shared_only)
            plans[shared_only] += computed.call_count
    for shared_only, label in ((True, "before"), (False, "after")):
        bench(f"prio_read_{label}_p50", statistics.median(times[shared_only]), "ms")
        bench(f"prio_read_{label}_max", max(times[shared_only]), "ms")
        bench(f"prio_read_{label}_plans", plans[shared_only], "count")
    note(f"{len(ids)} queued, {len(picks)} reads x {a.rounds} rounds per mode")
    ftimes = []
    for _ in range(10):
        t0 = time.perf_counter()
        assert client.get("/api/v1/fairshare/?users=1").status_code == 200
        ftimes.append((time.perf_counter() - t0) * 1000)
    bench("fairshare_read_p50", statistics.median(ftimes), "ms")
    if a.procs > 1:
        compare_concurrent(url, picks, a.procs, a.rounds)
        note(f"{a.procs} processes reading at once after a miss, {a.rounds} rounds per mode")
    if not a.keep:
        drop_postgres(url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
