"""Rule K6, spot reclamation, on the real control plane (Kubernetes 1.20, tests/envtest):
a preemptible job runs on a spot node (a node with a cloud's spot label); the node is
deleted, or a cloud's termination taint appears on it; fairq requeues the job at once as
attempt 2 with reason `spot_reclaimed` (not FAILED), charges the GPU time it ran up to
the reclamation, stops the old workload, and runs the job again on the other spot node,
once.

Each test adds two spot l40s nodes of its own (a GPU type no other test uses, so the
job can only land on them) and deletes them after.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.envtest.test_k8s_backend import Kube, job, kube, submit, wait

__all__ = ["kube"]  # the fixture, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def spot_nodes(kube: Kube, world: Any, k8s_control_plane: Any,
               request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Two 8-GPU l40s spot nodes, labelled as `request.param` says (a cloud's spot
    label); the l40s GPU type and a quota of 8 for team vision."""
    from queueing.models import Quota
    from queueing.services.provisioning import sync_cluster
    from tests.factories import GpuTypeFactory

    label = request.param
    l40s = GpuTypeFactory(slug="l40s", node_labels={"fairq.io/gpu-type": "l40s"})
    Quota.objects.create(team=world.vision, gpu_type=l40s, nominal=8, borrowing_limit=0)
    sync_cluster(kube.backend.provisioner)  # the team namespace's quota counts l40s too
    kube.backend._gpu_types_cache = None
    names = [f"spot-{uuid.uuid4().hex[:5]}-{i}" for i in range(2)]
    key, _, value = label.partition("=")
    for name in names:
        k8s_control_plane.add_gpu_node(name, "l40s", 8, labels={key: value})
    try:
        wait(lambda: {n.name for n in kube.backend.nodes() if n.spot} == set(names),
             cycle=False, what="the spot nodes in nodes(), flagged spot")
        yield names
    finally:
        for name in names:
            try:
                kube.core.delete_node(name)
            except Exception as exc:  # deleted by the test
                if getattr(exc, "status", None) != 404:
                    raise


def _running_on(world: Any, kube: Kube) -> tuple[int, str]:
    pk = submit(world, gpus=8, gpu_type="l40s", tier="low")  # runs until stopped
    wait(lambda: job(pk).status == "RUNNING", timeout=60, what="the job RUNNING")
    [pod] = kube.pods("vision", f"fq-{pk}-1")
    return pk, pod["spec"]["nodeName"]


def _requeued_and_rerun(kube: Kube, pk: int, node: str, other: str) -> None:
    """What rule K6 promises once `node` is reclaimed under job `pk`'s attempt 1."""
    from queueing.models import JobEvent, UsageRecord

    wait(lambda: job(pk).attempt == 2, timeout=60, what="the job requeued as attempt 2")
    moves = list(JobEvent.objects.filter(job_id=pk, kind="transition").order_by("id")
                 .values_list("from_status", "to_status", "attempt"))
    at = moves.index(("RUNNING", "PREEMPTED", 1))
    assert moves[at + 1] == ("PREEMPTED", "QUEUED", 2)
    assert "FAILED" not in {to for _, to, _ in moves}  # not a failure
    event = JobEvent.objects.get(job_id=pk, kind=JobEvent.Kind.SPOT_RECLAIMED)
    assert event.attempt == 1 and event.data["node"] == node
    assert event.reason.startswith(f"spot node {node} was reclaimed (spot_reclaimed: node")
    # Its GPU time up to the reclamation, charged to the team for attempt 1.
    usage = UsageRecord.objects.get(job_id=pk, attempt=1)
    assert usage.gpus == 8 and usage.gpu_seconds > 0
    assert event.data["gpu_seconds"] == pytest.approx(usage.gpu_seconds)
    assert usage.gpu_seconds == pytest.approx(8 * (usage.end - usage.start).total_seconds())
    # It runs again, on the other spot node.
    wait(lambda: job(pk).status == "RUNNING", timeout=90, what="attempt 2 RUNNING")
    assert job(pk).placement == [other]
    [pod] = kube.pods("vision", f"fq-{pk}-2")
    assert pod["spec"]["nodeName"] == other
    # Nothing runs twice: attempt 1's Job is deleted by fairq (its pods with it).
    wait(lambda: [j["metadata"]["name"] for j in kube.jobs("vision", pk)] == [f"fq-{pk}-2"],
         timeout=120, what="attempt 1's Job gone")
    assert not kube.pods("vision", f"fq-{pk}-1")
    assert UsageRecord.objects.filter(job_id=pk).count() == 1  # attempt 2 still runs


@pytest.mark.parametrize("spot_nodes", ["karpenter.sh/capacity-type=spot"], indirect=True)
def test_k6_a_deleted_spot_node_requeues_its_job_which_runs_again_elsewhere(
        kube: Kube, world: Any, spot_nodes: list[str]) -> None:
    pk, node = _running_on(world, kube)
    [other] = [n for n in spot_nodes if n != node]
    kube.core.delete_node(node)
    _requeued_and_rerun(kube, pk, node, other)


