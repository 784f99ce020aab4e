"""Faults on a real control plane (tests/envtest): a slow Job controller, Jobs
that finish before their condition is written, a 403 on create, Jobs deleted with orphan
propagation, pods that move or restart, and what the cycle counts as an orphan.

Each test freezes or breaks one piece of the cluster (`ControlPlane.frozen` sends SIGSTOP
and SIGCONT to a component) and runs the scheduler cycle as the worker would. Timeouts
are set small on the test's backend so each test takes seconds.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from tests.envtest.cluster import DEFAULT_GPU_NODES, envtest_required
from tests.envtest.test_k8s_backend import Kube, job, kube, submit, wait

__all__ = ["kube"]  # the fixture, shared with test_k8s_backend.py

if envtest_required():
    from kubernetes import client
else:
    client = pytest.importorskip("kubernetes.client")

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]

H100_NODES = sorted(n for n, t, _ in DEFAULT_GPU_NODES if t == "h100")
CONTROLLER_MANAGER = "kube-controller-manager"


def cycles(seconds: float) -> list[Any]:
    """Run scheduler cycles for `seconds` (four a second); their results."""
    import time

    from queueing.services.scheduler import scheduler_cycle

    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        out.append(scheduler_cycle())
        time.sleep(0.25)
    return out


def events(pk: int, kind: str) -> list[Any]:
    from queueing.models import JobEvent

    return list(JobEvent.objects.filter(job_id=pk, kind=kind).order_by("at", "id"))


# --- 11.1 slow is not failed ------------------------------------------------------------------

def test_a_slow_job_controller_does_not_fail_the_job_it_waits_with_a_reason(
    kube: Kube, world: Any, k8s_control_plane: Any,
) -> None:
    from queueing.models import UsageRecord

    kube.backend.pod_create_timeout_seconds = 2
    pk = submit(world, gpus=1, env={"FAIRQ_SIM_SECONDS": "1"})
    with k8s_control_plane.frozen(CONTROLLER_MANAGER):
        wait(lambda: job(pk).submitted_to_backend_at is not None, what="the job submitted")
        for _ in cycles(5):
            assert job(pk).status == "ADMITTED", job(pk).message
        assert job(pk).message.startswith("waiting for the cluster: no pod created")
        # One event when the reason appeared, not one per cycle.
        assert len(events(pk, "waiting")) == 1
    wait(lambda: job(pk).status == "SUCCEEDED", timeout=40, what="the job SUCCEEDED")
    assert job(pk).message == ""
    assert UsageRecord.objects.filter(job_id=pk).count() == 1


def test_pods_that_run_after_fairq_failed_their_job_are_stopped_and_charged(
    kube: Kube, world: Any, k8s_control_plane: Any,
) -> None:
    from django.db import transaction

    from queueing.models import UsageRecord
    from queueing.policy.states import JobState
    from queueing.services.jobs import job_transition

    pk = submit(world, gpus=2)  # runs until stopped
    with k8s_control_plane.frozen(CONTROLLER_MANAGER):
        wait(lambda: job(pk).submitted_to_backend_at is not None, what="the job submitted")
        # fairq decides while the pods are not there yet (what the create timeout did).
        with transaction.atomic():
            assert job_transition(job(pk), JobState.FAILED, now=datetime.now(UTC),
                                  reason="decided before the pods came")
    name = f"fq-{pk}-1"
    wait(lambda: any(p["status"].get("phase") == "Running" for p in kube.pods("vision", name)),
         cycle=False, what="its pods running after the decision")
    wait(lambda: UsageRecord.objects.filter(job_id=pk, attempt=1).exists(), timeout=40,
         what="the pods' run time charged")
    wait(lambda: not kube.pods("vision", name), cycle=False, what="the pods stopped")
    usage = UsageRecord.objects.get(job_id=pk, attempt=1)
    assert usage.gpus == 2 and usage.gpu_seconds > 0
    assert job(pk).status == "FAILED"


def test_statuses_make_no_event_call_per_job_without_pods(
    kube: Kube, world: Any, k8s_control_plane: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from queueing.backends.base import LaunchSpec

    calls: list[Any] = []
    real = kube.backend.core.list_namespaced_event
    monkeypatch.setattr(kube.backend.core, "list_namespaced_event",
                        lambda *a, **kw: calls.append(a) or real(*a, **kw))
    kube.backend.pod_create_timeout_seconds = 1
    with k8s_control_plane.frozen(CONTROLLER_MANAGER):
        for i in range(12):
            kube.backend.submit(LaunchSpec(
                name=f"fq-{990000 + i}-1", job_id=990000 + i, attempt=1, team="vision",
                tier="low", priority_class_name=world.low.priority_class_name,
                gpu_type="h100", resource_name="nvidia.com/gpu",
                node_labels={"fairq.io/gpu-type": "h100"}, gpus_per_replica=1, replicas=1,
                image="ghcr.io/acme/train:1", command=[], args=[], env={},
                max_runtime_seconds=None), now=datetime.now(UTC))
        wait(lambda: len([j for j in kube.backend.jobs.items()
                          if j["metadata"]["namespace"] == kube.ns("vision")]) == 12,
             cycle=False, what="the Jobs in the cache")
        import time

        time.sleep(1.5)
        statuses = [s for s in kube.backend.statuses(now=datetime.now(UTC))
                    if s.job_id >= 990000]
        assert len(statuses) == 12
        assert all(s.phase == "PENDING" for s in statuses)
        assert all(s.reason.startswith("waiting for the cluster") for s in statuses)
    assert calls == []


# --- 11.2 finished Jobs stay until their TTL --------------------------------------------------

def test_a_finished_job_keeps_its_kubernetes_job_for_its_logs(
    kube: Kube, world: Any, k8s_control_plane: Any,
) -> None:
    pk = submit(world, gpus=1, env={"FAIRQ_SIM_SECONDS": "1"})
    wait(lambda: job(pk).status == "RUNNING", what="the job RUNNING")
    name = f"fq-{pk}-1"
    # The Job controller cannot write `Complete` while frozen: fairq sees the pods end.
    with k8s_control_plane.frozen(CONTROLLER_MANAGER):
        wait(lambda: job(pk).status == "SUCCEEDED", what="the job SUCCEEDED")
        results = cycles(2)
        [k8s_job] = kube.jobs("vision", pk)
        assert not k8s_job["metadata"].get("deletionTimestamp")
        assert all(name not in r.orphans_stopped for r in results)
    results = cycles(2)
    [k8s_job] = kube.jobs("vision", pk)
    assert not k8s_job["metadata"].get("deletionTimestamp")
    assert all(name not in r.orphans_stopped for r in results)


def test_an_orphan_being_deleted_is_counted_once(
    kube: Kube, world: Any, k8s_control_plane: Any,
) -> None:
    from queueing.backends.base import LaunchSpec
    from queueing.services.scheduler import scheduler_cycle

    orphan = LaunchSpec(
        name="fq-999998-1", job_id=999998, attempt=1, team="vision", tier="low",
        priority_class_name=world.low.priority_class_name, gpu_type="h100",
        resource_name="nvidia.com/gpu", node_labels={"fairq.io/gpu-type": "h100"},
        gpus_per_replica=1, replicas=1, image="ghcr.io/acme/train:1", command=[], args=[],
        env={}, max_runtime_seconds=None)
    kube.backend.submit(orphan, now=datetime.now(UTC))
    wait(lambda: any(p["status"].get("phase") == "Running"
                     for p in kube.pods("vision", orphan.name)),
         cycle=False, what="the orphan's pod Running")
    # The garbage collector frozen: the Job stays listed, being deleted, for a while.
    with k8s_control_plane.frozen(CONTROLLER_MANAGER):
        counted = [n for r in [scheduler_cycle(), *cycles(2)] for n in r.orphans_stopped]
        assert counted == [orphan.name]
    wait(lambda: not kube.job_exists("vision", orphan.name), cycle=False, what="its Job gone")


# --- 11.3 a 403 on create ---------------------------------------------------------------------

def test_a_403_on_create_is_surfaced_and_gives_the_gpus_back_after_the_bound(
    kube: Kube, world: Any, settings: Any,
) -> None:
    from queueing.metrics import FairqCollector

    settings.FAIRQ_K8S_SUBMIT_REFUSED_SECONDS = 4
    namespace = kube.backend.provisioner.ensure_namespace("vision")
    kube.core.create_namespaced_resource_quota(namespace, {
        "metadata": {"name": "no-jobs"}, "spec": {"hard": {"count/jobs.batch": "0"}}})
    wait(lambda: (kube.core.read_namespaced_resource_quota("no-jobs", namespace)
                  .status.hard or {}).get("count/jobs.batch") == "0",
         cycle=False, what="the quota in force")
    pk = submit(world, gpus=1)
    wait(lambda: job(pk).status == "ADMITTED" and "403" in job(pk).message,
         what="the refusal on the job")
    assert "exceeded quota" in job(pk).message
    cycles(1)
    assert job(pk).status == "ADMITTED"
    assert len(events(pk, "submit_error")) == 1  # once per distinct error
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for m in FairqCollector().collect() for s in m.samples}
    assert samples[("fairq_k8s_submit_errors_total", (("code", "403"),))] >= 2
    wait(lambda: job(pk).status == "FAILED", timeout=20, what="the GPUs given back")
    assert "403" in job(pk).message and "exceeded quota" in job(pk).message
    assert kube.jobs("vision", pk) == []


# --- 11.5 leaks -------------------------------------------------------------------------------

def test_pods_left_by_a_job_deleted_with_orphan_propagation_are_deleted_and_charged(
    kube: Kube, world: Any,
) -> None:
    from queueing.models import UsageRecord

    kube.backend.orphan_pod_grace_seconds = 2
    pk = submit(world, gpus=1)  # runs until stopped
    wait(lambda: job(pk).status == "RUNNING", what="the job RUNNING")
    name = f"fq-{pk}-1"
    kube.batch.delete_namespaced_job(name, kube.ns("vision"), propagation_policy="Orphan")
    wait(lambda: job(pk).status == "FAILED", what="the job FAILED")
    wait(lambda: not kube.pods("vision", name), timeout=30, what="the left-over pod deleted")
    assert UsageRecord.objects.get(job_id=pk, attempt=1).gpu_seconds > 0


def test_a_fairq_pod_that_no_job_owns_is_deleted(kube: Kube, world: Any) -> None:
    kube.backend.orphan_pod_grace_seconds = 2
    name = "fq-999997-1"
    labels = {"app.kubernetes.io/managed-by": "fairq", "fairq.io/workload": name,
              "fairq.io/job-id": "999997", "fairq.io/attempt": "1", "fairq.io/team": "vision"}
    kube.backend.provisioner.ensure_namespace("vision")
    kube.core.create_namespaced_pod(kube.ns("vision"), {
        "metadata": {"name": f"{name}-x", "labels": labels},
        "spec": {"restartPolicy": "Never", "nodeSelector": {"fairq.io/gpu-type": "h100"},
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                 "containers": [{"name": "main", "image": "x", "resources": {
                     "limits": {"nvidia.com/gpu": "1"}}}]}})
    wait(lambda: any(p["status"].get("phase") == "Running" for p in kube.pods("vision", name)),
         cycle=False, what="the pod Running")
    wait(lambda: not kube.pods("vision", name), timeout=40, what="the pod deleted")


def test_a_pod_that_moved_to_another_node_updates_the_placement_with_an_event(
    kube: Kube, world: Any,
) -> None:
    pk = submit(world, gpus=1)  # runs until stopped
    wait(lambda: job(pk).status == "RUNNING", what="the job RUNNING")
    name = f"fq-{pk}-1"
    [pod] = kube.pods("vision", name)
    first = pod["spec"]["nodeName"]
    [other] = [n for n in H100_NODES if n != first]
    kube.core.patch_node(first, {"spec": {"unschedulable": True}})
    try:
        kube.core.delete_namespaced_pod(pod["metadata"]["name"], kube.ns("vision"),
                                        grace_period_seconds=0)
        wait(lambda: job(pk).placement == [other], timeout=40, what="the placement updated")
    finally:
        kube.core.patch_node(first, {"spec": {"unschedulable": False}})
    [moved] = events(pk, "moved")
    assert other in moved.reason and first in moved.reason
    assert job(pk).status == "RUNNING"


def test_a_pod_restart_writes_an_event(kube: Kube, world: Any) -> None:
    kube.backend.backoff_limit = 1  # one failed pod is replaced
    pk = submit(world, gpus=1, env={"FAIRQ_SIM_SECONDS": "1", "FAIRQ_SIM_EXIT_CODE": "3"})
    wait(lambda: events(pk, "pod_restarted"), timeout=40, what="the restart event")
    [restarted] = events(pk, "pod_restarted")
    assert restarted.data["restarts"] == 1


# --- the fault table (tests/envtest/fault_table.py), at a small scale -------------------------

def test_the_fault_table_is_all_zeros(
    kube: Kube, world: Any, k8s_control_plane: Any, settings: Any,
) -> None:
    import os

    from tests.envtest.fault_table import FAULTS, SLOW, Ctx, format_table, run_table

    ctx = Ctx(kube=kube, world=world, plane=k8s_control_plane, settings=settings,
              jobs=int(os.environ.get("FAIRQ_FAULT_TABLE_JOBS") or 3),
              freeze_seconds=float(os.environ.get("FAIRQ_FAULT_TABLE_FREEZE") or 5))
    faults = [f for f in os.environ.get("FAIRQ_FAULT_TABLE_FAULTS", "").split("\n") if f]
    rows = run_table(ctx, faults or [f for f in FAULTS if f not in SLOW])
    table = format_table(rows)
    print("\n" + table)
    assert all(r.zero for r in rows), table
