"""A web process is no cluster client (docs/kubernetes.md "RBAC"): with the
worker running jobs on the real control plane, serving submits, job detail and logs, the
queue, dashboards and capacity builds no backend and sends no request to the API server.

The worker's side (cycles, the log archive) runs first as the worker would; then the
test turns into a web process: constructing a `KubernetesBackend` raises, and every
request this thread sends through the Kubernetes client is counted (the worker's watch
threads keep running in the background, as in a real worker, and are not counted).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from tests.envtest.test_k8s_backend import Kube, job, kube, submit, wait

__all__ = ["kube"]  # the fixture, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def as_web_process(kube: Kube, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """From here on this thread is a web process: no backend may be built, and each API
    server request it sends is recorded."""
    from kubernetes.client import rest

    from queueing.backends.kubernetes import KubernetesBackend
    from queueing.composition import reset_backends

    me = threading.get_ident()
    sent: list[str] = []
    real_request = rest.RESTClientObject.request

    def counted(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if threading.get_ident() == me:
            sent.append(f"{method} {url}")
        return real_request(self, method, url, *args, **kwargs)

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a web process built a Kubernetes backend")

    worker_backend = kube.backend
    reset_backends()  # this process's get_backend() would now build a new one
    monkeypatch.setattr(rest.RESTClientObject, "request", counted)
    monkeypatch.setattr(KubernetesBackend, "__init__", refuse)
    try:
        yield sent
    finally:
        kube.backend = worker_backend  # closed by the kube fixture


def _web_requests(world: Any, client: Any, running: int, queued: int,
                  sent: list[str] | None) -> None:
    """What the web app serves, each answered 200/201 from fairq's own data."""
    api = world.client(world.member)
    detail = api.get(f"/api/v1/jobs/{queued}/")
    assert detail.status_code == 200, detail.content
    assert detail.json()["queue"]["position"] == 1, detail.json()["queue"]
    logs = api.get(f"/api/v1/jobs/{running}/logs/")
    assert logs.status_code == 200
    assert any("[fairq] no logs from pod" in line for line in logs.json()["lines"])
    assert api.get("/api/v1/jobs/").status_code == 200
    assert api.get(f"/api/v1/jobs/{running}/").status_code == 200
    capacity = api.get("/api/v1/capacity/")
    assert capacity.status_code == 200
    assert {c["gpu_type"] for c in capacity.json() if c["capacity"]} >= {"h100"}
    made = api.post("/api/v1/jobs/", {**_body(), "gpus": 99}, format="json")
    assert made.status_code == 400 and "largest" in str(made.json())  # the view's nodes
    made = api.post("/api/v1/jobs/", _body(), format="json")
    assert made.status_code == 201, made.content
    client.force_login(world.member)
    for url in ("/", "/jobs/", f"/jobs/{running}/", f"/jobs/{queued}/", "/jobs/new/",
                "/teams/vision/"):
        page = client.get(url)
        assert page.status_code == 200, (url, page.status_code)
    assert "[fairq] no logs from pod" in client.get(f"/jobs/{running}/").content.decode()
    client.force_login(world.staff)
    assert client.get("/quotas/").status_code == 200
    if sent is not None:
        assert sent == []


def _body() -> dict[str, Any]:
    from tests.conftest import job_body

    return job_body(gpus=1, env={"FAIRQ_SIM_SECONDS": "1"})


def test_the_web_process_makes_no_request_to_the_api_server(
    kube: Kube, world: Any, client: Any, request: pytest.FixtureRequest,
) -> None:
    from django.utils import timezone

    from queueing.services.logs import job_logs_archive

    pk = submit(world, gpus=1, env={"FAIRQ_SIM_SECONDS": "60"})
    wait(lambda: job(pk).status == "RUNNING", what="the job RUNNING")
    job_logs_archive(backend=kube.backend, now=timezone.now())
    # 2 x 8 h100 fits the 16 GPUs when empty (rule E6), not beside the running one.
    queued = submit(world, gpus=8, replicas=2, tier="low")
    wait(lambda: job(queued).status == "QUEUED", what="a cycle over the queue")

    sent = request.getfixturevalue("as_web_process")
    _web_requests(world, client, pk, queued, sent=sent)


def test_a_web_process_serving_the_dashboard_and_100_submits_opens_no_watch(
    kube: Kube, world: Any, client: Any, request: pytest.FixtureRequest,
) -> None:
    """Without a cluster client: submit validation (the largest node of a GPU type), the submit preview,
    the dashboard and the queue read the published cluster view, so 100 submits through
    the API and the web form, with the dashboard served between them, send the API server
    nothing: no watch, no list of pods or nodes."""
    from queueing.models import Job

    pk = submit(world, gpus=1, env={"FAIRQ_SIM_SECONDS": "60"})
    wait(lambda: job(pk).status == "RUNNING", what="the job RUNNING (a published view)")

    sent = request.getfixturevalue("as_web_process")
    api = world.client(world.member)
    client.force_login(world.member)
    before = Job.objects.count()
    for i in range(100):
        if i % 10 == 0:  # the web form and its preview, and the pages, now and then
            page = client.post("/jobs/new/check/", {**_form(), "name": f"web-{i}"})
            assert page.status_code == 200, page.content[:300]
            made = client.post("/jobs/new/", {**_form(), "name": f"web-{i}"})
            assert made.status_code == 302, made.content[:500]
            for url in ("/", "/jobs/", f"/jobs/{pk}/"):
                assert client.get(url).status_code == 200, url
        else:
            made = api.post("/api/v1/jobs/", {**_body(), "name": f"api-{i}"}, format="json")
            assert made.status_code == 201, made.content
    assert Job.objects.count() == before + 100
    too_big = api.post("/api/v1/jobs/", {**_body(), "gpus": 99}, format="json")
    assert too_big.status_code == 400 and "largest" in str(too_big.json())
    assert sent == [], sent[:10]

    # The count is real: a request this thread sends is seen.
    kube.backend.core.list_namespace(limit=1)
    assert [s.split(" ")[0] for s in sent] == ["GET"]


def _form() -> dict[str, Any]:
    return {"team": "vision", "image": "ghcr.io/acme/train:1", "command": "python train.py",
            "gpu_type": "h100", "gpus": "1", "replicas": "1", "tier": "normal",
            "env": "FAIRQ_SIM_SECONDS=1"}
