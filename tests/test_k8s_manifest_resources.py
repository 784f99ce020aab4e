"""The Job manifest carries a job's resources and /dev/shm: requests = limits
for cpu, memory and ephemeral storage beside the GPUs (Guaranteed QoS), /dev/shm as a
memory-backed emptyDir of the job's size; nothing of them when the job sets none."""

from __future__ import annotations

from typing import Any

import pytest

from queueing.backends.k8s_manifest import ManifestError, job_manifest
from queueing.services.scheduler import launch_spec
from tests.conftest import World
from tests.factories import JobFactory
from tests.test_k8s_manifest import OPTS, spec

GI = 2**30
# What the `restricted` Pod Security Standard lets a pod mount.
RESTRICTED_VOLUME_TYPES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                           "persistentVolumeClaim", "projected", "secret"}


def pod(manifest: dict[str, Any]) -> dict[str, Any]:
    pod_spec: dict[str, Any] = manifest["spec"]["template"]["spec"]
    return pod_spec


def test_requests_equal_limits_for_cpu_memory_and_ephemeral_storage_beside_the_gpus() -> None:
    m = job_manifest(spec(cpu_millicores=32000, memory_bytes=256 * GI,
                          ephemeral_storage_bytes=100 * 10**9 + 1), OPTS)
    resources = pod(m)["containers"][0]["resources"]
    expected = {"nvidia.com/gpu": "2", "cpu": "32", "memory": "256Gi",
                "ephemeral-storage": "100000000001"}
    assert resources == {"limits": expected, "requests": expected}


def test_millicores_are_written_as_kubernetes_writes_them() -> None:
    resources = pod(job_manifest(spec(cpu_millicores=1500), OPTS))["containers"][0]["resources"]
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"] == "1500m"


def test_a_job_without_resources_gets_only_its_gpus() -> None:
    m = job_manifest(spec(), OPTS)
    container = pod(m)["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": "2"},
                                      "requests": {"nvidia.com/gpu": "2"}}
    assert "volumes" not in pod(m) and "volumeMounts" not in container


def test_shm_is_a_memory_backed_empty_dir_of_the_jobs_size_at_dev_shm() -> None:
    m = job_manifest(spec(shm_size_bytes=64 * GI), OPTS)
    assert pod(m)["volumes"] == [{"name": "dshm",
                                  "emptyDir": {"medium": "Memory", "sizeLimit": "64Gi"}}]
    assert pod(m)["containers"][0]["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]


def test_the_shm_volume_keeps_the_restricted_pod_security_level() -> None:
    m = job_manifest(spec(shm_size_bytes=GI, cpu_millicores=1000, memory_bytes=GI), OPTS)
    p = pod(m)
    for volume in p["volumes"]:
        assert set(volume) - {"name"} <= RESTRICTED_VOLUME_TYPES
    sc = p["containers"][0]["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and "hostPath" not in str(m)


@pytest.mark.parametrize("overrides", [
    {"cpu_millicores": 0}, {"memory_bytes": -1}, {"ephemeral_storage_bytes": "10Gi"},
    {"shm_size_bytes": 0}, {"shm_size_bytes": True}, {"memory_bytes": 2**63},
])
def test_the_manifest_refuses_quantities_that_are_not_positive_integers(
        overrides: dict[str, Any]) -> None:
    with pytest.raises(ManifestError):
        job_manifest(spec(**overrides), OPTS)


def test_a_jobs_quantities_reach_its_launch_spec(world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                     cpu_millicores=4000, memory_bytes=16 * GI, ephemeral_storage_bytes=GI,
                     shm_size_bytes=2 * GI)
    launch = launch_spec(job)
    assert (launch.cpu_millicores, launch.memory_bytes, launch.ephemeral_storage_bytes,
            launch.shm_size_bytes) == (4000, 16 * GI, GI, 2 * GI)
