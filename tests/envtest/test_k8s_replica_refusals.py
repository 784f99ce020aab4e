"""All or nothing when the cluster refuses one replica of a multi-replica job (docs/kubernetes.md,
on the real control plane, Kubernetes 1.20, tests/envtest): a ResourceQuota that lets
one replica's pod in but not the other's, and one that lets replica 0's Job be created
but not replica 1's. Either way the workload never sits half-created: the refusal is
handled as for replica 0 (docs/kubernetes.md, "Replicas that rendezvous"), and nothing of
the attempt is left in the cluster.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.envtest.test_k8s_backend import ApiException, Kube, job, kube, submit, wait

__all__ = ["kube"]  # the fixture, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]


def nothing_left(kube: Kube, pk: int) -> bool:
    name = f"fq-{pk}-1"
    try:
        kube.core.read_namespaced_service(name, kube.ns("vision"))
        return False
    except ApiException as exc:
        if exc.status != 404:
            raise
    return not kube.jobs("vision", pk) and not kube.pods("vision", name)


def quota_in_force(kube: Kube, name: str, resource: str, value: str) -> None:
    wait(lambda: (kube.core.read_namespaced_resource_quota(name, kube.ns("vision"))
                  .status.hard or {}).get(resource) == value,
         cycle=False, what=f"the quota {name} in force")


def test_a_replica_whose_pod_a_quota_refuses_fails_the_attempt_and_it_is_torn_down(
    kube: Kube, world: Any,
) -> None:
    """One GPU of quota for a 2 x 1-GPU job: one replica's pod is created and runs (it
    would wait in the rendezvous for ever), the other's the Job controller cannot create.
    The job fails with the controller's message, naming the replica, and the replica that
    runs is stopped with the rest."""
    kube.core.patch_namespaced_resource_quota(
        "fairq-gpus", kube.ns("vision"), {"spec": {"hard": {"requests.nvidia.com/gpu": "1"}}})
    quota_in_force(kube, "fairq-gpus", "requests.nvidia.com/gpu", "1")
    kube.backend.pod_create_timeout_seconds = 3
    pk = submit(world, gpus=1, replicas=2)
    wait(lambda: job(pk).status == "FAILED", timeout=60, what="the job FAILED")
    message = job(pk).message
    assert re.match(r"replica [01]: no pod could be created in 3 s: .*exceeded quota",
                    message), message
    wait(lambda: nothing_left(kube, pk), timeout=60,
         what="no Job, pod or Service of the attempt left")


def test_a_replica_job_a_quota_refuses_tears_the_workload_down_and_waits_like_replica_0(
    kube: Kube, world: Any, settings: Any,
) -> None:
    """A quota of one Job: replica 0's Job is created, replica 1's refused (403). What
    was created is deleted at once, the job stays ADMITTED saying why ("waiting for the
    cluster: Kubernetes refused the Job (403)"), is never RUNNING on half its replicas,
    and fails once the refusals have lasted FAIRQ_K8S_SUBMIT_REFUSED_SECONDS, as a
    refused replica 0 does."""
    from queueing.models import JobEvent

    kube.core.create_namespaced_resource_quota(kube.ns("vision"), {
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "one-job"},
        "spec": {"hard": {"count/jobs.batch": "1"}}})
    quota_in_force(kube, "one-job", "count/jobs.batch", "1")

    # The backend's submit: refused, and nothing of it left the moment it raises.
    from datetime import UTC, datetime

    from queueing.backends.kubernetes import KubernetesBackendError
    from queueing.services.scheduler import submit_error_code
    from tests.envtest.test_k8s_rendezvous import launch

    direct = 750000 + int(datetime.now(UTC).timestamp()) % 1000
    with pytest.raises(KubernetesBackendError, match=f"fq-{direct}-1-1 failed .403.") as refused:
        kube.backend.submit(launch(direct), now=datetime.now(UTC))
    assert submit_error_code(refused.value) == 403
    assert kube.jobs("vision", direct) == []
    # The quota's use is brought down by its controller, after the delete: until then a
    # create of replica 0 below would be refused too, by the deleted Job's count.
    wait(lambda: (kube.core.read_namespaced_resource_quota("one-job", kube.ns("vision"))
                  .status.used or {}).get("count/jobs.batch") == "0",
         cycle=False, what="the quota's count of the deleted Job released")

    # Through the cycle: handled as a refused replica 0.
    settings.FAIRQ_K8S_SUBMIT_REFUSED_SECONDS = 6
    pk = submit(world, gpus=1, replicas=2)
    name = f"fq-{pk}-1"
    wait(lambda: job(pk).message.startswith(
        "waiting for the cluster: Kubernetes refused the Job (403)"), what="the refusal shown")
    assert job(pk).status == "ADMITTED"
    events = JobEvent.objects.filter(job_id=pk, kind=JobEvent.Kind.SUBMIT_ERROR)
    assert any(f"{name}-1" in e.reason and "exceeded quota" in e.reason for e in events), \
        [e.reason for e in events]
    wait(lambda: job(pk).status == "FAILED", timeout=60, what="the job FAILED")
    assert job(pk).message.startswith("Kubernetes refused to create its Job for 6 s (403)")
    assert not JobEvent.objects.filter(job_id=pk, kind=JobEvent.Kind.TRANSITION,
                                       to_status="RUNNING").exists()
    wait(lambda: nothing_left(kube, pk), timeout=60,
         what="no Job, pod or Service of the attempt left")
