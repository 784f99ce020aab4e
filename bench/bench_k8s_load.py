"""1,000 jobs through the real Celery worker and beat, on a loaded machine, against a real
Kubernetes control plane (tests/envtest) with the fake kubelet.

Questions and goals (docs/performance.md, "The cycle under load")
  At load average >= 8 on this 2-core machine:
  1. Is any scheduler cycle, or log-archive run, cut by its Celery time limit? Goal: none.
       BENCH k8s_load_<label>_cycles_hard_killed / _cycles_soft_limited    count
       BENCH k8s_load_<label>_archive_hard_killed / _archive_soft_limited  count
       BENCH k8s_load_<label>_cycle_p95_s / _cycle_max_s     the worker's own
                                               "scheduler_cycle_task succeeded in" times
       BENCH k8s_load_<label>_cycles_deferring   cycles that left work to the next
  2. How long from a pod Running (the fake kubelet's status write, seen by an
     independent pod watch) to its job RUNNING in fairq (seen by polling the database
     every 0.5 s)? Goal p95 <= 10 s.
       BENCH k8s_load_<label>_pod_to_running_lag_p50 / _p95 / _max   s
  3. Is every replica's log kept? Every attempt that ran, every replica: a final JobLog
     whose kept file holds the pod's own lines (the worker answers pod log reads as a
     kubelet would: bench/k8s_load_worker.py). Goal: none missing, when the last job
     ended and FAIRQ_LOG_ARCHIVE_SECONDS x 4 after.
       BENCH k8s_load_<label>_logs_missing_at_end / _logs_missing_after   replicas
       BENCH k8s_load_<label>_failed_replica_logs_missing_after   of the jobs whose
                                               replica 1 fails (its log is the one
                                               the user needs)
       BENCH k8s_load_<label>_logs_kept_without_pod_lines   kept, of an attempt that
                                               ran, without the pod's lines (goal 0)
       BENCH k8s_load_<label>_logs_kept_of_attempts_never_run   an attempt preempted
                                               before it ran keeps nothing (goal 0)
  Also: BENCH k8s_load_<label>_load_avg_min / _median / _max (1-minute load average
  sampled every 5 s while jobs run), _busy_loops, _wall_s, _jobs_final.

The mix: JOBS jobs queued at once by 4 teams on NODES x 8 H100 GPUs; one in ten has 2
replicas whose replica 1 fails after 6 s (its peer runs until fairq stops it), the
others 1 GPU for 8-20 s. The worker runs as docker-compose runs it (`celery -A config
worker --concurrency 1`, `celery -A config beat`; `--worker-concurrency 2` as
platform/k8s runs it), the tree of `--code` on PYTHONPATH
(this one by default; `--code /path/to/other/checkout` runs another's code against the
same harness: its "before"). The load: `--load N` busy loops, each in a session of its
own (as bench/_common.py start_load) and bounded to the run's length; the machine's
other work adds to it, so the load average is read and printed, not assumed.

Database: $DATABASE_URL (dropped and created), Redis: $REDIS_URL (its db flushed).
Run: `.venv/bin/python bench/bench_k8s_load.py --load 8 --label after` (10-15 min).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note, recreate_postgres  # noqa: E402  (bench/ is sys.path[0])

from tests.envtest.cluster import ControlPlane, default_bin_dir, missing_binaries  # noqa: E402

NODES = 16
GPUS_PER_NODE = 8
TEAMS = 4
PREFIX = "ld-"
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def start_bounded_load(count: int, seconds: float) -> list[subprocess.Popen[bytes]]:
    """`count` busy loops, each in a session of its own, each ending by itself after
    `seconds` (should the bench die without stopping them)."""
    code = f"import time\nend = time.monotonic() + {seconds}\nwhile time.monotonic() < end: pass"
    return [subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
            for _ in range(count)]


def setup(args: argparse.Namespace, env: dict[str, str]) -> None:
    os.environ.update(env)
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings.dev"
    import django

    django.setup()
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], cwd=args.code,
                   env=env, check=True)


def seed() -> list[Any]:
    """The H100 type, one tier, TEAMS teams sharing the GPUs (quota: an equal share,
    borrowing the rest)."""
    from accounts.models import Team
    from queueing.models import GpuType, Quota, Tier

    gpu, _ = GpuType.objects.update_or_create(slug="h100", defaults={
        "name": "H100", "node_labels": {"fairq.io/gpu-type": "h100"}, "billing_weight": 1.0})
    Tier.objects.update_or_create(slug="normal", defaults={
        "name": "Normal", "rank": 100, "priority_class_name": "fairq-load-normal",
        "priority_value": 1000, "min_runtime_seconds": 0})
    teams = []
    for i in range(TEAMS):
        team, _ = Team.objects.update_or_create(slug=f"load{i}",
                                                defaults={"name": f"load {i}", "weight": 1.0})
        share = NODES * GPUS_PER_NODE // TEAMS
        Quota.objects.update_or_create(team=team, gpu_type=gpu, defaults={
            "nominal": share, "borrowing_limit": NODES * GPUS_PER_NODE - share})
        teams.append(team)
    return teams


def queue_jobs(args: argparse.Namespace, teams: list[Any]) -> list[int]:
    from queueing.models import GpuType, Job, Tier

    gpu = GpuType.objects.get(slug="h100")
    tier = Tier.objects.get(slug="normal")
    rng = random.Random(7)
    now = datetime.now(UTC)
    jobs = []
    for i in range(args.jobs):
        pair = i % 10 == 9
        env = ({"FAIRQ_SIM_SECONDS": "6", "FAIRQ_SIM_FAIL_REPLICA": "1",
                "FAIRQ_SIM_EXIT_CODE": "3"} if pair
               else {"FAIRQ_SIM_SECONDS": str(rng.randint(8, 20))})
        jobs.append(Job(team=teams[i % TEAMS], name=f"load-{i}", image="registry.invalid/x:1",
                        command=["run"], env=env, gpu_type=gpu, gpus_per_replica=1,
                        replicas=2 if pair else 1, tier=tier, max_runtime_seconds=3600,
                        created_at=now))
    return [j.pk for j in Job.objects.bulk_create(jobs, batch_size=500)]


def provision() -> Any:
    """Namespaces, quotas and PriorityClasses, as `manage.py sync_cluster` makes them,
    with the backend the settings build (the worker's own)."""
    from queueing.composition import get_backend
    from queueing.services.provisioning import sync_cluster

    backend = get_backend()
    report = sync_cluster(backend.provisioner)
    if report.get("failed"):
        note(f"sync_cluster failed for some objects: {report['failed']}")
    return backend


def worker_log_figures(text: str) -> dict[str, Any]:
    hard = re.findall(r"Hard time limit \((\d+)s\) exceeded for ([\w.]+)\[", text)
    # Celery's own warning, whatever the task then did with the exception.
    soft = [t for _, t in re.findall(r"Soft time limit \((\d+)s\) exceeded for ([\w.]+)\[",
                                     text)]
    cycles = [float(s) for s in re.findall(
        r"Task queueing\.tasks\.scheduler_cycle_task\[[^\]]+\] succeeded in ([\d.]+)s", text)]
    return {
        "cycles_hard_killed": sum(1 for _, t in hard if t.endswith("scheduler_cycle_task")),
        "archive_hard_killed": sum(1 for _, t in hard if t.endswith("job_logs_archive_task")),
        "other_hard_killed": sum(1 for _, t in hard if not t.endswith(
            ("scheduler_cycle_task", "job_logs_archive_task"))),
        "cycles_soft_limited": soft.count("queueing.tasks.scheduler_cycle_task"),
        "archive_soft_limited": soft.count("queueing.tasks.job_logs_archive_task"),
        "cycles": cycles,
        "cycles_deferring": len(re.findall(r"left for the next cycle \(budget", text)),
    }


def print_log_figures(tag: str, figures: dict[str, Any]) -> None:
    for key in ("cycles_hard_killed", "cycles_soft_limited", "archive_hard_killed",
                "archive_soft_limited", "other_hard_killed", "cycles_deferring"):
        bench(f"{tag}_{key}", figures[key], "count")
    cycles = sorted(figures["cycles"])
    if len(cycles) >= 2:
        bench(f"{tag}_cycles_completed", len(cycles), "count")
        bench(f"{tag}_cycle_p95_s", statistics.quantiles(cycles, n=20)[18], "s")
        bench(f"{tag}_cycle_max_s", cycles[-1], "s")


def logs_missing(ids: list[int]) -> tuple[int, int, int, int]:
    """(replicas of an attempt that ran whose log is not kept, of which of the failing
    pairs, kept ones that hold no line of the pod's own, kept ones of an attempt that
    never ran). An attempt ran when fairq recorded it RUNNING (its event); every attempt
    is judged, not only the last (a preempted attempt's log is kept too)."""
    from queueing.models import Job, JobEvent, JobLog
    from queueing.services.logs import log_storage

    replicas = dict(Job.objects.filter(pk__in=ids).values_list("pk", "replicas"))
    ran = set(JobEvent.objects.filter(job_id__in=ids, to_status="RUNNING")
              .values_list("job_id", "attempt"))
    kept = {(j, a, r): s for j, a, r, s in JobLog.objects.filter(
        job_id__in=ids, final=True).values_list("job_id", "attempt", "replica", "stored")}
    missing = [(pk, a, r, replicas[pk]) for pk, a in sorted(ran)
               for r in range(replicas[pk]) if (pk, a, r) not in kept]
    storage = log_storage()
    hollow = never_ran = 0
    for (job_id, attempt, replica), name in sorted(kept.items()):
        if (job_id, attempt) not in ran:
            never_ran += 1
            continue
        try:
            with storage.open(name, "rb") as fh:
                data = fh.read()
        except (OSError, ValueError) as exc:
            data = f"(unreadable: {exc})".encode()
        if b"hello from" not in data:
            hollow += 1
            if hollow <= 5:  # what a hollow one holds says why
                note(f"kept log of job {job_id} attempt {attempt} replica {replica} "
                     f"holds no pod line: {data[:300]!r}")
    return len(missing), sum(1 for *_, n in missing if n > 1), hollow, never_ran


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--jobs", type=int, default=1000)
    p.add_argument("--load", type=int, default=8, help="busy loops beside the run")
    p.add_argument("--code", default=str(ROOT), help="the tree the worker and beat run")
    p.add_argument("--label", default="after")
    p.add_argument("--timeout", type=float, default=1500.0)
    p.add_argument("--worker-concurrency", type=int, default=1,
                   help="1 as docker-compose runs the worker, 2 as platform/k8s does")
    p.add_argument("--figures-from", metavar="WORKER_LOG",
                   help="only print the figures read from a worker log of an earlier run")
    args = p.parse_args()
    if args.figures_from:
        print_log_figures(f"k8s_load_{args.label}",
                          worker_log_figures(Path(args.figures_from).read_text(errors="replace")))
        return 0
    # A TERM stops the worker, beat, the busy loops and the control plane too (finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    missing = missing_binaries()
    if missing:
        note(f"envtest binaries missing in {default_bin_dir()}: {', '.join(missing)}")
        print("BENCH k8s_load_skipped 1 flag")
        return 0
    db = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/fairq_bench_k8s_load")
    redis = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    if not recreate_postgres(db):
        return 1
    import redis as redis_lib

    redis_lib.Redis.from_url(redis).flushdb()
    work = Path(f"/tmp/fairq-bench-k8s-load-{args.label}")
    subprocess.run(["rm", "-rf", str(work)], check=True)
    work.mkdir(parents=True)
    label = args.label
    cp = ControlPlane()
    procs: list[subprocess.Popen[bytes]] = []
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        cp.start()
        for i in range(NODES):
            cp.add_gpu_node(f"gpu-h100-{i}", "h100", GPUS_PER_NODE)
        cp.start_fake_kubelet()
        env = dict(os.environ, PYTHONPATH=args.code, DATABASE_URL=db, REDIS_URL=redis,
                   DJANGO_SETTINGS_MODULE="config.settings.dev", DJANGO_DEBUG="0",
                   FAIRQ_CLUSTER_BACKEND="kubernetes", FAIRQ_KUBECONFIG=str(cp.kubeconfig_path),
                   FAIRQ_KUBE_NAMESPACE_PREFIX=PREFIX, FAIRQ_LOG_STORAGE_DIR=str(work / "logs"),
                   FAIRQ_LOG_LEVEL="INFO")
        setup(args, env)
        teams = seed()
        backend = provision()
        note(f"code: {args.code}; {NODES} nodes x {GPUS_PER_NODE} GPUs; control plane up "
             f"in {cp.start_seconds:.1f} s")

        from django.db import connection

        from queueing.backends.k8s_cache import Informer
        from queueing.backends.k8s_manifest import L_WORKLOAD, SELECTOR
        from queueing.models import Job

        pod_seen: dict[str, float] = {}

        def seen(kind: str, old: Any, new: Any) -> None:
            if new is None:
                return
            if (new.get("status") or {}).get("phase") in ("Running", "Succeeded", "Failed"):
                workload = (new["metadata"].get("labels") or {}).get(L_WORKLOAD, "")
                pod_seen.setdefault(workload, time.time())

        observer = Informer("bench-observer", backend.core.list_pod_for_all_namespaces,
                            label_selector=SELECTOR, on_change=seen).start()
        observer.wait_synced(30)

        hogs = start_bounded_load(args.load, args.timeout + 300)
        note(f"{args.load} busy loops started; waiting for the load average to climb")
        deadline = time.monotonic() + 120
        while os.getloadavg()[0] < 8 and time.monotonic() < deadline:
            time.sleep(5)
        note(f"load average {os.getloadavg()[0]:.2f} before the jobs")

        worker_log = open(work / "worker.log", "wb")  # noqa: SIM115  (closed in finally)
        beat_log = open(work / "beat.log", "wb")  # noqa: SIM115
        runner = str(ROOT / "bench" / "k8s_load_worker.py")
        procs.append(subprocess.Popen(
            [sys.executable, runner, "-A", "config", "worker", "-l", "INFO",
             "--concurrency", str(args.worker_concurrency), "-n", f"load-{label}@%h"],
            cwd=args.code, env=env, stdout=worker_log, stderr=subprocess.STDOUT,
            start_new_session=True))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "config", "beat", "-l", "INFO",
             "-s", str(work / "beat-schedule")],
            cwd=args.code, env=env, stdout=beat_log, stderr=subprocess.STDOUT,
            start_new_session=True))
        time.sleep(5)

        ids = queue_jobs(args, teams)
        t0 = time.time()
        note(f"{len(ids)} jobs queued")
        db_seen: dict[str, float] = {}
        loads: list[float] = []
        last_load = 0.0
        end_at = None
        while time.time() - t0 < args.timeout:
            now = time.time()
            for pk, attempt in Job.objects.filter(pk__in=ids, started_at__isnull=False) \
                    .values_list("pk", "attempt"):
                db_seen.setdefault(f"fq-{pk}-{attempt}", now)
            if now - last_load >= 5:
                loads.append(os.getloadavg()[0])
                last_load = now
                final = Job.objects.filter(pk__in=ids, status__in=FINAL).count()
                if len(loads) % 6 == 0:
                    note(f"{now - t0:.0f} s: {final} final, {len(db_seen)} started, "
                         f"load {loads[-1]:.1f}")
                if final == len(ids):
                    end_at = now
                    break
            time.sleep(0.5)
        wall = (end_at or time.time()) - t0
        at_end = logs_missing(ids)
        archive = 15.0
        time.sleep(archive * 4)
        after = logs_missing(ids)
        final = Job.objects.filter(pk__in=ids, status__in=FINAL).count()
        observer.stop()
        connection.close()
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        for hog in hogs:
            hog.kill()
        cp.stop()
    figures = worker_log_figures((work / "worker.log").read_text(errors="replace"))
    lags = sorted(db_seen[w] - t for w, t in pod_seen.items() if w in db_seen)
    tag = f"k8s_load_{label}"
    bench(f"{tag}_busy_loops", args.load, "processes")
    bench(f"{tag}_worker_concurrency", args.worker_concurrency, "processes")
    if loads:
        bench(f"{tag}_load_avg_min", min(loads), "")
        bench(f"{tag}_load_avg_median", statistics.median(loads), "")
        bench(f"{tag}_load_avg_max", max(loads), "")
    bench(f"{tag}_jobs_final", final, "jobs")
    bench(f"{tag}_wall_s", wall, "s")
    print_log_figures(tag, figures)
    if len(lags) >= 2:
        bench(f"{tag}_pod_to_running_lag_p50", statistics.median(lags), "s")
        bench(f"{tag}_pod_to_running_lag_p95", statistics.quantiles(lags, n=20)[18], "s")
        bench(f"{tag}_pod_to_running_lag_max", lags[-1], "s")
        bench(f"{tag}_lag_measured", len(lags), "attempts")
    bench(f"{tag}_logs_missing_at_end", at_end[0], "replicas")
    bench(f"{tag}_logs_missing_after", after[0], "replicas")
    bench(f"{tag}_failed_replica_logs_missing_after", after[1], "replicas")
    bench(f"{tag}_logs_kept_without_pod_lines", after[2], "replicas")
    bench(f"{tag}_logs_kept_of_attempts_never_run", after[3], "replicas")
    note(f"worker log: {work / 'worker.log'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
