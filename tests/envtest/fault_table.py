"""The fault table (docs/kubernetes.md, "Tests"): fairq on a real control plane (tests/envtest) with faults
injected, each row counted from the database and the cluster afterwards.

    lost            jobs fairq holds (ADMITTED/RUNNING) with neither Job nor pod left
    duplicate       jobs charged for more than one attempt, or with two live Jobs
    falsely failed  jobs FAILED that the fault gave no reason to fail (a 422 or a 403
                    past its bound fails the jobs it hits; a Job deleted behind fairq's
                    back fails its running job: those are expected)
    leaked          fairq pods still running once every job ended, and pods that ran
                    for an attempt no usage record charges
    stuck           jobs not in a final state when the row's time is up
    foreign         Jobs someone else made under fairq's names that fairq adopted,
                    charged or deleted (the names-taken rows; 0 elsewhere)

Rows (`FAULTS`): baseline; the Job controller frozen (SIGSTOP) past the pod-create
timeout; the apiserver frozen mid-submit; the cycle process killed with SIGKILL before
and during submission (a forked child runs the cycle); 403 on create for a while, and
past its bound; 422 on create; Jobs deleted behind fairq's back (background and orphan
propagation); pods deleted behind fairq's back; a node NotReady; Job names taken
beforehand by someone else (their pods run: the attempt fails "fairq did not create
it", nothing is charged for them, their Jobs are left alone); names held by Jobs being
deleted (someone else's and fairq's own, kept by a finalizer: requeued at once as a new
attempt that succeeds); a node deleted while jobs run on it (its pods are force-deleted
at once, as the pod garbage collector would ~40 s later: their run there is charged and
the Job controller runs them again elsewhere); multi-replica jobs (2 x 1 GPU) whose
replica 1's Job is deleted behind fairq's back (the attempt fails, replica 0 is
stopped), whose replica 1's pod is deleted (replaced, the attempt goes on), whose replica
1 fails (the attempt fails naming it) and whose Service is deleted (the attempts
finish). Each row may add its own counts
(`Ctx.checks`); a check that cannot fail is a defect, so each was seen non-zero with
the fix it guards broken (docs/kubernetes.md, "Tests and benchmark").

By hand (starts its own control plane through pytest's fixtures; prints the table):

    export DATABASE_URL=postgres://... REDIS_URL=redis://... FAIRQ_REQUIRE_ENVTEST=1
    .venv/bin/python tests/envtest/fault_table.py --jobs 20 --freeze 30

At a small scale (3 jobs a row, without the `SLOW` rows) it runs as
`test_the_fault_table_is_all_zeros` in test_k8s_faults.py. At a larger scale (`--jobs
100`) a row's jobs run in waves of `AT_ONCE` and its timeouts grow with it.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

CONTROLLER_MANAGER = "kube-controller-manager"
APISERVER = "kube-apiserver"
FINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
# The GPUs the vision team's jobs can hold at once (two 8-GPU H100 nodes; its quota, 8
# nominal + 8 borrowed): at a larger scale a row's jobs run in waves of this many.
AT_ONCE = 16
_SECOND = timedelta(seconds=1)


@dataclass
class Row:
    fault: str
    jobs: int
    lost: int = 0
    duplicate: int = 0
    falsely_failed: int = 0
    leaked: int = 0
    stuck: int = 0
    foreign: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def zero(self) -> bool:
        return not (self.lost or self.duplicate or self.falsely_failed or self.leaked
                    or self.stuck or self.foreign)


@dataclass
class Ctx:
    kube: Any  # test_k8s_backend.Kube
    world: Any
    plane: Any  # cluster.ControlPlane
    settings: Any
    jobs: int
    freeze_seconds: float
    # Jobs a fault saw stuck before it lifted itself (a refusal not given back in time).
    stuck_during: int = 0
    # uids of Jobs "someone else" made under fairq's names: not fairq's, so their pods
    # are neither leaks nor duplicates; the row's own checks judge what fairq did to them.
    foreign_uids: set[str] = field(default_factory=set)
    # A row's own counts, run by `measure` after the common ones; then its cleanups.
    checks: list[Callable[[Row], None]] = field(default_factory=list)
    cleanups: list[Callable[[], None]] = field(default_factory=list)
    # Run once the row's jobs settled, before the final cycles and the counting: the
    # fault lifted (someone else lets go of what they held).
    lifts: list[Callable[[], None]] = field(default_factory=list)


def _submit(ctx: Ctx, n: int, **overrides: Any) -> list[int]:
    from tests.envtest.test_k8s_backend import submit

    body: dict[str, Any] = {"gpus": 1, "env": {"FAIRQ_SIM_SECONDS": "1"}}
    body.update(overrides)
    return [submit(ctx.world, **body) for _ in range(n)]


def _cycles(seconds: float) -> None:
    from queueing.services.scheduler import scheduler_cycle

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        scheduler_cycle()
        time.sleep(0.2)


def _states(pks: Sequence[int]) -> dict[int, str]:
    from queueing.models import Job

    return dict(Job.objects.filter(pk__in=pks).values_list("pk", "status"))


def _settle(pks: Sequence[int], timeout: float) -> None:
    from queueing.services.scheduler import scheduler_cycle

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        scheduler_cycle()
        if all(s in FINAL for s in _states(pks).values()):
            return
        time.sleep(0.25)


def _wait(predicate: Callable[[], Any], timeout: float = 30.0) -> None:
    from queueing.services.scheduler import scheduler_cycle

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        scheduler_cycle()
        time.sleep(0.25)


def _running(pks: Sequence[int]) -> bool:
    return all(s in ("RUNNING", *FINAL) for s in _states(pks).values())


def _killed_cycle(ctx: Ctx, *, after_creates: int) -> None:
    """Run one scheduler cycle in a forked child that kills itself with SIGKILL after
    `after_creates` Job creates (0: after admitting, before the first create)."""
    from django.db import connections

    from queueing.services.scheduler import scheduler_cycle

    class KillAt:
        def __init__(self, inner: Any) -> None:
            self.inner, self.done = inner, 0

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def submit(self, spec: Any, *, now: datetime) -> None:
            if self.done >= after_creates:
                os.kill(os.getpid(), signal.SIGKILL)
            self.inner.submit(spec, now=now)
            self.done += 1
            if self.done >= after_creates:
                os.kill(os.getpid(), signal.SIGKILL)

    connections.close_all()  # the child opens its own
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child dies by SIGKILL
        try:
            scheduler_cycle(backend=KillAt(ctx.kube.backend))
        finally:
            os._exit(3)  # not killed: the row will show it (nothing was submitted)
    _, status = os.waitpid(pid, 0)
    if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        raise AssertionError(f"the cycle child was not killed (status {status})")


# --- the faults: each submits its jobs, injects, and returns (jobs, expected to fail) ----

def baseline(ctx: Ctx) -> tuple[list[int], set[int]]:
    return _submit(ctx, ctx.jobs), set()


def slow_controller(ctx: Ctx) -> tuple[list[int], set[int]]:
    ctx.kube.backend.pod_create_timeout_seconds = 2
    pks = _submit(ctx, ctx.jobs)
    with ctx.plane.frozen(CONTROLLER_MANAGER):
        _cycles(max(4.0, ctx.freeze_seconds / 3))
    return pks, set()


def apiserver_frozen(ctx: Ctx) -> tuple[list[int], set[int]]:
    from queueing.services.scheduler import scheduler_cycle

    pks = _submit(ctx, ctx.jobs)

    def freeze() -> None:
        with ctx.plane.frozen(APISERVER):
            time.sleep(ctx.freeze_seconds)

    t = threading.Timer(0.05, freeze)  # while the cycle below creates Jobs
    t.start()
    scheduler_cycle()
    t.join()
    return pks, set()


def killed_before_submit(ctx: Ctx) -> tuple[list[int], set[int]]:
    pks = _submit(ctx, ctx.jobs)
    _killed_cycle(ctx, after_creates=0)
    return pks, set()


def killed_during_submit(ctx: Ctx) -> tuple[list[int], set[int]]:
    pks = _submit(ctx, ctx.jobs)
    _killed_cycle(ctx, after_creates=max(1, min(ctx.jobs, AT_ONCE) // 2))
    return pks, set()


def _no_jobs_quota(ctx: Ctx) -> str:
    namespace: str = ctx.kube.backend.provisioner.ensure_namespace("vision")
    ctx.kube.core.create_namespaced_resource_quota(namespace, {
        "metadata": {"name": "no-jobs"}, "spec": {"hard": {"count/jobs.batch": "0"}}})
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (ctx.kube.core.read_namespaced_resource_quota(
            "no-jobs", namespace).status.hard or {}).get("count/jobs.batch") != "0":
        time.sleep(0.1)
    return namespace


def forbidden_for_a_while(ctx: Ctx) -> tuple[list[int], set[int]]:
    ctx.settings.FAIRQ_K8S_SUBMIT_REFUSED_SECONDS = 600
    namespace = _no_jobs_quota(ctx)
    pks = _submit(ctx, ctx.jobs)
    _cycles(3)
    ctx.kube.core.delete_namespaced_resource_quota("no-jobs", namespace)
    return pks, set()


def forbidden_past_the_bound(ctx: Ctx) -> tuple[list[int], set[int]]:
    ctx.settings.FAIRQ_K8S_SUBMIT_REFUSED_SECONDS = 3
    namespace = _no_jobs_quota(ctx)
    pks = _submit(ctx, ctx.jobs)
    # Refused in waves of AT_ONCE, each failed 3 s after its first refusal.
    _wait(lambda: all(s == "FAILED" for s in _states(pks).values()),
          timeout=30 + 6 * ctx.jobs / AT_ONCE)
    # Still holding GPUs 30 s into a refusal bounded at 3 s: stuck.
    ctx.stuck_during = sum(s != "FAILED" for s in _states(pks).values())
    ctx.kube.core.delete_namespaced_resource_quota("no-jobs", namespace)
    ctx.settings.FAIRQ_K8S_SUBMIT_REFUSED_SECONDS = 600
    return pks, set(pks)


def invalid_on_create(ctx: Ctx) -> tuple[list[int], set[int]]:
    backend = ctx.kube.backend
    real = backend.manifest
    pks = _submit(ctx, ctx.jobs)
    bad = set(pks[::2])

    def manifest(spec: Any) -> dict[str, Any]:
        body: dict[str, Any] = real(spec)
        if spec.job_id in bad:
            body["metadata"]["labels"]["fairq.io/broken"] = "not a label value!"
        return body

    backend.manifest = manifest
    try:
        _settle(pks, 30 + 2 * ctx.jobs / AT_ONCE)
    finally:
        del backend.manifest
    return pks, bad


def _jobs_deleted(ctx: Ctx, propagation: str) -> tuple[list[int], set[int]]:
    # The jobs whose Job is deleted run long: pods left behind would still run at the end.
    # (At most half the GPUs, so they all run while the short ones pass through.)
    n_hit = min((ctx.jobs + 1) // 2, AT_ONCE // 2)
    hit = set(_submit(ctx, n_hit, env={"FAIRQ_SIM_SECONDS": "600"}))
    pks = sorted(hit | set(_submit(ctx, ctx.jobs - n_hit, env={"FAIRQ_SIM_SECONDS": "4"})))
    _wait(lambda: _running(hit), timeout=60)
    for pk in hit:
        ctx.kube.batch.delete_namespaced_job(f"fq-{pk}-1", ctx.kube.ns("vision"),
                                             propagation_policy=propagation)
    return pks, hit


def jobs_deleted(ctx: Ctx) -> tuple[list[int], set[int]]:
    return _jobs_deleted(ctx, "Background")


def jobs_deleted_orphaning_pods(ctx: Ctx) -> tuple[list[int], set[int]]:
    ctx.kube.backend.orphan_pod_grace_seconds = 2
    return _jobs_deleted(ctx, "Orphan")


def pods_deleted(ctx: Ctx) -> tuple[list[int], set[int]]:
    pks = _submit(ctx, ctx.jobs, env={"FAIRQ_SIM_SECONDS": "4"})
    _wait(lambda: _running(pks))
    for pk in pks[::2]:
        for pod in ctx.kube.pods("vision", f"fq-{pk}-1"):
            ctx.kube.core.delete_namespaced_pod(pod["metadata"]["name"],
                                                ctx.kube.ns("vision"), grace_period_seconds=0)
    return pks, set()


def node_not_ready(ctx: Ctx) -> tuple[list[int], set[int]]:
    from tests.envtest.cluster import DEFAULT_GPU_NODES

    pks = _submit(ctx, ctx.jobs, env={"FAIRQ_SIM_SECONDS": "3"})
    _wait(lambda: _running(pks))
    node = DEFAULT_GPU_NODES[0][0]
    ready = {"type": "Ready", "status": "False", "reason": "FaultTable",
             "message": "marked NotReady by the fault table"}
    ctx.kube.core.patch_node_status(node, {"status": {"conditions": [ready]}})
    return pks, set()


# --- multi-replica workloads: all or nothing -------------------------------------

def _pairs(ctx: Ctx, n: int, seconds: str) -> list[int]:
    """`n` 2-replica jobs of 1 GPU per replica."""
    return _submit(ctx, n, replicas=2, env={"FAIRQ_SIM_SECONDS": seconds})


def replica_job_deleted(ctx: Ctx) -> tuple[list[int], set[int]]:
    """Replica 1's Job of half the 2-replica jobs is deleted behind fairq's back while
    they run (long): replica 0 would wait for its peer for ever. The attempt FAILS ("replica
    1's Kubernetes Job was deleted outside fairq"), the replica left is stopped, the run is
    charged; the others succeed."""
    n_hit = max(1, min((ctx.jobs + 1) // 2, AT_ONCE // 4))
    hit = set(_pairs(ctx, n_hit, "600"))
    pks = sorted(hit | set(_pairs(ctx, max(0, ctx.jobs - n_hit), "3")))
    _wait(lambda: _running(hit), timeout=60)
    ns = ctx.kube.ns("vision")
    _still(lambda: all(ctx.kube.backend.jobs.get(f"{ns}/fq-{pk}-1-1") for pk in hit),
           what="the replica Jobs in fairq's watch cache")
    for pk in hit:
        ctx.kube.batch.delete_namespaced_job(f"fq-{pk}-1-1", ns,
                                             propagation_policy="Background")

    def check(row: Row) -> None:
        from queueing.models import Job

        for j in Job.objects.filter(pk__in=hit):
            if j.status == "FAILED" and "replica 1's Kubernetes Job was deleted" not in j.message:
                row.falsely_failed += 1
                row.notes.append(f"#{j.pk} FAILED for another reason: {j.message[:120]}")

    ctx.checks.append(check)
    return pks, hit


def replica_pod_deleted(ctx: Ctx) -> tuple[list[int], set[int]]:
    """Replica 1's pod of every other 2-replica job is deleted (evicted) while it runs: the
    Job controller replaces it, as it does a single replica's (the Job's backoffLimit 0
    counts failures, not deletions), and the attempt goes on with the restart counted."""
    pks = _pairs(ctx, ctx.jobs, "4")
    _wait(lambda: _running(pks))
    for pk in pks[::2]:
        for pod in ctx.kube.pods("vision", f"fq-{pk}-1"):
            if pod["metadata"]["labels"].get("fairq.io/replica") == "1":
                ctx.kube.core.delete_namespaced_pod(pod["metadata"]["name"],
                                                    ctx.kube.ns("vision"),
                                                    grace_period_seconds=0)
    return pks, set()


def replica_failed(ctx: Ctx) -> tuple[list[int], set[int]]:
    """Replica 1 of every other 2-replica job exits 3 (its pod Failed); its peer would wait
    in the collective for ever. The attempt FAILS naming the replica and the peer is
    stopped; the others succeed."""
    bad = set(_submit(ctx, (ctx.jobs + 1) // 2, replicas=2, env={
        "FAIRQ_SIM_SECONDS": "2", "FAIRQ_SIM_FAIL_REPLICA": "1", "FAIRQ_SIM_EXIT_CODE": "3"}))
    pks = sorted(bad | set(_pairs(ctx, ctx.jobs - len(bad), "2")))

    def check(row: Row) -> None:
        from queueing.models import Job

        for j in Job.objects.filter(pk__in=bad):
            if j.status == "FAILED" and "replica 1 failed: exit code 3" not in j.message:
                row.falsely_failed += 1
                row.notes.append(f"#{j.pk} FAILED for another reason: {j.message[:120]}")

    ctx.checks.append(check)
    return pks, bad


def service_deleted(ctx: Ctx) -> tuple[list[int], set[int]]:
    """The headless Service of every 2-replica job is deleted while they run (after the
    rendezvous): fairq does not make it again (replica 0's address is needed only to
    join); the attempts finish, nothing is left behind."""
    pks = _pairs(ctx, ctx.jobs, "4")
    _wait(lambda: _running(pks))
    for pk in pks:
        try:
            ctx.kube.core.delete_namespaced_service(f"fq-{pk}-1", ctx.kube.ns("vision"),
                                                    _preload_content=False).release_conn()
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                raise
    return pks, set()


def _still(predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> None:
    """Wait for `predicate` without running scheduler cycles (the fault is being set up)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"the fault table timed out waiting for {what}")
        time.sleep(0.2)


