"""Kubernetes backend benchmark against a real control plane (tests/envtest).

Questions and goals
  1. How many Jobs per second does the cycle create through the real API server, for
     1,000 admitted jobs? Goal ≥ 100/s and ≥ 0.8× plain concurrent creates measured in
     the same run.
       BENCH k8s_cycle_jobs_created_per_s      the cycle's submit step
                                               (`scheduler.submit_admitted`: launch specs,
                                               manifests, FAIRQ_K8S_SUBMIT_CONCURRENCY
                                               concurrent creates, outcomes, mark submitted),
                                               with the backend's watches running
       BENCH k8s_plain_concurrent_creates_per_s  the same Jobs POSTed by the generated
                                               client method from as many threads
       BENCH k8s_cycle_vs_plain_ratio          the first over the second
       BENCH k8s_cycle_jobs_created_per_s_sequential, k8s_plain_sequential_creates_per_s
                                               the same one at a time (300 jobs): the
                                               cycle before concurrency, and its floor
       BENCH k8s_cycle_generated_jobs_created_per_s  the cycle's submit step as before:
                                               each Job through the generated client
                                               method, its answer parsed
                                               (`KubernetesBackend.raw_creates = False`)
       BENCH k8s_cycle_generated_vs_plain_ratio
     Best of three alternating rounds each (plain, cycle, cycle as before), the CPU
     seconds each took in this process printed beside. By default the controllers run
     (kube-controller-manager makes a pod per Job, kube-scheduler tries them) and the
     machine is loaded: one busy loop per core in a session of its own
     (`_common.start_load`), the load average printed. `--paused`: as before,
     kube-controller-manager and kube-scheduler paused (SIGSTOP) and no busy loops.
  2. How long from a pod's phase change to the job's status in fairq? Goal p95 < 2 s.
     A worker loop runs `scheduler_cycle()` every FAIRQ_CYCLE_INTERVAL_SECONDS (3 s) and
     when the backend's watch kicks it (composition.KickThrottle: one a second, the
     trailing kick kept), as the Celery worker does. An independent pod watch notes
     when each pod turned Running and Succeeded (the fake kubelet's status write, seen
     within milliseconds); the lag is the time until the cycle that moved the job to
     RUNNING / SUCCEEDED finished.
       BENCH k8s_status_lag_p50 / _p95 / _max   seconds, over both transitions of every job
  3. How long does stopping a cycle's preemption victims take when each victim's final log
     read waits on the cluster? 16 victims, each read taking 200 ms (a simulated kubelet
     round trip: the fake kubelet serves no logs), through
     `logs.workloads_stop_keeping_logs` (read, keep in the log storage, stop). Goal: at
     FAIRQ_LOG_READ_CONCURRENCY=8 at most a quarter of the one-at-a-time time. Runs
     without the envtest binaries too.
       BENCH k8s_victim_log_reads_sequential_s  FAIRQ_LOG_READ_CONCURRENCY=1 (as before)
       BENCH k8s_victim_log_reads_concurrent_s  FAIRQ_LOG_READ_CONCURRENCY=8
       BENCH k8s_victim_log_reads_speedup       the first over the second

Needs the envtest binaries (tests/envtest/build.sh); without them it prints why and
`BENCH k8s_skipped 1 flag`, and exits 0. Database: $DATABASE_URL, or a fresh SQLite file
in /tmp. Run: `.venv/bin/python bench/bench_k8s.py [--paused] [--only creates|lag|logs]`
(about three minutes).
"""

from __future__ import annotations

import os
import signal
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
from _common import bench, note, setup_django_sqlite, start_load  # noqa: E402  (bench/ is sys.path[0])

from tests.envtest.cluster import ControlPlane, default_bin_dir, missing_binaries  # noqa: E402

CREATE_JOBS = 1000
SEQ_JOBS = 300
ROUNDS = 3
LAG_JOBS = 40
LOG_VICTIMS = 16
LOG_READ_SECONDS = 0.2
NODES = 3
GPUS_PER_NODE = 8


def setup_django() -> None:
    setup_django_sqlite("fairq_bench_k8s")


