"""The web submit form and the API take one path from a job's fields to a JobInput
(`queueing/services/job_input.py::job_input_of`): the same cluster fields (rules K3-K4,
rule K1's largest gang) and dependencies (rule D3) are refused with the same messages on
the same fields, and a good submit queues the same JobInput through either."""

from __future__ import annotations

from typing import Any

import pytest

from queueing.api import jobs as api_jobs
from queueing.api import views as api_views
from queueing.models import Cluster, Job
from queueing.services import jobs as service_jobs
from queueing.services.jobs import JobInput
from tests.api.test_clusters import three_clusters
from tests.conftest import World, job_body
from tests.web.test_pages import form_body, login

pytestmark = pytest.mark.django_db


def _web_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """The API's fields as the submit page posts them."""
    out: dict[str, Any] = {}
    for name, value in fields.items():
        if name == "cluster_selector":
            out[name] = "\n".join(f"{k}={val}" for k, val in value.items())
        elif name == "allow_spot":
            if value:
                out[name] = "on"
        elif name == "dependencies":  # the stored form (`after_ok`), Slurm's word
            out[name] = ",".join(f"{d['type'].replace('_', '')}:{d['job']}" for d in value)
        else:
            out[name] = str(value)
    return out


def _api_refusal(world: World, fields: dict[str, Any]) -> dict[str, list[str]]:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(**fields), format="json")
    assert r.status_code == 400, r.json()
    refused: dict[str, list[str]] = r.json()["error"]["fields"]
    return refused


def _web_refusal(world: World, fields: dict[str, Any]) -> dict[str, list[str]]:
    r = login(world.member).post("/jobs/new/", form_body(**_web_fields(fields)))
    assert r.status_code == 400
    return {name: list(messages) for name, messages in r.context["form"].errors.items()}


# Each: the API's fields, and the field the refusal is on.
REFUSED = [
    ({"requested_cluster": "mars"}, "requested_cluster"),
    ({"requested_cluster": "off"}, "requested_cluster"),  # disabled
    ({"cluster_selector": {"region": "ap-south"}}, "cluster_selector"),
    ({"requested_cluster": "onprem", "cluster_selector": {"cost": "cloud"}}, "cluster_selector"),
    ({"requested_cluster": "lab"}, "requested_cluster"),  # no h100 nodes there
    ({"cluster_selector": {"region": "us-east"}, "gpu_type": "a100", "gpus": 8, "replicas": 3},
     "replicas"),  # rule K1: cloud holds 2 replicas of 8 a100s
    ({"requested_cluster": "onprem", "gpus": 8, "replicas": 3}, "replicas"),
    ({"cluster_selector": {"bad key": "x"}}, "cluster_selector"),
    ({"dependencies": [{"type": "after_ok", "job": 999999}]}, "dependencies"),
]


@pytest.mark.parametrize(("fields", "field"), REFUSED)
def test_k3_the_web_form_and_the_api_refuse_alike(world: World, fields: dict[str, Any],
                                                  field: str) -> None:
    three_clusters(world)
    Cluster.objects.create(name="off", sim_nodes="1x8xh100", enabled=False)
    api = _api_refusal(world, fields)
    web = _web_refusal(world, fields)
    assert field in api and api == web
    assert not Job.objects.exists()


def test_k3_with_no_cluster_configured_the_web_form_and_the_api_refuse_alike(
        world: World) -> None:
    fields = {"cluster_selector": {"region": "eu-west"}}
    api = _api_refusal(world, fields)
    assert "no clusters are configured" in api["cluster_selector"][0]
    assert _web_refusal(world, fields) == api


@pytest.mark.parametrize("fields", [
    {},
    {"requested_cluster": "cloud", "cluster_selector": {"cost": "cloud"}, "allow_spot": True},
    {"cluster_selector": {"region": "eu-west"}, "gpu_type": "a100"},
    {"requested_cluster": "onprem", "gpus": 8, "replicas": 2, "tier": "critical"},
])
def test_k3_a_good_submit_queues_the_same_job_input_through_either(
        world: World, monkeypatch: pytest.MonkeyPatch, fields: dict[str, Any]) -> None:
    three_clusters(world)
    queued: list[JobInput] = []
    real = service_jobs.job_submit_with_event

    def recorded(**kw: Any) -> Any:
        queued.append(kw["data"])
        return real(**kw)

    # The API's view and fast lane call it by their own names, the web's `job_submit`
    # through the module.
    monkeypatch.setattr(api_views, "job_submit_with_event", recorded)
    monkeypatch.setattr(api_jobs, "job_submit_with_event", recorded)
    monkeypatch.setattr(service_jobs, "job_submit_with_event", recorded)
    body = {**fields, "env": {"SEED": "1", "LR": "0.1"}}
    r = world.client(world.member).post("/api/v1/jobs/", job_body(**body), format="json")
    assert r.status_code == 201, r.json()
    r = login(world.member).post("/jobs/new/", form_body(**_web_fields(fields)))
    assert r.status_code == 302, r.context["form"].errors if r.context else r
    api, web = queued
    assert api == web
    pin = fields.get("requested_cluster")
    assert (web.requested_cluster.name if web.requested_cluster else None) == pin
    assert web.cluster_selector == fields.get("cluster_selector", {})
    assert web.allow_spot is bool(fields.get("allow_spot"))
