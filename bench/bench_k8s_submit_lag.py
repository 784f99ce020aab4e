"""Submit to Job created, at a steady 200 submits a second, on a real control plane
(tests/envtest; docs/performance.md, "A fleet of 5,000 nodes: the Kubernetes path").

Question: from the moment a submit is acknowledged (the submit service returned, its
transaction committed) to the moment its Kubernetes Job exists, how long? Goal: p95
<= 2 s at 200 submits/s.

  - `--submitters` processes (4) call the submit service (`job_submit_with_event`, as
    the API does) on a fixed timetable, together `--rate` a second for `--seconds`
    (30), each noting its acknowledgement time; the service kicks the scheduler on
    commit (`composition.kick`: the real `KickThrottle` over the shared cache, its
    Celery send replaced by a push onto a Redis list);
  - this process runs the worker's loop: `scheduler_cycle()` when kicked (the Redis
    list, the countdown honoured, as Celery's) or when the backend's watches kick, else
    every FAIRQ_CYCLE_INTERVAL_SECONDS;
  - an independent watch (its own process) notes when each fairq Job arrives (its
    ADDED event: creationTimestamp is second-granular).
The nodes hold every job submitted (1 GPU each); kube-controller-manager and
kube-scheduler run (a pod per Job, bound); no kubelet runs the pods (this measures the
path to the Job, not the pods' life).

  BENCH k8s_submit_to_job_p50 / _p95 / _max   seconds, over the jobs submitted
  BENCH k8s_submit_rate_achieved              submits/s the submitters kept up
  BENCH k8s_submit_jobs_not_created           by the end (the drain included)
  BENCH k8s_submit_cycle_p50 / _p95           the worker's cycles meanwhile, seconds
  BENCH calibration_1M_loop                   with the load average

Database: $DATABASE_URL (PostgreSQL: dropped and created), else SQLite in /tmp (one
writer: expect worse). Redis: $REDIS_URL. Run:
`.venv/bin/python bench/bench_k8s_submit_lag.py [--rate 200] [--seconds 30]` (~3 min);
`--before` runs the cycle's steps 1, 4 and 5 as before the fleet work (one transaction
per admission and per status change, no floor for step 5), to alternate with.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note, recreate_postgres  # noqa: E402  (bench/ is sys.path[0])

KICKS = "fairq:bench:submit-lag:kicks"
TEAMS = 8


def django_setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    import django

    django.setup()


def redis_client() -> Any:
    import redis

    return redis.Redis.from_url(os.environ["REDIS_URL"])


# --- the submitters (processes of their own, as web processes are) --------------------

def submitter(index: int, rate: float, seconds: float, start_at: float, out: str) -> None:
    django_setup()
    from django.conf import settings
    from django.contrib.auth import get_user_model

    from queueing import composition
    from queueing.services.jobs import job_input_build, job_submit_with_event

    settings.FAIRQ_KICK_SCHEDULER = True
    r = redis_client()
    composition._send_cycle = lambda countdown: r.rpush(
        KICKS, json.dumps({"due": time.time() + countdown}))
    user = get_user_model().objects.get(username="bench")
    acks: list[tuple[int, float, float]] = []
    n = int(rate * seconds)
    while time.time() < start_at:
        time.sleep(0.001)
    for k in range(n):
        due = start_at + k / rate
        wait = due - time.time()
        if wait > 0:
            time.sleep(wait)
        data = job_input_build(actor=user, team=f"t{(index + k) % TEAMS}",
                               name=f"s{index}-{k}", image="registry.invalid/bench:1",
                               gpu_type="h100", gpus=1, replicas=1, tier="normal")
        job, _, _ = job_submit_with_event(actor=user, data=data)
        acks.append((job.pk, due, time.time()))
    Path(out).write_text(json.dumps(acks))


# --- the independent watch ----------------------------------------------------------------

def watcher(kubeconfig: str, out: str, stop_file: str) -> None:
    from kubernetes import client, config

    from queueing.backends.k8s_cache import Informer

    api = config.new_client_from_config(config_file=kubeconfig)
    seen: dict[str, float] = {}

    def added(kind: str, old: Any, new: Any) -> None:
        if new is not None and kind == "ADDED":
            seen.setdefault(new["metadata"]["name"], time.time())

    informer = Informer("watcher", client.BatchV1Api(api).list_job_for_all_namespaces,
                        label_selector="app.kubernetes.io/managed-by=fairq",
                        on_change=added, watch_seconds=30,
                        transform=lambda o: {"metadata": o["metadata"]}).start()
    informer.wait_synced(30)
    Path(out + ".ready").write_text("1")
    while not Path(stop_file).exists():
        time.sleep(0.2)
    informer.stop()
    Path(out).write_text(json.dumps(seen))


# --- the worker ----------------------------------------------------------------------------

def setup_world(nodes: int) -> None:
    from django.contrib.auth import get_user_model

    from accounts.models import Team
    from queueing.models import GpuType, Tier

    get_user_model().objects.create_superuser("bench", "bench@example.com", "x")
    GpuType.objects.get_or_create(slug="h100", defaults={
        "name": "H100", "node_labels": {"fairq.io/gpu-type": "h100"}})
    Tier.objects.get_or_create(slug="normal", defaults={
        "name": "Normal", "rank": 100, "priority_class_name": "fairq-bench-normal",
        "priority_value": 1000, "open_to_all_teams": True})
    for i in range(TEAMS):
        Team.objects.get_or_create(slug=f"t{i}", defaults={"name": f"t{i}", "weight": 1.0})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--submitters", type=int, default=4)
    parser.add_argument("--drain", type=float, default=30.0)
    parser.add_argument("--child", default="")
    parser.add_argument("--args", default="")
    parser.add_argument("--before", action="store_true",
                        help="the cycle's steps as before the fleet work: one transaction "
                             "per admission and per status change, no submit floor")
    args = parser.parse_args()
    if args.child == "submitter":
        submitter(*json.loads(args.args))
        return 0
    if args.child == "watcher":
        watcher(*json.loads(args.args))
        return 0

    url = os.environ.get("DATABASE_URL", "")
    if not (url.startswith("postgres") and recreate_postgres(url)):
        os.environ["DATABASE_URL"] = "sqlite:////tmp/fairq_bench_k8s_submit_lag.sqlite3"
        Path("/tmp/fairq_bench_k8s_submit_lag.sqlite3").unlink(missing_ok=True)
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/5")
    django_setup()
    from bench_admission import calibrate
    from django.conf import settings
    from django.core.cache import cache
    from django.core.management import call_command
    from django.db import connection

    from queueing.backends.k8s_api import api_client_from_config
    from queueing.backends.kubernetes import KubernetesBackend
    from queueing.composition import KickThrottle
    from queueing.services.provisioning import gpu_type_refs, sync_cluster
    from queueing.services.scheduler import scheduler_cycle
    from tests.envtest.cluster import ControlPlane, default_bin_dir, missing_binaries

    calibrate()
    if args.before:
        from queueing.services import scheduler

        scheduler._BATCHED, scheduler.STATUS_CHUNK, scheduler.SUBMIT_FLOOR = False, 1, 0.0
        scheduler._BATCHED_STATUSES, scheduler._SUBMIT_SCALED = False, False
        print("# before: per-job admissions and status changes, no submit floor", flush=True)
    call_command("migrate", verbosity=0, interactive=False)
    missing = missing_binaries()
    if missing:
        note(f"envtest binaries missing in {default_bin_dir()}: {', '.join(missing)}")
        print("BENCH k8s_skipped 1 flag")
        return 0
    total = int(args.rate * args.seconds)
    per_node = 512
    nodes = max(2, -(-total // per_node) + 1)
    setup_world(nodes)
    note(f"database: {connection.vendor}; {total} jobs at {args.rate:.0f}/s over "
         f"{args.seconds:.0f} s; {nodes} nodes x {per_node} GPUs")
    work = Path(f"/tmp/fairq_submit_lag_{os.getpid()}")
    work.mkdir(exist_ok=True)
    cp = ControlPlane()
    procs: list[subprocess.Popen[bytes]] = []
    stop = threading.Event()
    try:
        cp.start()
        for i in range(nodes):
            # CPU and memory enough for every pod's share (rule A6): GPUs are the limit.
            cp.add_gpu_node(f"gpu-h100-{i}", "h100", per_node, max_pods=per_node + 100,
                            cpu="100000", memory="1000Ti")
        kicked = threading.Event()

        def send(countdown: float) -> None:
            if countdown:
                threading.Timer(countdown, kicked.set).start()
            else:
                kicked.set()

        backend = KubernetesBackend(
            api_client_from_config(kubeconfig=str(cp.kubeconfig_path), pool_size=24),
            namespace_prefix="lag-", gpu_types=gpu_type_refs,
            kick=KickThrottle(send, cache=cache), submit_concurrency=8)
        sync_cluster(backend.provisioner)
        backend.wait_synced(30)
        scheduler_cycle(backend=backend)  # the cluster view published: submits check it

        r = redis_client()
        r.delete(KICKS)

        def kicks() -> None:  # the submitters' kicks, as Celery would deliver them
            while not stop.is_set():
                item = r.blpop([KICKS], timeout=1)
                if item is None:
                    continue
                due = json.loads(item[1])["due"]
                send(max(0.0, due - time.time()))

        threading.Thread(target=kicks, daemon=True).start()
        cycles: list[float] = []

        def worker() -> None:
            interval = float(settings.FAIRQ_CYCLE_INTERVAL_SECONDS)
            try:
                while not stop.is_set():
                    kicked.wait(interval)
                    kicked.clear()
                    t0 = time.perf_counter()
                    try:
                        result = scheduler_cycle(backend=backend)
                    except Exception as exc:
                        note(f"cycle failed: {type(exc).__name__}: {exc}")
                        result = None
                    cycles.append(time.perf_counter() - t0)
                    if result is not None and cycles[-1] > 2.0:
                        note(f"slow cycle {cycles[-1]:.1f} s: admitted {len(result.admitted)}, "
                             f"deferred {result.deferred}, timings " + ", ".join(
                                 f"{k} {v:.2f}" for k, v in result.timings.items()))
            finally:
                connection.close()

        watch_out = str(work / "watch.json")
        stop_file = str(work / "stop")
        procs.append(subprocess.Popen([sys.executable, __file__, "--child", "watcher",
                                       "--args", json.dumps([str(cp.kubeconfig_path),
                                                             watch_out, stop_file])]))
        deadline = time.monotonic() + 60
        while not Path(watch_out + ".ready").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        thread = threading.Thread(target=worker, daemon=True)
        thread.start()
        start_at = time.time() + 3
        outs = []
        for i in range(args.submitters):
            out = str(work / f"acks{i}.json")
            outs.append(out)
            procs.append(subprocess.Popen([sys.executable, __file__, "--child", "submitter",
                                           "--args", json.dumps([
                                               i, args.rate / args.submitters, args.seconds,
                                               start_at, out])]))
        loads = []
        while any(p.poll() is None for p in procs[1:]):
            loads.append(os.getloadavg()[0])
            time.sleep(2)
        note(f"submitters done {time.time() - start_at:.1f} s after the start")
        time.sleep(args.drain)
        stop.set()
        kicked.set()
        thread.join(60)
        Path(stop_file).write_text("1")
        procs[0].wait(60)
        seen = json.loads(Path(watch_out).read_text())
        acks = [a for out in outs for a in json.loads(Path(out).read_text())]
        lags = sorted(seen[f"fq-{pk}-1"] - ack for pk, _, ack in acks if f"fq-{pk}-1" in seen)
        missing_jobs = len(acks) - len(lags)
        span = max(a[2] for a in acks) - min(a[2] for a in acks)
        behind = [ack - due for _, due, ack in acks]
        note(f"{len(acks)} submits acknowledged over {span:.1f} s; the timetable's lag "
             f"p50 {statistics.median(behind):.3f} s, max {max(behind):.2f} s; "
             f"load average min/median/max {min(loads):.1f}/{statistics.median(loads):.1f}/"
             f"{max(loads):.1f}; {len(cycles)} cycles")
        if len(lags) >= 2:
            q = statistics.quantiles(lags, n=20)
            bench("k8s_submit_to_job_p50", statistics.median(lags), "s")
            bench("k8s_submit_to_job_p95", q[18], "s")
            bench("k8s_submit_to_job_max", lags[-1], "s")
            # By the second of the run (does the lag grow as the running set does?)
            t0 = min(a[2] for a in acks)
            by: dict[int, list[float]] = {}
            for pk, _, ack in acks:
                if f"fq-{pk}-1" in seen:
                    by.setdefault(int((ack - t0) // 10), []).append(seen[f"fq-{pk}-1"] - ack)
            note("p95 by 10 s of the run: " + ", ".join(
                f"{k * 10}s: {statistics.quantiles(v, n=20)[18]:.2f}"
                for k, v in sorted(by.items()) if len(v) >= 2))
        bench("k8s_submit_rate_achieved", len(acks) / max(span, 1e-9), "submits/s")
        bench("k8s_submit_jobs_not_created", missing_jobs, "jobs")
        if len(cycles) >= 2:
            bench("k8s_submit_cycle_p50", statistics.median(cycles), "s")
            bench("k8s_submit_cycle_p95", statistics.quantiles(cycles, n=20)[18], "s")
        backend.close()
    finally:
        stop.set()
        for p in procs:
            if p.poll() is None:
                p.kill()
        cp.stop()
    calibrate()
    return 0


if __name__ == "__main__":
    sys.exit(main())