def admitted_jobs(n: int, *, team_slug: str, offset: int) -> None:
    """`n` jobs ADMITTED and not yet submitted, as step 4 of the cycle leaves them; their
    GPU type selects no node, so their pods stay Pending (the create path is measured,
    not the fake kubelet)."""
    from accounts.models import Team
    from queueing.models import GpuType, Job, Tier

    team = Team.objects.get_or_create(slug=team_slug, defaults={"name": team_slug})[0]
    gpu = GpuType.objects.get_or_create(slug="nowhere", defaults={
        "name": "nowhere", "node_labels": {"fairq.io/gpu-type": "nowhere"}})[0]
    tier = Tier.objects.get_or_create(slug="bench", defaults={
        "name": "bench", "rank": 7, "priority_class_name": "fairq-bench",
        "priority_value": 10})[0]
    now = datetime.now(UTC)
    Job.objects.bulk_create([
        Job(team=team, name=f"c{offset + i}", image="registry.invalid/bench:1",
            command=["run"], gpu_type=gpu, gpus_per_replica=1, tier=tier,
            max_runtime_seconds=600, status="ADMITTED", admitted_at=now, created_at=now,
            placement=["gpu-nowhere-0"])
        for i in range(n)], batch_size=500)


def plain_creates(api: Any, namespace: str, bodies: list[dict[str, Any]],
                  concurrency: int) -> float:
    """Seconds to POST `bodies` with the generated client method from `concurrency`
    threads (no fairq code: the floor for the same Jobs on the same API server)."""
    from kubernetes import client

    batch = client.BatchV1Api(api)

    def create(body: dict[str, Any]) -> None:
        resp = batch.create_namespaced_job(namespace, body, _preload_content=False)
        resp.read()  # the answer is read (not parsed) before the connection goes back
        resp.release_conn()

    t0 = time.perf_counter()
    if concurrency == 1:
        for body in bodies:
            create(body)
    else:
        with ThreadPoolExecutor(concurrency) as pool:
            list(pool.map(create, bodies))
    return time.perf_counter() - t0


def bench_creates(cp: ControlPlane, *, paused: bool) -> None:
    from django.conf import settings

    from queueing.backends.k8s_api import api_client_from_config
    from queueing.backends.kubernetes import KubernetesBackend
    from queueing.models import Job
    from queueing.services.scheduler import CycleResult, launch_spec, submit_admitted

    concurrency = settings.FAIRQ_K8S_SUBMIT_CONCURRENCY
    kubeconfig = str(cp.kubeconfig_path)
    backend = KubernetesBackend(
        api_client_from_config(kubeconfig=kubeconfig, pool_size=concurrency + 8),
        namespace_prefix="bench-", submit_concurrency=concurrency)
    backend.wait_synced(30)  # the watches run, as in the worker
    plain_api = api_client_from_config(kubeconfig=kubeconfig, pool_size=concurrency + 8)
    note(f"{CREATE_JOBS} admitted jobs per round, FAIRQ_K8S_SUBMIT_CONCURRENCY={concurrency}")

    def cycle_round(slug: str, workers: int, *, raw: bool = True) -> tuple[float, float]:
        """Seconds (wall, this process's CPU) for the cycle's submit step
        (scheduler.submit_admitted) to create and mark the team's admitted jobs."""
        backend.provisioner.ensure_namespace(slug)  # a team's first job pays this once, not measured
        backend.submit_concurrency = workers
        backend.raw_creates = raw
        result = CycleResult()
        first: list[float] = []
        submit = backend.submit

        def timed_submit(spec: Any, *, now: datetime) -> None:
            if not first:
                first.append(time.perf_counter())
            submit(spec, now=now)

        backend.submit = timed_submit  # type: ignore[method-assign]
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            submit_admitted(backend=backend, now=datetime.now(UTC), result=result)
        finally:
            del backend.submit
        elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
        if first:
            note(f"{slug}: the first create began {first[0] - t0:.2f} s in (the jobs read, "
                 "their launch specs built)")
        left = Job.objects.filter(team__slug=slug, submitted_to_backend_at__isnull=True).count()
        if result.submit_errors or left:
            note(f"{slug}: {len(result.submit_errors)} errors, {left} not marked submitted: "
                 f"{list(result.submit_errors.values())[:3]}")
        return elapsed, cpu

    def plain_round(slug: str, workers: int, n: int) -> tuple[float, float]:
        """The same Jobs as the cycle's first round (fairq's manifests), renamed into
        another namespace."""
        namespace = backend.provisioner.ensure_namespace(slug)
        bodies = []
        for j in Job.objects.filter(team__slug="cyc0").select_related(
                "team", "tier", "gpu_type").order_by("id")[:n]:
            body = backend.manifest(launch_spec(j))
            body["metadata"]["namespace"] = namespace
            bodies.append(body)
        c0 = time.process_time()
        return plain_creates(plain_api, namespace, bodies, workers), time.process_time() - c0

    # --paused: the Job controller and kube-scheduler paused while Jobs are created (each
    # round then runs against none of their work on the Jobs of the rounds before: the
    # create path alone), and no load. Else both run, and busy loops load the machine.
    paused_pids = [cp.pids()[c] for c in ("kube-controller-manager", "kube-scheduler")] \
        if paused else []
    for pid in paused_pids:
        os.kill(pid, signal.SIGSTOP)
    load = [] if paused else start_load(os.cpu_count() or 2)
    try:
        _create_rounds(cycle_round, plain_round, concurrency)
    finally:
        for proc in load:
            proc.kill()
            proc.wait()
        for pid in paused_pids:
            os.kill(pid, signal.SIGCONT)
    plain_api.close()
    backend.close()


