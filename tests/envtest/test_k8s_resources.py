"""Job resources on a real control plane (tests/envtest): a job submitted through the REST
API with cpu, memory, ephemeral storage (one of them the team's default) and shm_size
becomes a Job, and pods, whose container asks requests = limits for each beside its GPUs
and mounts a memory-backed /dev/shm of that size (read back from the API server)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.envtest import test_k8s_backend
from tests.envtest.test_k8s_backend import Kube, job, submit, wait

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]

base_kube = test_k8s_backend.kube  # the fixture, under a name tests here do not use
GI = 2**30


@pytest.fixture(name="kube")
def _kube(base_kube: Kube) -> Kube:
    return base_kube


def test_a_jobs_resources_and_shm_reach_its_pods(kube: Kube, world: Any) -> None:
    world.vision.default_ephemeral_storage_bytes = 20 * GI
    world.vision.save()
    pk = submit(world, gpus=2, resources={"cpu": "1500m", "memory": "2Gi"}, shm_size="1Gi",
                env={"FAIRQ_SIM_SECONDS": "30"})
    wait(lambda: job(pk).submitted_to_backend_at is not None, what="the job submitted")
    expected = {"nvidia.com/gpu": "2", "cpu": "1500m", "memory": "2Gi",
                "ephemeral-storage": "20Gi"}
    [k8s_job] = kube.jobs("vision", pk)
    pods = wait(lambda: kube.pods("vision", f"fq-{pk}-1"), cycle=False, what="the pod")
    for pod_spec in (k8s_job["spec"]["template"]["spec"], pods[0]["spec"]):
        [container] = pod_spec["containers"]
        assert container["resources"] == {"limits": expected, "requests": expected}
        assert container["volumeMounts"][0] == {"name": "dshm", "mountPath": "/dev/shm"}
        assert pod_spec["volumes"] == [{"name": "dshm", "emptyDir": {
            "medium": "Memory", "sizeLimit": "1Gi"}}]
    # requests = limits for cpu and memory in every container: the Guaranteed QoS class.
    qos = wait(lambda: (kube.pods("vision", f"fq-{pk}-1")[0].get("status") or {}).get(
        "qosClass"), cycle=False, what="the pod's QoS class")
    assert qos == "Guaranteed"