def _foreign_job(ctx: Ctx, pk: int, *, runs: bool,
                 finalizers: Sequence[str] = ()) -> dict[str, Any]:
    """A Job named as fairq would name attempt 1 of job `pk`, with fairq's labels, made by
    someone else (no owner seal) and asking for 2 GPUs where fairq admitted 1. When `runs`,
    its pod is scheduled on an H100 node and runs 3 s; else it waits on no node."""
    from tests.envtest.cluster import GPU_TAINT

    name = f"fq-{pk}-1"
    labels = {"app.kubernetes.io/managed-by": "fairq", "fairq.io/workload": name,
              "fairq.io/job-id": str(pk), "fairq.io/attempt": "1", "fairq.io/team": "vision",
              "fairq.io/tier": "normal", "fairq.io/gpu-type": "h100"}
    body = {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "labels": labels, "finalizers": list(finalizers),
                     "annotations": {"fairq.io/job-id": str(pk), "fairq.io/attempt": "1"}},
        "spec": {"backoffLimit": 0, "template": {
            "metadata": {"labels": labels},
            "spec": {"restartPolicy": "Never",
                     "nodeSelector": {"fairq.io/gpu-type": "h100" if runs else "nowhere"},
                     "tolerations": [{**GPU_TAINT, "operator": "Equal"}],
                     "containers": [{"name": "main", "image": "someone.example/else:1",
                                     "env": [{"name": "FAIRQ_SIM_SECONDS", "value": "3"}],
                                     "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
        }},
    }
    created = ctx.kube.batch.create_namespaced_job(ctx.kube.ns("vision"), body)
    ctx.foreign_uids.add(created.metadata.uid)
    return {"name": name, "uid": created.metadata.uid}


def names_taken(ctx: Ctx) -> tuple[list[int], set[int]]:
    """Every third job's name is taken by a Job fairq did not create, whose pod runs (so
    fairq could charge or adopt it): that attempt must FAIL with "fairq did not create"
    and nothing be charged for it, the foreign Job be left alone, the rest run."""
    from queueing.models import Job, UsageRecord

    pks = _submit(ctx, ctx.jobs, env={"FAIRQ_SIM_SECONDS": "2"})
    taken = set(pks[::3])
    foreign = {pk: _foreign_job(ctx, pk, runs=True) for pk in taken}
    ns = ctx.kube.ns("vision")

    def foreign_pods_started() -> bool:
        started = {int(p["metadata"]["labels"]["fairq.io/job-id"]) for p in _pods(ctx)
                   if _started(p) and _owner_uid(p) in ctx.foreign_uids}
        return started >= taken

    # Their pods run before fairq's first cycle (and while it runs): the charge check
    # below is only worth something if there was something to charge.
    _still(foreign_pods_started, what="the foreign Jobs' pods to start")
    _still(lambda: all(ctx.kube.backend.jobs.get(f"{ns}/{f['name']}") for f in foreign.values()),
           what="the foreign Jobs in fairq's watch cache")

    def check(row: Row) -> None:
        jobs = {j.pk: j for j in Job.objects.filter(pk__in=taken)}
        charged = set(UsageRecord.objects.filter(job_id__in=taken, attempt=1).values_list(
            "job_id", flat=True))
        there = {j["metadata"]["uid"] for j in ctx.kube.jobs("vision")}
        for pk in sorted(taken):
            j = jobs[pk]
            if j.status == "FAILED" and "fairq did not create" not in j.message:
                row.falsely_failed += 1
                row.notes.append(f"#{pk} FAILED for another reason: {j.message[:120]}")
            elif j.status != "FAILED" or j.attempt != 1:
                row.foreign += 1
                row.notes.append(f"#{pk} {j.status} attempt {j.attempt}: the foreign Job "
                                 "was adopted or the job not failed")
            if pk in charged:
                row.foreign += 1
                row.notes.append(f"#{pk} charged for the foreign Job's pod")
            if foreign[pk]["uid"] not in there:
                row.foreign += 1
                row.notes.append(f"#{pk}: fairq deleted the foreign Job")

    ctx.checks.append(check)
    return pks, taken


def names_taken_being_deleted(ctx: Ctx) -> tuple[list[int], set[int]]:
    """Every third job's name is held by a Job being deleted (a finalizer keeps it listed
    with a deletionTimestamp), half of them made by someone else (background deletion),
    half fairq's own (sealed, as a crashed cycle leaves it; foreground deletion): each
    is requeued at once as attempt 2, with the reason, and succeeds; nothing adopts a
    Job on its way out."""
    from dataclasses import replace

    from queueing.models import Job, JobEvent
    from queueing.services.scheduler import launch_spec

    pks = _submit(ctx, ctx.jobs, env={"FAIRQ_SIM_SECONDS": "2"})
    held = pks[::3]
    ns = ctx.kube.ns("vision")
    names = []
    for i, pk in enumerate(held):
        if i % 2:
            name = _foreign_job(ctx, pk, runs=False, finalizers=[_HOLD])["name"]
        else:  # fairq's own, on no node (nothing runs before the deletion)
            job = Job.objects.select_related("team", "tier", "gpu_type").get(pk=pk)
            spec = replace(launch_spec(job), node_labels={"fairq.io/gpu-type": "nowhere"})
            ctx.kube.backend.submit(spec, now=datetime.now(UTC))
            name = spec.name
            ctx.kube.batch.patch_namespaced_job(name, ns,
                                                {"metadata": {"finalizers": [_HOLD]}})
        # fairq's own: foreground (its pending pod goes first, the Job stays); someone
        # else's: background.
        ctx.kube.batch.delete_namespaced_job(
            name, ns, propagation_policy="Background" if i % 2 else "Foreground")
        names.append(name)

    def release() -> None:
        for name in names:
            try:
                ctx.kube.batch.patch_namespaced_job(name, ns, {"metadata": {"finalizers": None}})
            except Exception as exc:
                if getattr(exc, "status", None) != 404:
                    raise

    held_pods: list[str] = []

    def lift() -> None:
        # The holder lets go once the jobs have settled. Pods the Job controller made for
        # fairq's own held Jobs meanwhile (1.20's creates pods for a Job being deleted)
        # go with their Job; those still there after that count as leaked.
        held_pods.extend(p["metadata"]["name"] for p in _pods(ctx)
                         if p["metadata"]["labels"].get("fairq.io/workload") in names
                         and not p["metadata"].get("deletionTimestamp"))
        release()
        _still(lambda: not any(j["metadata"]["name"] in names
                               for j in ctx.kube.jobs("vision")), timeout=60,
               what="the held Jobs to go once released")

    ctx.lifts.append(lift)
    ctx.cleanups.append(release)
    _still(lambda: all((ctx.kube.backend.jobs.get(f"{ns}/{n}") or {}).get("metadata", {})
                       .get("deletionTimestamp") for n in names),
           what="the deletions in fairq's watch cache")

    def check(row: Row) -> None:
        requeued = set(JobEvent.objects.filter(
            job_id__in=held, to_status="QUEUED",
            reason__contains="being deleted").values_list("job_id", flat=True))
        for j in Job.objects.filter(pk__in=held):
            if j.pk not in requeued:
                # Adopted (then waited on, or found vanished and requeued late).
                row.foreign += 1
                row.notes.append(f"#{j.pk} {j.status} on attempt {j.attempt}: not requeued "
                                 "for its Job being deleted (adopted)")
            elif j.status != "SUCCEEDED":
                row.notes.append(f"#{j.pk} {j.status} on attempt {j.attempt}")
        if held_pods:
            row.notes.append(f"{len(held_pods)} pending pods of held Jobs while held "
                             "(gone with their Jobs)")

    ctx.checks.append(check)
    return pks, set()


_HOLD = "faults.fairq.io/hold"


def node_deleted(ctx: Ctx) -> tuple[list[int], set[int]]:
    """An H100 node is deleted while jobs run on it. Its pods are force-deleted at once, as
    the pod garbage collector would ~40 s later (no kubelet is left to end them). The
    jobs it ran end (FAILED with the reason) or run again elsewhere; either way their run
    on the lost node is charged, and nothing is lost, leaked or stuck."""
    from queueing.backends.k8s_manifest import pod_started_at
    from queueing.models import Job, UsageRecord
    from tests.envtest.cluster import DEFAULT_GPU_NODES

    node, gpu_type, gpus = DEFAULT_GPU_NODES[0]
    pks = _submit(ctx, ctx.jobs, env={"FAIRQ_SIM_SECONDS": "9"})

    def on_node() -> dict[int, Any]:
        return {int(p["metadata"]["labels"]["fairq.io/job-id"]): pod_started_at(p)
                for p in _pods(ctx) if (p.get("spec") or {}).get("nodeName") == node
                and _started(p) and (p.get("status") or {}).get("phase") == "Running"}

    def seen_running() -> dict[int, Any]:
        # Running on the node, and fairq has seen them run (RUNNING, started_at set).
        pods = on_node()
        return {pk: t for pk, t in pods.items() if _states([pk]).get(pk) == "RUNNING"}

    _wait(lambda: len(seen_running()) >= min(len(pks), gpus // 2))
    _cycles(3)  # a run on the node long enough to tell apart from its rerun (1 s stamps)
    hit = seen_running()
    core = ctx.kube.core
    deleted_at = datetime.now(UTC)
    core.delete_node(node)
    for pod in _pods(ctx):
        if (pod.get("spec") or {}).get("nodeName") == node:
            try:
                core.delete_namespaced_pod(pod["metadata"]["name"], pod["metadata"]["namespace"],
                                           grace_period_seconds=0)
            except Exception as exc:
                if getattr(exc, "status", None) != 404:
                    raise
    ctx.cleanups.append(lambda: _node_back(ctx, node, gpu_type, gpus))

    def check(row: Row) -> None:
        records: dict[int, list[Any]] = {}
        for r in UsageRecord.objects.filter(job_id__in=hit):
            records.setdefault(r.job_id, []).append(r)
        for pk, started in sorted(hit.items()):
            # Its run on the lost node, from its start to the deletion, is charged.
            if started is None or not any(r.start <= started + _SECOND
                                          and r.end >= deleted_at - _SECOND
                                          for r in records.get(pk, ())):
                row.leaked += 1
                row.notes.append(f"#{pk}: its run on {node} from {started} to the deletion "
                                 f"is not charged ({[(r.start, r.end) for r in records.get(pk, ())]})")
        outcome: dict[str, int] = {}
        for j in Job.objects.filter(pk__in=hit):
            what = f"{j.status} ({j.message[:60]})" if j.status == "FAILED" else j.status
            outcome[what] = outcome.get(what, 0) + 1
        row.notes.append(f"{len(hit)} jobs ran on {node} when it was deleted: " + ", ".join(
            f"{n} {what}" for what, n in sorted(outcome.items())))

    ctx.checks.append(check)
    return pks, set(hit)


def _node_back(ctx: Ctx, node: str, gpu_type: str, gpus: int) -> None:
    from kubernetes.client.exceptions import ApiException

    try:
        ctx.plane.add_gpu_node(node, gpu_type, gpus)
    except ApiException as exc:
        if exc.status != 409:
            raise
    _still(lambda: any(n.name == node for n in ctx.kube.backend.nodes()),
           what=f"{node} back in fairq's capacity")


def _owner_uid(obj: dict[str, Any]) -> str | None:
    refs = obj["metadata"].get("ownerReferences") or ()
    return next((r.get("uid") for r in refs if r.get("kind") == "Job"), None)


FAULTS: dict[str, Callable[[Ctx], tuple[list[int], set[int]]]] = {
    "baseline (no fault)": baseline,
    "Job controller frozen (SIGSTOP), create timeout 2 s": slow_controller,
    "apiserver frozen (SIGSTOP) mid-submit": apiserver_frozen,
    "cycle killed -9 before submission": killed_before_submit,
    "cycle killed -9 during submission": killed_during_submit,
    "403 on create (quota on Jobs), lifted": forbidden_for_a_while,
    "403 on create past its bound (3 s)": forbidden_past_the_bound,
    "422 on create (half the jobs)": invalid_on_create,
    "Jobs deleted behind fairq (background)": jobs_deleted,
    "Jobs deleted behind fairq (orphan)": jobs_deleted_orphaning_pods,
    "pods deleted behind fairq": pods_deleted,
    "a node NotReady": node_not_ready,
    "Job names taken beforehand (1 in 3)": names_taken,
    "Job names taken, those Jobs being deleted": names_taken_being_deleted,
    "a node deleted (its pods force-deleted)": node_deleted,
    "2 replicas: replica 1's Job deleted behind fairq": replica_job_deleted,
    "2 replicas: replica 1's pod deleted (evicted)": replica_pod_deleted,
    "2 replicas: replica 1 fails (exit 3)": replica_failed,
    "2 replicas: the Service deleted behind fairq": service_deleted,
}
# Left out of the small run inside pytest (`test_the_fault_table_is_all_zeros`) for the
# time they take; the script runs them.
SLOW = ("a node deleted (its pods force-deleted)",)


# --- counting --------------------------------------------------------------------------

def measure(ctx: Ctx, fault: str, pks: Sequence[int], expected_failed: set[int],
            seconds: float) -> Row:
    from queueing.models import Job, UsageRecord

    row = Row(fault, len(pks), seconds=seconds)
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=pks)}
    k8s_jobs = [j for j in ctx.kube.jobs("vision")
                if int(j["metadata"]["labels"].get("fairq.io/job-id", 0)) in jobs
                and j["metadata"]["uid"] not in ctx.foreign_uids]
    pods = [p for p in _pods(ctx) if int(p["metadata"]["labels"].get("fairq.io/job-id", 0))
            in jobs and _owner_uid(p) not in ctx.foreign_uids]
    live_names = {j["metadata"]["name"] for j in k8s_jobs} | \
        {p["metadata"]["labels"].get("fairq.io/workload") for p in pods}
    charged: dict[int, set[int]] = {}
    for job_id, attempt in UsageRecord.objects.filter(job_id__in=pks).values_list(
            "job_id", "attempt"):
        charged.setdefault(job_id, set()).add(attempt)
    for pk, j in jobs.items():
        if j.status not in FINAL:
            row.stuck += 1
            if j.status in ("ADMITTED", "RUNNING") and f"fq-{pk}-{j.attempt}" not in live_names:
                row.lost += 1
        if j.status == "FAILED" and pk not in expected_failed:
            row.falsely_failed += 1
            row.notes.append(f"#{pk} FAILED: {j.message[:120]}")
        if len(charged.get(pk, ())) > 1:
            row.duplicate += 1
    per_job: dict[str, int] = {}
    for j in k8s_jobs:
        if not j["metadata"].get("deletionTimestamp") and not _finished(j):
            key = j["metadata"]["labels"]["fairq.io/job-id"]
            per_job[key] = per_job.get(key, 0) + 1
    row.duplicate += sum(1 for n in per_job.values() if n > 1)
    for pod in pods:
        labels = pod["metadata"]["labels"]
        pk, attempt = int(labels["fairq.io/job-id"]), int(labels["fairq.io/attempt"])
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Pending", "Running") and not pod["metadata"].get("deletionTimestamp"):
            row.leaked += 1
            row.notes.append(f"{pod['metadata']['name']} still {phase}")
        elif _started(pod) and attempt not in charged.get(pk, set()) \
                and jobs[pk].status != "CANCELLED":
            row.leaked += 1
            row.notes.append(f"{pod['metadata']['name']} ran uncharged")
    for check in ctx.checks:
        check(row)
    return row


def _finished(job: dict[str, Any]) -> bool:
    return any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
               for c in (job.get("status") or {}).get("conditions") or ())


def _started(pod: dict[str, Any]) -> bool:
    from queueing.backends.k8s_manifest import pod_started_at

    return pod_started_at(pod) is not None


def _pods(ctx: Ctx) -> list[dict[str, Any]]:
    import json

    resp = ctx.kube.core.list_namespaced_pod(
        ctx.kube.ns("vision"), _preload_content=False,
        label_selector="app.kubernetes.io/managed-by=fairq")
    return list(json.loads(resp.data)["items"])


def run_table(ctx: Ctx, faults: Sequence[str] | None = None,
              settle_seconds: float = 90.0) -> list[Row]:
    rows = []
    for name in faults or list(FAULTS):
        backend = ctx.kube.backend
        saved = (backend.pod_create_timeout_seconds,
                 getattr(backend, "orphan_pod_grace_seconds", None))
        t0 = time.monotonic()
        try:
            pks, expected = FAULTS[name](ctx)
            _settle(pks, settle_seconds + 2 * len(pks))  # waves of AT_ONCE at scale
            for lift in ctx.lifts:
                lift()
            _cycles(2.5)  # the cleanup of what the fault left (pods without Jobs)
            row = measure(ctx, name, pks, expected, time.monotonic() - t0)
        finally:
            for cleanup in ctx.cleanups:
                cleanup()
            ctx.cleanups, ctx.checks, ctx.lifts, ctx.foreign_uids = [], [], [], set()
        row.stuck += ctx.stuck_during
        ctx.stuck_during = 0
        rows.append(row)
        backend.pod_create_timeout_seconds, backend.orphan_pod_grace_seconds = saved
    return rows


def format_table(rows: Sequence[Row]) -> str:
    head = ("fault", "jobs", "lost", "duplicate", "falsely failed", "leaked", "stuck",
            "foreign", "s")
    body = [(r.fault, r.jobs, r.lost, r.duplicate, r.falsely_failed, r.leaked, r.stuck,
             r.foreign, f"{r.seconds:.0f}") for r in rows]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body, strict=False)]
    lines = [" | ".join(str(x).ljust(w) for x, w in zip(line, widths, strict=True))
             for line in (head, *body)]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    notes = [f"  {r.fault}: {n}" for r in rows for n in r.notes]
    return "\n".join(lines + (["notes:", *notes] if notes else []))


def main(argv: Sequence[str] | None = None) -> int:
    """Run the table through pytest (its fixtures start the control plane and the
    database) and print it."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20, help="jobs per row")
    parser.add_argument("--freeze", type=float, default=30.0,
                        help="seconds the apiserver / controller manager stay frozen")
    parser.add_argument("--fault", action="append", default=[], choices=list(FAULTS),
                        help="only these rows (repeatable)")
    args = parser.parse_args(argv)
    faults = args.fault or list(FAULTS)  # every row (pytest's default leaves out SLOW)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, FAIRQ_FAULT_TABLE_JOBS=str(args.jobs),
               FAIRQ_FAULT_TABLE_FREEZE=str(args.freeze),
               FAIRQ_FAULT_TABLE_FAULTS="\n".join(faults))
    return subprocess.call(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-s", "-q",
         "tests/envtest/test_k8s_faults.py::test_the_fault_table_is_all_zeros"],
        cwd=root, env=env)


if __name__ == "__main__":
    sys.exit(main())