def _create_rounds(cycle_round: Any, plain_round: Any, concurrency: int) -> None:
    # Alternate the three, ROUNDS times, so load from elsewhere on the machine (and the
    # controllers working through the Jobs already made) hits them alike; the best
    # round of each counts, every round is printed.
    admitted_jobs(CREATE_JOBS, team_slug="cyc0", offset=0)
    cycle: list[float] = []
    plain: list[float] = []
    generated: list[float] = []
    for r in range(ROUNDS):
        wall, cpu = plain_round(f"plain{r}", concurrency, CREATE_JOBS)
        plain.append(CREATE_JOBS / wall)
        note(f"round {r}: plain {plain[-1]:.0f} jobs/s ({cpu:.2f} s CPU); "
             f"load average {os.getloadavg()[0]:.1f}")
        if r:
            admitted_jobs(CREATE_JOBS, team_slug=f"cyc{r}", offset=r * CREATE_JOBS)
        wall, cpu = cycle_round(f"cyc{r}", concurrency)
        cycle.append(CREATE_JOBS / wall)
        note(f"round {r}: cycle {cycle[-1]:.0f} jobs/s ({cpu:.2f} s CPU)")
        admitted_jobs(CREATE_JOBS, team_slug=f"gen{r}", offset=(r + 20) * CREATE_JOBS)
        wall, cpu = cycle_round(f"gen{r}", concurrency, raw=False)
        generated.append(CREATE_JOBS / wall)
        note(f"round {r}: cycle as before (generated client) {generated[-1]:.0f} jobs/s "
             f"({cpu:.2f} s CPU)")
    bench("k8s_cycle_jobs_created_per_s", max(cycle), "jobs/s")
    bench("k8s_plain_concurrent_creates_per_s", max(plain), "jobs/s")
    bench("k8s_cycle_vs_plain_ratio", max(cycle) / max(plain), "x")
    bench("k8s_cycle_generated_jobs_created_per_s", max(generated), "jobs/s")
    bench("k8s_cycle_generated_vs_plain_ratio", max(generated) / max(plain), "x")
    note(f"load average {os.getloadavg()[0]:.1f} after the rounds")
    # For reference, one after the other: the cycle as it was before concurrency, and
    # plain single-threaded creates.
    admitted_jobs(SEQ_JOBS, team_slug="cycseq", offset=10 * CREATE_JOBS)
    bench("k8s_cycle_jobs_created_per_s_sequential",
          SEQ_JOBS / cycle_round("cycseq", 1)[0], "jobs/s")
    bench("k8s_plain_sequential_creates_per_s",
          SEQ_JOBS / plain_round("plainseq", 1, SEQ_JOBS)[0], "jobs/s")


