"""Rules A5 and R8 (docs/scheduling.md) with a multi-replica victim on the real control
plane (Kubernetes 1.20, tests/envtest): a preemptor stays nominated, waiting with
`preempting` and searching no new victims, until every replica of its victim is gone,
not only replica 0's.

The fake kubelet deletes a terminating pod at once; a finalizer on replica 1's pod keeps
it listed, Running and being deleted, as a pod in its termination grace is (it still
holds its GPUs): replica 0's Job goes, replica 1's Job (Foreground) stays with it.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.test import override_settings

from tests.envtest.test_k8s_backend import Kube, job, kube, submit, wait

__all__ = ["kube"]  # the fixture, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]

HOLD = "fairq.test/hold"


# Rule R9 off: this test is about how preemption is carried out on the cluster, and its
# victim started before its preemptor was submitted, so at the default ratio (lost work at
# most the preemptor's GPUs x its wait) the preemptor would wait for the victim to end.
@override_settings(FAIRQ_PREEMPTION_LOST_PER_WAIT=-1)
def test_r8_a_preemptor_waits_for_every_replica_of_its_victim(
    kube: Kube, world: Any,
) -> None:
    from django.utils import timezone

    from queueing.models import JobEvent
    from queueing.policy.admission import WaitReason
    from queueing.selectors.preemption import nominated_preemptors
    from queueing.services.scheduler import scheduler_cycle

    # Both H100 nodes: a 2 x 8-GPU low-tier victim, one replica per node.
    victim = submit(world, gpus=8, replicas=2, gpu_type="h100", tier="low")
    wait(lambda: job(victim).status == "RUNNING", timeout=60, what="the victim RUNNING")
    name = f"fq-{victim}-1"
    [replica_1] = [p for p in kube.pods("vision", name)
                   if p["metadata"]["labels"]["fairq.io/replica"] == "1"]
    pod_name = replica_1["metadata"]["name"]
    kube.core.patch_namespaced_pod(pod_name, kube.ns("vision"),
                                   {"metadata": {"finalizers": [HOLD]}})
    try:
        high = submit(world, world.outsider, team="nlp", gpus=8, replicas=2,
                      gpu_type="h100", tier="high")
        wait(lambda: job(victim).attempt == 2, timeout=30, what="the victim preempted")
        # Replica 0's Job is gone; replica 1's stays (its pod holds 8 GPUs).
        wait(lambda: [j["metadata"]["name"] for j in kube.jobs("vision", victim)]
             == [f"{name}-1"], cycle=False, timeout=30, what="only replica 1's Job left")

        def held() -> int:
            live = {s.name for s in kube.backend.statuses(now=timezone.now())}
            return nominated_preemptors(now=timezone.now(), live_workloads=live).get(high, 0)

        # Past the termination grace (2 s in these tests) the victim's workload is still
        # listed (stopping), so it still counts: the preemptor waits for it.
        deadline = time.monotonic() + 6
        while time.monotonic() < deadline:
            plan = scheduler_cycle().plan
            assert plan is not None and plan.waits[high].reason == WaitReason.PREEMPTING, \
                plan.waits[high] if plan else None
            assert held() == 1 and job(high).status == "QUEUED"
            time.sleep(0.5)
        status = {s.name: s for s in kube.backend.statuses(now=timezone.now())}[name]
        assert status.stopping and status.job_id == victim and status.attempt == 1
    finally:
        kube.core.patch_namespaced_pod(pod_name, kube.ns("vision"),  # a JSON patch
                                       [{"op": "remove", "path": "/metadata/finalizers"}])
    wait(lambda: job(high).status == "RUNNING", timeout=60, what="the preemptor RUNNING")
    assert JobEvent.objects.filter(kind=JobEvent.Kind.PREEMPTED).count() == 1
    # Replica 1's Job goes once its pod does (the garbage collector, in the background).
    wait(lambda: not kube.jobs("vision", victim), cycle=False, timeout=30,
         what="the victim's last Job gone")
