"""Job resources against a real API server (Kubernetes 1.20): a Job with cpu, memory and
ephemeral-storage requests = limits and a memory-backed /dev/shm is a valid object, kept
as fairq wrote it (server-side dry run validates every field). No database."""

from __future__ import annotations

from typing import Any

import pytest

from tests.envtest.cluster import envtest_required

if envtest_required():
    from kubernetes import client
else:
    client = pytest.importorskip("kubernetes.client")

from tests.test_k8s_manifest import spec

pytestmark = pytest.mark.k8s

GI = 2**30


def test_a_job_with_resources_and_shm_is_valid_and_kept_by_the_api_server(
        k8s_api_client: Any, k8s_namespace: str) -> None:
    from queueing.backends.k8s_manifest import ManifestOptions, job_manifest

    body = job_manifest(spec(cpu_millicores=32500, memory_bytes=256 * GI,
                             ephemeral_storage_bytes=100 * GI, shm_size_bytes=64 * GI),
                        ManifestOptions(namespace=k8s_namespace))
    stored = client.BatchV1Api(k8s_api_client).create_namespaced_job(
        k8s_namespace, body, dry_run="All")
    pod = stored.spec.template.spec
    [container] = pod.containers
    expected = {"nvidia.com/gpu": "2", "cpu": "32500m", "memory": "256Gi",
                "ephemeral-storage": "100Gi"}
    assert container.resources.limits == expected and container.resources.requests == expected
    [volume] = pod.volumes
    assert volume.empty_dir.medium == "Memory" and volume.empty_dir.size_limit == "64Gi"
    assert volume.host_path is None
    [mount] = container.volume_mounts
    assert (mount.name, mount.mount_path) == (volume.name, "/dev/shm")
