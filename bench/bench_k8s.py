"""Kubernetes backend benchmark against a real control plane (tests/envtest).

Questions and goals
  1. How many Jobs per second does fairq create through the real API server? Goal ≥ 100/s.
       BENCH k8s_jobs_created_per_s          `KubernetesBackend.submit` one after the
                                             other, as the cycle's submit step does
                                             (manifest, create, namespace cached)
       BENCH k8s_jobs_created_per_s_4threads the same from 4 threads
     The Jobs' pods select no node, so they stay Pending: this measures the create path,
     not the fake kubelet.
  2. How long from a pod's phase change to the job's status in fairq? Goal p95 < 2 s.
     A worker loop runs `scheduler_cycle()` every FAIRQ_CYCLE_INTERVAL_SECONDS (3 s) and
     when the backend's watch kicks it (debounced to one a second, trailing edge), as
     the Celery worker does. An independent pod watch notes when each pod turned Running
     and Succeeded (the fake kubelet's status write, seen within milliseconds); the lag
     is the time until the cycle that moved the job to RUNNING / SUCCEEDED finished.
       BENCH k8s_status_lag_p50 / _p95 / _max   seconds, over both transitions of every job

Needs the envtest binaries (tests/envtest/build.sh); without them it prints why and
`BENCH k8s_skipped 1 flag`, and exits 0. Database: $DATABASE_URL, or a fresh SQLite file
in /tmp. Run: `.venv/bin/python bench/bench_k8s.py` (about a minute).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from _common import bench, note, setup_django_sqlite  # noqa: E402  (bench/ is sys.path[0])

from tests.envtest.cluster import ControlPlane, default_bin_dir, missing_binaries  # noqa: E402

CREATE_JOBS = 300
LAG_JOBS = 40
NODES = 3
GPUS_PER_NODE = 8


def setup_django() -> None:
    setup_django_sqlite("fairq_bench_k8s")


def spec(i: int, *, team: str, node_labels: dict[str, str], seconds: float | None = None) -> Any:
    from queueing.backends.base import LaunchSpec

    env = {} if seconds is None else {"FAIRQ_SIM_SECONDS": str(seconds)}
    return LaunchSpec(
        name=f"fq-{900000 + i}-1", job_id=900000 + i, attempt=1, team=team, tier="bench",
        priority_class_name="", gpu_type="h100", resource_name="nvidia.com/gpu",
        node_labels=node_labels, gpus_per_replica=1, replicas=1,
        image="registry.invalid/bench:1", command=["run"], args=[], env=env,
        max_runtime_seconds=600)


def bench_creates(cp: ControlPlane) -> None:
    from queueing.backends.kubernetes import KubernetesBackend, api_client_from_config

    backend = KubernetesBackend(api_client_from_config(kubeconfig=str(cp.kubeconfig_path)),
                                namespace_prefix="bench-")
    nowhere = {"fairq.io/gpu-type": "nowhere"}
    now = datetime.now(UTC)
    backend.submit(spec(0, team="warm", node_labels=nowhere), now=now)  # namespace, version
    t0 = time.perf_counter()
    for i in range(1, CREATE_JOBS + 1):
        backend.submit(spec(i, team="warm", node_labels=nowhere), now=now)
    seq = time.perf_counter() - t0
    bench("k8s_jobs_created_per_s", CREATE_JOBS / seq, "jobs/s")

    backend.ensure_namespace("par")
    t0 = time.perf_counter()
    with ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda i: backend.submit(spec(i, team="par", node_labels=nowhere),
                                               now=now), range(1, CREATE_JOBS + 1)))
    par = time.perf_counter() - t0
    bench("k8s_jobs_created_per_s_4threads", CREATE_JOBS / par, "jobs/s")
    for ns in ("bench-warm", "bench-par"):
        backend.core.delete_namespace(ns, propagation_policy="Background")
    backend.close()


def bench_lag(cp: ControlPlane) -> None:
    from django.conf import settings
    from django.db import connection

    from accounts.models import Team
    from queueing.backends.k8s_cache import Informer
    from queueing.backends.k8s_manifest import L_WORKLOAD, SELECTOR
    from queueing.backends.k8s_sync import gpu_type_refs, sync_cluster
    from queueing.backends.kubernetes import KubernetesBackend, api_client_from_config
    from queueing.models import GpuType, Job, Tier
    from queueing.services.scheduler import scheduler_cycle

    note(f"database: {connection.vendor}")
    team = Team.objects.create(slug=f"b{uuid.uuid4().hex[:6]}", name="bench", weight=1.0)
    gpu = GpuType.objects.get_or_create(slug="h100", defaults={
        "name": "H100", "node_labels": {"fairq.io/gpu-type": "h100"}})[0]
    tier = Tier.objects.get_or_create(slug="normal", defaults={
        "name": "Normal", "rank": 100, "priority_class_name": "fairq-bench-normal",
        "priority_value": 1000})[0]

    kicked = threading.Event()
    backend = KubernetesBackend(
        api_client_from_config(kubeconfig=str(cp.kubeconfig_path)),
        namespace_prefix="lag-", gpu_types=gpu_type_refs, kick=kicked.set)
    sync_cluster(backend)
    backend.wait_synced(30)

    pod_seen: dict[tuple[str, str], float] = {}

    def seen(kind: str, old: Any, new: Any) -> None:
        if new is None:
            return
        phase = (new.get("status") or {}).get("phase")
        workload = (new["metadata"].get("labels") or {}).get(L_WORKLOAD, "")
        if phase in ("Running", "Succeeded"):
            pod_seen.setdefault((workload, phase), time.time())

    observer = Informer("bench-observer", backend.core.list_pod_for_all_namespaces,
                        label_selector=SELECTOR, on_change=seen).start()
    observer.wait_synced(30)

    db_seen: dict[tuple[str, str], float] = {}
    stop = threading.Event()
    cycles: list[float] = []

    def worker() -> None:
        interval = float(settings.FAIRQ_CYCLE_INTERVAL_SECONDS)
        try:
            while not stop.is_set():
                kicked.wait(interval)
                kicked.clear()
                t0 = time.perf_counter()
                result = scheduler_cycle(backend=backend)
                cycles.append(time.perf_counter() - t0)
                if cycles[-1] > 1.0:
                    note(f"slow cycle: {cycles[-1]:.2f} s {result.timings}")
                done = time.time()
                for pk in result.started:
                    db_seen.setdefault((f"fq-{pk}-1", "Running"), done)
                for pk in result.finished:
                    db_seen.setdefault((f"fq-{pk}-1", "Succeeded"), done)
        finally:
            connection.close()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    now = datetime.now(UTC)
    ids = []
    for i in range(LAG_JOBS):
        j = Job.objects.create(
            team=team, name=f"lag-{i}", image="registry.invalid/bench:1", command=["run"],
            env={"FAIRQ_SIM_SECONDS": str(2 + i % 4)}, gpu_type=gpu, gpus_per_replica=2,
            replicas=1, tier=tier, created_at=now)
        ids.append(j.pk)
    kicked.set()
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if Job.objects.filter(pk__in=ids, status="SUCCEEDED").count() == len(ids):
            break
        time.sleep(0.5)
    stop.set()
    kicked.set()
    thread.join(30)
    observer.stop()
    lags = [db_seen[k] - t for k, t in pod_seen.items() if k in db_seen]
    for phase in ("Running", "Succeeded"):
        some = sorted(db_seen[k] - t for k, t in pod_seen.items() if k in db_seen
                      and k[1] == phase)
        if some:
            note(f"pod {phase} → fairq: p50 {statistics.median(some):.2f} s, "
                 f"max {some[-1]:.2f} s over {len(some)}")
    succeeded = Job.objects.filter(pk__in=ids, status="SUCCEEDED").count()
    note(f"{succeeded}/{len(ids)} jobs succeeded; {len(lags)} transitions measured; "
         f"{len(cycles)} cycles, median {statistics.median(cycles) * 1000:.0f} ms")
    if len(lags) >= 2:
        q = statistics.quantiles(lags, n=20)
        bench("k8s_status_lag_p50", statistics.median(lags), "s")
        bench("k8s_status_lag_p95", q[18], "s")
        bench("k8s_status_lag_max", max(lags), "s")
    backend.core.delete_namespace(f"lag-{team.slug}", propagation_policy="Background")
    backend.close()


def main() -> int:
    missing = missing_binaries()
    if missing:
        note(f"envtest binaries missing in {default_bin_dir()}: {', '.join(missing)}; "
             "run tests/envtest/build.sh to build them")
        print("BENCH k8s_skipped 1 flag")
        return 0
    setup_django()
    cp = ControlPlane()
    try:
        cp.start()
        note(f"control plane up in {cp.start_seconds:.1f} s")
        for i in range(NODES):
            cp.add_gpu_node(f"gpu-h100-{i}", "h100", GPUS_PER_NODE)
        cp.start_fake_kubelet()
        # Lag first: the creates leave 600 Jobs for the namespace controller to delete.
        bench_lag(cp)
        bench_creates(cp)
    finally:
        cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