def bench_lag(cp: ControlPlane) -> None:
    from django.conf import settings
    from django.core.cache import cache
    from django.db import connection

    from accounts.models import Team
    from queueing.backends.k8s_api import api_client_from_config
    from queueing.backends.k8s_cache import Informer
    from queueing.backends.k8s_manifest import L_WORKLOAD, SELECTOR
    from queueing.backends.kubernetes import KubernetesBackend
    from queueing.composition import KickThrottle
    from queueing.models import GpuType, Job, Tier
    from queueing.services.provisioning import gpu_type_refs, sync_cluster
    from queueing.services.scheduler import scheduler_cycle

    note(f"database: {connection.vendor}")
    team = Team.objects.create(slug=f"b{uuid.uuid4().hex[:6]}", name="bench", weight=1.0)
    gpu = GpuType.objects.get_or_create(slug="h100", defaults={
        "name": "H100", "node_labels": {"fairq.io/gpu-type": "h100"}})[0]
    tier = Tier.objects.get_or_create(slug="normal", defaults={
        "name": "Normal", "rank": 100, "priority_class_name": "fairq-bench-normal",
        "priority_value": 1000})[0]

    kicked = threading.Event()

    def send(countdown: float) -> None:  # the worker's kick, its Celery task an Event
        if countdown:
            threading.Timer(countdown, kicked.set).start()
        else:
            kicked.set()

    backend = KubernetesBackend(
        api_client_from_config(kubeconfig=str(cp.kubeconfig_path)),
        namespace_prefix="lag-", gpu_types=gpu_type_refs,
        kick=KickThrottle(send, cache=cache))
    sync_cluster(backend.provisioner)
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


def bench_log_reads() -> None:
    """Question 3: stopping LOG_VICTIMS victims whose log reads take LOG_READ_SECONDS."""
    from django.test.utils import override_settings

    from accounts.models import Team
    from queueing.models import GpuType, Job, Tier
    from queueing.services.logs import workloads_stop_keeping_logs

    team = Team.objects.get_or_create(slug="logs", defaults={"name": "logs"})[0]
    gpu = GpuType.objects.get_or_create(slug="nowhere", defaults={
        "name": "nowhere", "node_labels": {"fairq.io/gpu-type": "nowhere"}})[0]
    tier = Tier.objects.get_or_create(slug="bench", defaults={
        "name": "bench", "rank": 7, "priority_class_name": "fairq-bench",
        "priority_value": 10})[0]

    class SlowLogs:
        def logs(self, name: str, *, tail: int = 100) -> str:
            time.sleep(LOG_READ_SECONDS)
            return f"step 100 loss 0.1\n{name} preempted"

        def stop(self, name: str, *, now: datetime) -> None:
            pass

    took: dict[int, float] = {}
    for concurrency in (1, 8):
        now = datetime.now(UTC)
        jobs = Job.objects.bulk_create([
            Job(team=team, name=f"v{concurrency}-{i}", image="registry.invalid/bench:1",
                command=["run"], gpu_type=gpu, gpus_per_replica=1, tier=tier,
                status="RUNNING", admitted_at=now, started_at=now, created_at=now)
            for i in range(LOG_VICTIMS)])
        names = [f"fq-{j.pk}-1" for j in jobs]
        with override_settings(FAIRQ_LOG_READ_CONCURRENCY=concurrency):
            started = time.perf_counter()
            failed = workloads_stop_keeping_logs(backend=SlowLogs(),  # type: ignore[arg-type]
                                                 names=names, now=now)
            took[concurrency] = time.perf_counter() - started
        assert not failed, failed
    bench("k8s_victim_log_reads_sequential_s", took[1], "s")
    bench("k8s_victim_log_reads_concurrent_s", took[8], "s")
    bench("k8s_victim_log_reads_speedup", took[1] / took[8], "x")


def main() -> int:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--paused", action="store_true",
                        help="pause the controllers and load nothing while Jobs are created")
    parser.add_argument("--only", choices=("creates", "lag", "logs"), default="")
    args = parser.parse_args()
    setup_django()
    if args.only in ("", "logs"):
        bench_log_reads()
    missing = missing_binaries()
    if missing:
        note(f"envtest binaries missing in {default_bin_dir()}: {', '.join(missing)}; "
             "run tests/envtest/build.sh to build them")
        print("BENCH k8s_skipped 1 flag")
        return 0
    if args.only == "logs":
        return 0
    cp = ControlPlane()
    try:
        cp.start()
        note(f"control plane up in {cp.start_seconds:.1f} s")
        for i in range(NODES):
            cp.add_gpu_node(f"gpu-h100-{i}", "h100", GPUS_PER_NODE)
        cp.start_fake_kubelet()
        # Lag first: the creates leave 600 Jobs for the namespace controller to delete.
        if args.only in ("", "lag"):
            bench_lag(cp)
        if args.only in ("", "creates"):
            bench_creates(cp, paused=args.paused)
    finally:
        cp.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
