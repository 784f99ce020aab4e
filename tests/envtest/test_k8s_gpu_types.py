"""A job accepting several GPU types on the real control plane (tests/envtest;
docs/scheduling.md, "Several GPU types"; docs/kubernetes.md, "Node selectors"): it is
submitted as `gpu_types: ["h100", "a100"]`; with room on h100 it runs there, with the
h100 nodes full it runs on a100. Each time the type the plan chose is recorded on the
job and named by its ADMITTED event, the pod fairq creates carries that type's node
selector (read back from the API server), the node it runs on is of that type, and its
GPU time is charged to that type (its billing weight).

The envtest nodes: gpu-h100-0, gpu-h100-1 (8 h100 GPUs each) and gpu-a100-0 (8 a100);
team vision may use 16 h100 GPUs (nominal 8, borrowing 8) and 8+ a100.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import job_body
from tests.envtest.test_k8s_backend import A100_NODES, H100_NODES, Kube, job, kube, submit, wait

__all__ = ["kube"]  # the fixture, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]


def _admitted_event(pk: int) -> Any:
    from queueing.models import JobEvent

    return JobEvent.objects.get(job_id=pk, kind=JobEvent.Kind.TRANSITION,
                                to_status="ADMITTED")


def _submit_types(world: Any, types: list[str], **overrides: Any) -> int:
    """A job posted with `gpu_types` alone (no `gpu_type`)."""
    body = {k: v for k, v in job_body(**overrides).items() if k != "gpu_type"}
    r = world.client(world.member).post("/api/v1/jobs/", {**body, "gpu_types": types},
                                        format="json")
    assert r.status_code == 201, r.content
    return int(r.json()["id"])


def _pod_of(kube: Kube, pk: int) -> dict[str, Any]:
    [pod] = kube.pods("vision", f"fq-{pk}-1")
    return pod


def test_a_job_accepting_h100_and_a100_runs_on_h100_with_room_and_on_a100_when_h100_is_full(
    kube: Kube, world: Any,
) -> None:
    from queueing.models import UsageRecord

    # 1. Room on h100: the preferred type.
    first = _submit_types(world, ["h100", "a100"], gpus=8, env={"FAIRQ_SIM_SECONDS": "2"})
    wait(lambda: job(first).status == "RUNNING", timeout=60, what="the first job RUNNING")
    ran = job(first)
    assert ran.gpu_type.slug == "h100" and ran.gpu_types == ["h100", "a100"]
    k8s_job = kube.jobs("vision", first)[0]
    assert k8s_job["spec"]["template"]["spec"]["nodeSelector"] == {"fairq.io/gpu-type": "h100"}
    pod = _pod_of(kube, first)
    assert pod["spec"]["nodeSelector"] == {"fairq.io/gpu-type": "h100"}
    assert pod["spec"]["nodeName"] in H100_NODES
    body = world.client(world.member).get(f"/api/v1/jobs/{first}/").json()
    assert (body["gpu_type"], body["gpu_types"]) == ("h100", ["h100", "a100"])
    wait(lambda: job(first).status == "SUCCEEDED", timeout=60, what="the first job SUCCEEDED")
    [usage] = UsageRecord.objects.filter(job_id=first)
    assert (usage.gpu_type.slug, usage.billing_weight, usage.gpus) == ("h100", 2.0, 8)

    # 2. The h100 nodes full (16 GPUs, vision's nominal and borrowing): a100.
    filler = submit(world, gpu_type="h100", gpus=8, replicas=2)  # runs until stopped
    wait(lambda: job(filler).status == "RUNNING", timeout=60, what="the h100 filler RUNNING")
    second = _submit_types(world, ["h100", "a100"], gpus=8)
    # The planner's part (docs/scheduling.md, "Several GPU types"): a planner that tries
    # only the first type leaves this job waiting for h100.
    wait(lambda: job(second).status == "RUNNING", timeout=60, what="the second job RUNNING")
    ran = job(second)
    assert ran.gpu_type.slug == "a100"
    event = _admitted_event(second)
    assert event.data["gpu_type"] == "a100" and " as a100 " in event.reason
    k8s_job = kube.jobs("vision", second)[0]
    assert k8s_job["spec"]["template"]["spec"]["nodeSelector"] == {"fairq.io/gpu-type": "a100"}
    pod = _pod_of(kube, second)
    assert pod["spec"]["nodeSelector"] == {"fairq.io/gpu-type": "a100"}
    assert pod["spec"]["nodeName"] in A100_NODES
    body = world.client(world.member).get(f"/api/v1/jobs/{second}/").json()
    assert (body["gpu_type"], body["gpu_types"]) == ("a100", ["h100", "a100"])

    # Cancelled: its GPU time so far is charged to a100 (weight 1), not h100 (weight 2).
    for pk in (second, filler):
        r = world.client(world.member).post(f"/api/v1/jobs/{pk}/cancel/")
        assert r.status_code == 200, r.content
    [usage] = UsageRecord.objects.filter(job_id=second)
    assert (usage.gpu_type.slug, usage.billing_weight, usage.gpus) == ("a100", 1.0, 8)
    # The first job's ADMITTED event named its type too.
    event = _admitted_event(first)
    assert event.data["gpu_type"] == "h100" and " as h100 " in event.reason
