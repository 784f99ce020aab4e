"""Safe pod defaults against a real API server (docs/kubernetes.md, "Memory, /dev/shm and
CPU"; rule R10): the Jobs fairq renders for jobs that set no memory, ask a huge /dev/shm
or a day of termination grace are valid objects, kept by the server with a memory limit,
a /dev/shm sizeLimit within it and the capped grace (server-side dry run)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from tests.envtest.cluster import envtest_required

if envtest_required():
    from kubernetes import client
else:
    client = pytest.importorskip("kubernetes.client")

from tests.conftest import World, job_body

pytestmark = [pytest.mark.k8s, pytest.mark.django_db]

GI, TI = 2**30, 2**40


def _dry_run(api: Any, namespace: str, job_id: int) -> Any:
    from queueing.backends.k8s_manifest import ManifestOptions, job_manifest
    from queueing.models import Job
    from queueing.services.scheduler import launch_spec

    job = Job.objects.select_related("team", "tier", "gpu_type").get(pk=job_id)
    body = job_manifest(launch_spec(job), ManifestOptions(namespace=namespace))
    stored = client.BatchV1Api(api).create_namespaced_job(namespace, body, dry_run="All")
    return stored.spec.template.spec


@override_settings(FAIRQ_DEFAULT_MEMORY_PER_GPU="32Gi",
                   FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS=300)
def test_a_submitted_job_without_memory_is_a_pod_with_a_memory_limit(
        k8s_api_client: Any, k8s_namespace: str, world: World) -> None:
    body = job_body(gpus=2, tier="low", shm_size="8Gi")
    r = world.client(world.member).post("/api/v1/jobs/", body, format="json")
    assert r.status_code == 201, r.json()
    pod = _dry_run(k8s_api_client, k8s_namespace, r.json()["id"])
    [container] = pod.containers
    expected = {"nvidia.com/gpu": "2", "memory": "64Gi"}
    assert container.resources.limits == expected and container.resources.requests == expected
    [volume] = pod.volumes
    assert volume.empty_dir.medium == "Memory" and volume.empty_dir.size_limit == "8Gi"
    assert pod.termination_grace_period_seconds == 30  # the setting, within the cap


@override_settings(FAIRQ_DEFAULT_MEMORY_PER_GPU="16Gi",
                   FAIRQ_PREEMPTIBLE_MAX_TERMINATION_GRACE_SECONDS=300)
def test_an_old_unsafe_row_becomes_a_pod_within_the_limits(
        k8s_api_client: Any, k8s_namespace: str, world: World) -> None:
    """A row written before the rules: no memory, 1000Ti of /dev/shm, a day of grace on
    the preemptible `low` tier. Its pod: 16Gi per GPU, /dev/shm cut to it, 300 s."""
    from tests.factories import JobFactory

    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.low,
                     gpus_per_replica=1, shm_size="1000Ti", shm_size_bytes=1000 * TI,
                     termination_grace_seconds=86400)
    pod = _dry_run(k8s_api_client, k8s_namespace, job.pk)
    [container] = pod.containers
    assert container.resources.limits == {"nvidia.com/gpu": "1", "memory": "16Gi"}
    assert container.resources.requests == container.resources.limits
    [volume] = pod.volumes
    assert volume.empty_dir.medium == "Memory" and volume.empty_dir.size_limit == "16Gi"
    assert pod.termination_grace_period_seconds == 300
