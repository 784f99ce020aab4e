"""A notebook session on a real control plane (tests/envtest; docs/sessions.md, "The
pod"): its Job runs `jupyter lab` under the session's path, the pod gets the token as
JUPYTER_TOKEN (not in the job's stored env), and the pod's IP reaches
`notebook_upstream` through the backend's status. Opening it through fairq's proxy is
the proxy's own test."""

from __future__ import annotations

from typing import Any

import pytest

from tests.envtest import test_k8s_backend
from tests.envtest.test_k8s_backend import Kube, job, wait

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]

base_kube = test_k8s_backend.kube


@pytest.fixture(name="kube")
def _kube(base_kube: Kube) -> Kube:
    return base_kube


def test_a_session_pod_runs_jupyter_lab_with_its_token_and_reports_its_ip(
        kube: Kube, world: Any) -> None:
    """The sync that provisioned the cluster (the fixture's `sync_cluster`) made the
    sessions' tier and its PriorityClass: the pod is admitted at once."""
    from kubernetes import client

    from queueing.models import Job, Tier
    from queueing.services.sessions import notebook_token, notebook_upstream

    tier = Tier.objects.get(slug="interactive")
    pc = client.SchedulingV1Api(kube.backend.api).read_priority_class(tier.priority_class_name)
    assert pc.value == tier.priority_value

    r = world.client(world.member).post("/api/v1/sessions/", {
        "team": "vision", "gpu_type": "a100", "gpus": 1,
        "image": "quay.io/jupyter/base-notebook:latest"}, format="json")
    assert r.status_code == 201, r.content
    pk = r.json()["id"]
    wait(lambda: job(pk).status == "RUNNING", what="the session RUNNING")
    [k8s_job] = kube.jobs("vision", pk)
    container = k8s_job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == [
        "jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser",
        f"--ServerApp.base_url=/sessions/{pk}/lab/", "--ServerApp.root_dir=/home/jovyan/work"]
    token = notebook_token(job_id=pk, attempt=1)
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    assert env["JUPYTER_TOKEN"] == token
    assert "JUPYTER_TOKEN" not in Job.objects.get(pk=pk).env
    [pod] = kube.pods("vision", f"fq-{pk}-1")
    ip = pod["status"]["podIP"]
    assert ip
    up = wait(lambda: notebook_upstream(job(pk)), what="the pod's address recorded")
    assert up.base_url == f"http://{ip}:8888" and up.prefix == f"/sessions/{pk}/lab/"
    assert up.token == token
    detail = world.client(world.member).get(f"/api/v1/sessions/{pk}/").json()
    assert detail["ready"] is True and token not in str(detail)
