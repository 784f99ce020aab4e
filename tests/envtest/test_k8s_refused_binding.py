"""A refused create is bounded whatever the namespace's state (docs/kubernetes.md, "When a
create fails"), on the real control plane (tests/envtest): the worker runs as
fairq-scheduler (platform/k8s/base/rbac.yaml, impersonated), its team namespace is
provisioned, and then the RoleBinding that lets it create Jobs there is removed. Jobs
admitted afterwards are refused (403); they fail within FAIRQ_K8S_SUBMIT_REFUSED_SECONDS
with the API server's words, and their GPUs are free again: a job of another team that
needs them is admitted.

The worker process is restarted (its backend rebuilt) after the first refusal, as a
deploy, a crash or a Celery child's recycling does: the new process has never seen the
namespace ready, and finds it unreadable (403) before it tries to create anything.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.envtest.test_k8s_backend import Kube, client, job, kube, submit, wait
from tests.envtest.test_k8s_rbac import rbac_applied

__all__ = ["kube", "rbac_applied"]  # the fixtures, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]

SCHED = "system:serviceaccount:fairq-system:fairq-scheduler"
LIMIT = 8


def as_scheduler(backend: Any) -> Any:
    """The worker's backend, its requests sent as fairq-scheduler from now on."""
    backend.api.set_default_header("Impersonate-User", SCHED)
    return backend


def restart_worker(kube: Kube) -> None:
    """A new worker process: its backend built again (from settings), as fairq-scheduler."""
    from queueing.composition import get_backend, reset_backends

    kube.backend.close()
    reset_backends()
    kube.backend = as_scheduler(get_backend())
    kube.backend.wait_synced(30)


def test_jobs_refused_after_the_binding_is_removed_fail_in_time_and_free_their_gpus(
    rbac_applied: None, kube: Kube, world: Any, settings: Any,
) -> None:
    from queueing.models import JobEvent

    settings.FAIRQ_K8S_SUBMIT_REFUSED_SECONDS = LIMIT
    as_scheduler(kube.backend)
    # The namespace works for the scheduler: a first job runs (the namespace is known).
    first = submit(world, gpus=1, env={"FAIRQ_SIM_SECONDS": "1"})
    wait(lambda: job(first).status == "SUCCEEDED", timeout=60, what="the first job done")

    client.RbacAuthorizationV1Api(kube.core.api_client).delete_namespaced_role_binding(
        "fairq-scheduler", kube.ns("vision"))

    # Four jobs of 4 GPUs: every h100 GPU of the cluster (two nodes of 8).
    pks = [submit(world, gpus=4, env={"FAIRQ_SIM_SECONDS": "30"}) for _ in range(4)]
    wait(lambda: all(job(pk).message.startswith(
        "waiting for the cluster: Kubernetes refused the Job (403)") for pk in pks),
        timeout=60, what="the refusals shown")
    assert {job(pk).status for pk in pks} == {"ADMITTED"}
    started = time.monotonic()
    restart_worker(kube)

    wait(lambda: all(job(pk).status == "FAILED" for pk in pks), timeout=LIMIT + 40,
         what="every refused job FAILED")
    took = time.monotonic() - started
    assert took < LIMIT + 30, took
    for pk in pks:
        failed = job(pk)
        assert failed.message.startswith(f"Kubernetes refused to create its Job for {LIMIT} s"), \
            failed.message
        assert "403" in failed.message, failed.message
        assert failed.submitted_to_backend_at is None
        assert JobEvent.objects.filter(job_id=pk, kind=JobEvent.Kind.TRANSITION,
                                       to_status="FAILED",
                                       reason__startswith="Kubernetes refused").exists()
        assert not JobEvent.objects.filter(job_id=pk, kind=JobEvent.Kind.TRANSITION,
                                           to_status="RUNNING").exists()
    assert {j["metadata"]["labels"]["fairq.io/job-id"] for j in kube.jobs("vision")} <= \
        {str(first)}

    # The team's next job is not admitted into the same refusal: it waits, holding nothing,
    # with the reason (its namespace is not provisioned any more).
    later = submit(world, gpus=1)
    wait(lambda: True, what="a cycle")
    assert job(later).status == "QUEUED"
    detail = world.client(world.member).get(f"/api/v1/jobs/{later}/").json()
    assert "namespace_not_provisioned" in {r["code"] for r in detail["queue"]["reasons"]}

    # Their GPUs are free again: an 8-GPU job of nlp (no h100 GPU was left while they
    # held 16) is admitted and runs.
    big = submit(world, world.outsider, team="nlp", gpus=8, env={"FAIRQ_SIM_SECONDS": "1"})
    wait(lambda: job(big).status in ("RUNNING", "SUCCEEDED"), timeout=60,
         what="nlp's job running on the freed GPUs")
