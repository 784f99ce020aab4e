"""Rules A6 and A7 against a real control plane (tests/envtest): `nodes()` reports a
node's allocatable CPU and memory minus what its pods request, and its topology
domains from its labels; a gang asking one rack required runs in that rack, pinned by a
required node affinity the real kube-scheduler honours.

Fixtures and helpers are the backend tests' (`kube`, `submit`, `job`, `wait`).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import job_body
from tests.envtest import test_k8s_backend
from tests.envtest.test_k8s_backend import A100_NODES, H100_NODES, Kube, job, submit, wait

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]

base_kube = test_k8s_backend.kube  # the fixture, under a name tests here do not use
RACK_LABEL = "topology.kubernetes.io/rack"
GI = 2**30


@pytest.fixture(name="kube")
def _kube(base_kube: Kube) -> Kube:
    """The backend tests' `kube` (a fresh prefix, backend and namespaces per test)."""
    return base_kube


def test_rule_a6_nodes_report_allocatable_cpu_and_memory_minus_pod_requests(
        kube: Kube) -> None:
    [a100] = sorted(A100_NODES)
    node = {n.name: n for n in kube.backend.nodes()}[a100]
    # tests/envtest/cluster.py's nodes: 64 CPUs and 512Gi allocatable.
    assert (node.cpu_millicores, node.memory_bytes) == (64_000, 512 * GI)
    other = kube.ns("speech")
    kube.core.create_namespaced_pod(other, {
        "metadata": {"name": "not-fairq"},
        "spec": {"restartPolicy": "Never", "nodeSelector": {"fairq.io/gpu-type": "a100"},
                 "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                 "containers": [{"name": "c", "image": "x", "resources": {
                     "requests": {"cpu": "1500m", "memory": "3Gi"}}}]}})
    try:
        wait(lambda: {n.name: (n.cpu_allocated, n.memory_allocated)
                      for n in kube.backend.nodes()}[a100] == (1_500, 3 * GI),
             cycle=False, what="the other pod's CPU and memory counted")
    finally:
        kube.core.delete_namespaced_pod("not-fairq", other, grace_period_seconds=0)
    wait(lambda: {n.name: n.cpu_allocated for n in kube.backend.nodes()}[a100] == 0,
         cycle=False, what="its CPU free again")


def test_rule_a6_submit_refuses_more_cpu_than_a_node_has(kube: Kube, world: Any) -> None:
    wait(lambda: True, what="a cycle that publishes the cluster view")
    r = world.client(world.member).post("/api/v1/jobs/", job_body(
        gpus=1, resources={"cpu": "65"}), format="json")
    assert r.status_code == 400, r.content
    assert r.json()["error"]["fields"] == {
        "resources.cpu": ["No h100 node has 65 CPUs (the largest can allocate 64)."]}


def test_rule_a7_a_required_gang_runs_in_one_rack_pinned_by_affinity(
        kube: Kube, world: Any) -> None:
    from queueing.models import GpuType

    h100 = sorted(H100_NODES)
    for i, name in enumerate(h100):
        kube.core.patch_node(name, {"metadata": {"labels": {RACK_LABEL: f"rack-{i}"}}})
    try:
        GpuType.objects.filter(slug="h100").update(
            topology_levels=[{"name": "rack", "node_label": RACK_LABEL}])
        kube.backend._gpu_types_cache = None
        wait(lambda: {n.name: n.topology for n in kube.backend.nodes()}[h100[1]]
             == {"rack": "rack-1"}, cycle=False, what="the rack labels in nodes()")
        # One 8-GPU node per rack: a gang of 2 × 4 in one rack fits on one node only.
        pk = submit(world, gpus=4, replicas=2, topology={"level": "rack"},
                    env={"FAIRQ_SIM_SECONDS": "2"})
        wait(lambda: job(pk).status == "RUNNING", what="the gang RUNNING")
        placement = job(pk).placement
        assert len(set(placement)) == 1
        rack = f"rack-{h100.index(placement[0])}"
        for k8s_job in kube.jobs("vision", pk):
            affinity = k8s_job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
            assert affinity["requiredDuringSchedulingIgnoredDuringExecution"] == {
                "nodeSelectorTerms": [{"matchExpressions": [
                    {"key": RACK_LABEL, "operator": "In", "values": [rack]}]}]}
        pods = kube.pods("vision", f"fq-{pk}-1")
        assert {p["spec"]["nodeName"] for p in pods} == {placement[0]}
        # A gang of 2 × 8 required in one rack can never run here (one node per rack):
        # it waits with the reason (team nlp: within its quota).
        big = submit(world, world.outsider, team="nlp", gpus=8, replicas=2,
                     topology={"level": "rack"}, name="big")
        from queueing.services.scheduler import scheduler_cycle

        r = scheduler_cycle()
        assert r.plan is not None and str(r.plan.waits[big].reason) == "gang_does_not_fit"
        wait(lambda: job(pk).status == "SUCCEEDED", what="the gang SUCCEEDED")
    finally:
        for name in h100:
            kube.core.patch_node(name, {"metadata": {"labels": {RACK_LABEL: None}}})
