"""Logs that outlive the pod on the real control plane: a 2-replica job is
cancelled, fairq deletes its pods, and each replica's log stays readable through the API.

The fake kubelet serves no container logs, so the pod log read is replaced by one that
answers like a kubelet would (a line naming the pod); everything else is real: the pods
listed by their workload label, the cancel's stop task deleting the Job and its pods, the
tails kept in the "fairq-logs" storage and read back by a process that asks the cluster
nothing.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from tests.envtest.test_k8s_backend import Kube, job, kube, submit, wait

__all__ = ["kube"]  # the fixture, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]


def test_each_replicas_log_stays_readable_after_its_pods_are_deleted(
    kube: Kube, world: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    pk = submit(world, gpus=1, replicas=2, env={"FAIRQ_SIM_SECONDS": "600"})
    name = f"fq-{pk}-1"
    wait(lambda: job(pk).status == "RUNNING"
         and len([p for p in kube.pods("vision", name)
                  if p["status"].get("phase") == "Running"]) == 2,
         what="both replicas Running")
    # In replica order (the fairq.io/replica label), which is not name order: replica 1's
    # pod fq-<id>-1-1-... sorts before replica 0's fq-<id>-1-<suffix>.
    pods = [p["metadata"]["name"] for p in sorted(
        kube.pods("vision", name), key=lambda p: int(p["metadata"]["labels"]["fairq.io/replica"]))]

    def pod_log(pod: str, namespace: str, **kwargs: Any) -> str:
        return f"hello from {pod}\nstep 1 loss 0.5"

    monkeypatch.setattr(kube.backend.core, "read_namespaced_pod_log", pod_log)
    r = world.client(world.member).post(f"/api/v1/jobs/{pk}/cancel/")  # stops on commit
    assert r.status_code == 200, r.content
    wait(lambda: not kube.pods("vision", name), cycle=False, timeout=60,
         what="the pods deleted")

    def no_cluster(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a log read went to the cluster")

    monkeypatch.setattr(kube.backend, "logs", no_cluster)
    api = world.client(world.member)
    for replica, pod in enumerate(pods):
        body = api.get(f"/api/v1/jobs/{pk}/logs/?replica={replica}").json()
        assert body["source"] == "archived", body
        assert body["lines"] == [f"hello from {pod}", "step 1 loss 0.5"]
        assert body["exit"].startswith("CANCELLED")
    assert api.get(f"/api/v1/jobs/{pk}/logs/").json()["attempts"] == [
        {"attempt": 1, "replicas": [0, 1], "final": True}]
    page = Client()
    page.force_login(world.member)
    html = page.get(f"/jobs/{pk}/?replica=1").content.decode()
    assert f"hello from {pods[1]}" in html and "kept after it ended" in html