@pytest.mark.parametrize("spot_nodes", ["cloud.google.com/gke-spot=true"], indirect=True)
def test_k6_a_termination_taint_requeues_its_job_and_the_node_returns_without_it(
        kube: Kube, world: Any, spot_nodes: list[str]) -> None:
    pk, node = _running_on(world, kube)
    [other] = [n for n in spot_nodes if n != node]
    taint = {"key": "cloud.google.com/impending-node-termination", "effect": "NoSchedule"}
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    kube.core.patch_node(node, {"spec": {"taints": [gpu_taint, taint]}})
    _requeued_and_rerun(kube, pk, node, other)
    from queueing.models import JobEvent

    assert "tainted cloud.google.com/impending-node-termination" in JobEvent.objects.get(
        job_id=pk, kind=JobEvent.Kind.SPOT_RECLAIMED).reason
    # The taint lifted (the interruption did not come): schedulable spot capacity again.
    assert node not in {n.name for n in kube.backend.nodes()}
    kube.core.patch_node(node, {"spec": {"taints": [gpu_taint]}})
    wait(lambda: node in {n.name for n in kube.backend.nodes() if n.spot}, cycle=False,
         what="the untainted node back in nodes()")
    assert node not in kube.backend.tracker.reclaimed_nodes()


@pytest.mark.parametrize("spot_nodes", ["eks.amazonaws.com/capacityType=SPOT"], indirect=True)
def test_k6_a_replacement_pod_elsewhere_does_not_hide_the_reclamation(
        kube: Kube, world: Any, spot_nodes: list[str]) -> None:
    pk, node = _running_on(world, kube)
    [other] = [n for n in spot_nodes if n != node]
    [pod] = kube.pods("vision", f"fq-{pk}-1")
    kube.core.delete_node(node)
    wait(lambda: kube.backend.tracker.reclaimed(f"fq-{pk}-1"), cycle=False,
         what="the node watch marking the workload")
    # No fairq cycle meanwhile: what the pod garbage collector does to a gone node's pods
    # (force-delete), then the Job controller makes a new pod, bound to the other node.
    kube.core.delete_namespaced_pod(pod["metadata"]["name"], kube.ns("vision"),
                                    grace_period_seconds=0)
    wait(lambda: [p for p in kube.pods("vision", f"fq-{pk}-1")
                  if p["spec"].get("nodeName") == other
                  and (p.get("status") or {}).get("phase") == "Running"],
         cycle=False, timeout=60, what="attempt 1 running again, on the other node")
    # The attempt did not merely move: it is requeued, and its replacement pod stopped.
    _requeued_and_rerun(kube, pk, node, other)
    from queueing.models import JobEvent

    assert not JobEvent.objects.filter(job_id=pk, kind=JobEvent.Kind.MOVED).exists()


AKS_SPOT = "kubernetes.azure.com/scalesetpriority"


def test_k4_an_aks_spot_node_runs_spot_attempts_whose_pods_alone_tolerate_its_taint(
        kube: Kube, world: Any, k8s_control_plane: Any) -> None:
    """Rule K4 on an AKS spot pool: its nodes carry the spot label and the taint
    `kubernetes.azure.com/scalesetpriority=spot:NoSchedule`. fairq offers such a node as
    spot capacity; a preemptible job placed there runs (the real kube-scheduler binds its
    pod, which tolerates the taint); an on-demand job's pods carry no such toleration and
    run on the on-demand node."""
    from queueing.models import Quota
    from queueing.services.provisioning import sync_cluster
    from tests.envtest.cluster import GPU_TAINT
    from tests.factories import GpuTypeFactory

    l40s = GpuTypeFactory(slug="l40s", node_labels={"fairq.io/gpu-type": "l40s"})
    Quota.objects.create(team=world.vision, gpu_type=l40s, nominal=16, borrowing_limit=0)
    sync_cluster(kube.backend.provisioner)
    kube.backend._gpu_types_cache = None
    tag = uuid.uuid4().hex[:5]
    spot, regular = f"aks-spot-{tag}", f"aks-regular-{tag}"
    aks_taint = {"key": AKS_SPOT, "value": "spot", "effect": "NoSchedule"}
    k8s_control_plane.add_gpu_node(spot, "l40s", 8, labels={AKS_SPOT: "spot"},
                                   taints=(GPU_TAINT, aks_taint))
    k8s_control_plane.add_gpu_node(regular, "l40s", 8, labels={AKS_SPOT: "regular"})
    toleration = {"key": AKS_SPOT, "operator": "Equal", "value": "spot"}
    try:
        wait(lambda: {n.name: n.spot for n in kube.backend.nodes()
                      if n.name in (spot, regular)} == {spot: True, regular: False},
             cycle=False, what="the AKS spot node in nodes(), flagged spot")
        # A preemptible job goes to the spot node (rule K4) and runs there.
        low = submit(world, gpus=8, gpu_type="l40s", tier="low")
        wait(lambda: job(low).status == "RUNNING", timeout=60, what="the low job RUNNING")
        assert job(low).on_spot and job(low).placement == [spot]
        [low_job] = kube.jobs("vision", low)
        assert toleration in low_job["spec"]["template"]["spec"]["tolerations"]
        [pod] = kube.pods("vision", f"fq-{low}-1")
        assert pod["spec"]["nodeName"] == spot  # bound by kube-scheduler: tolerated
        # An on-demand job (a non-preemptible tier, no allow_spot): the regular node, and
        # no toleration of the spot taint.
        critical = submit(world, gpus=8, gpu_type="l40s", tier="critical")
        wait(lambda: job(critical).status == "RUNNING", timeout=60,
             what="the critical job RUNNING")
        assert not job(critical).on_spot and job(critical).placement == [regular]
        [critical_job] = kube.jobs("vision", critical)
        assert critical_job["spec"]["template"]["spec"]["tolerations"] == [
            {"key": "nvidia.com/gpu", "operator": "Exists"}]
        [pod] = kube.pods("vision", f"fq-{critical}-1")
        assert pod["spec"]["nodeName"] == regular
    finally:
        for name in (spot, regular):
            kube.core.delete_node(name)
