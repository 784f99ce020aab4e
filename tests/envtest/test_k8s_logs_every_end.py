"""Every replica's log is kept before anything of its job is deleted, on every end
(docs/kubernetes.md, "Logs"), on the real control plane (Kubernetes 1.20, tests/envtest):

- a replica fails: the attempt fails, the other replica is stopped (it would wait on its
  dead peer for ever), and the failing replica's log - the one its user needs - is kept
  first, with the other's;
- a cancel and a preemption whose log read the cluster does not answer for one replica
  (a kubelet or the API server timing out under load): the workload is not deleted on a
  note, it stays until a later read keeps every replica's log (FAIRQ_LOG_KEEP_RETRY_SECONDS).

The fake kubelet serves no container logs, so the pod log read is replaced by one that
answers like a kubelet would (a line naming the pod); everything else is real.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import override_settings

from tests.envtest.test_k8s_backend import ApiException, Kube, job, kube, submit, wait

__all__ = ["kube"]  # the fixture, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]


def _pods_in_replica_order(kube: Kube, team: str, name: str) -> list[str]:
    return [p["metadata"]["name"] for p in sorted(
        kube.pods(team, name), key=lambda p: int(p["metadata"]["labels"]["fairq.io/replica"]))]


def _kubelet_logs(kube: Kube, monkeypatch: pytest.MonkeyPatch, *,
                  unanswered: set[str] | None = None) -> list[str]:
    """Pod logs as a kubelet serves them; the pods in `unanswered` time out once (a 500
    from the API server, as when it cannot reach the kubelet). Returns the pods asked."""
    asked: list[str] = []
    once = set(unanswered or ())

    def pod_log(pod: str, namespace: str, **kwargs: Any) -> str:
        asked.append(pod)
        if pod in once:
            once.discard(pod)
            raise ApiException(status=500, reason="Internal Server Error")
        return f"hello from {pod}\nstep 1 loss 0.5"

    monkeypatch.setattr(kube.backend.core, "read_namespaced_pod_log", pod_log)
    return asked


def _kept(world: Any, pk: int, attempt: int, pods: list[str]) -> None:
    api = world.client(world.member)
    for replica, pod in enumerate(pods):
        body = api.get(f"/api/v1/jobs/{pk}/logs/?attempt={attempt}&replica={replica}").json()
        assert body["source"] == "archived", body
        assert body["lines"] == [f"hello from {pod}", "step 1 loss 0.5"], (replica, body)


def test_a_failing_replicas_log_is_kept_before_its_jobs_are_deleted(
    kube: Kube, world: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    pk = submit(world, gpus=2, replicas=2,
                env={"FAIRQ_SIM_SECONDS": "3", "FAIRQ_SIM_FAIL_REPLICA": "1",
                     "FAIRQ_SIM_EXIT_CODE": "3"})
    name = f"fq-{pk}-1"
    wait(lambda: job(pk).status == "RUNNING" and len(kube.pods("vision", name)) == 2,
         timeout=60, what="both replicas placed")
    pods = _pods_in_replica_order(kube, "vision", name)
    _kubelet_logs(kube, monkeypatch)
    wait(lambda: job(pk).status == "FAILED", timeout=60, what="the job FAILED")
    assert "replica 1 failed: exit code 3" in job(pk).message
    # The other replica waits on its dead peer: stopped, its Jobs and pods deleted.
    wait(lambda: not kube.jobs("vision", pk) and not kube.pods("vision", name), timeout=60,
         what="the Jobs and pods deleted")
    _kept(world, pk, 1, pods)


@override_settings(FAIRQ_LOG_KEEP_RETRY_SECONDS=60)
def test_a_cancel_keeps_a_replicas_log_the_cluster_did_not_answer_for_at_first(
    kube: Kube, world: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    pk = submit(world, gpus=1, replicas=2, env={"FAIRQ_SIM_SECONDS": "600"})
    name = f"fq-{pk}-1"
    wait(lambda: job(pk).status == "RUNNING"
         and len([p for p in kube.pods("vision", name)
                  if p["status"].get("phase") == "Running"]) == 2,
         what="both replicas Running")
    pods = _pods_in_replica_order(kube, "vision", name)
    asked = _kubelet_logs(kube, monkeypatch, unanswered={pods[1]})
    r = world.client(world.member).post(f"/api/v1/jobs/{pk}/cancel/")  # stops on commit
    assert r.status_code == 200, r.content
    wait(lambda: not kube.pods("vision", name), timeout=60, what="the pods deleted")
    _kept(world, pk, 1, pods)
    assert asked.count(pods[1]) >= 2  # read again once the kubelet answered
    assert job(pk).status == "CANCELLED"


# Rule R9 off: the victim started before its preemptor was submitted (as in
# test_k8s_preempt_replicas.py).
@override_settings(FAIRQ_PREEMPTION_LOST_PER_WAIT=-1, FAIRQ_LOG_KEEP_RETRY_SECONDS=60)
def test_a_preemption_keeps_a_replicas_log_the_cluster_did_not_answer_for_at_first(
    kube: Kube, world: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    victim = submit(world, gpus=8, replicas=2, gpu_type="h100", tier="low")
    name = f"fq-{victim}-1"
    wait(lambda: job(victim).status == "RUNNING"
         and len([p for p in kube.pods("vision", name)
                  if p["status"].get("phase") == "Running"]) == 2,
         timeout=60, what="the victim's replicas Running")
    pods = _pods_in_replica_order(kube, "vision", name)
    asked = _kubelet_logs(kube, monkeypatch, unanswered={pods[1]})
    high = submit(world, world.outsider, team="nlp", gpus=8, replicas=2, gpu_type="h100",
                  tier="high")
    wait(lambda: job(victim).attempt == 2, timeout=30, what="the victim preempted")
    wait(lambda: job(high).status == "RUNNING", timeout=90, what="the preemptor RUNNING")
    assert not kube.pods("vision", name)
    _kept(world, victim, 1, pods)
    assert asked.count(pods[1]) >= 2  # read again once the kubelet answered
