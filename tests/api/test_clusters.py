"""Several clusters in the API: GET /clusters/ for everyone with capacity per cluster and GPU type
from the published cluster view (spot apart), staff writes audited with field messages,
and a job's cluster fields at submit (rule K3: a 400 on the field saying why)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.utils import timezone

from accounts.models import AuditEntry
from queueing.backends.base import NodeInfo
from queueing.models import Cluster, Job, NodePool
from queueing.selectors.cluster import VIEW_KEY, ClusterView
from tests.conftest import World, job_body
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/clusters/"


def publish(*nodes: NodeInfo) -> None:
    """What the worker publishes after a cycle (queueing/services/cluster_view.py)."""
    cache.set(VIEW_KEY, ClusterView(node_list=nodes, published_at=timezone.now()).to_dict())


def three_clusters(world: World) -> dict[str, Cluster]:
    """On-premises H100s, a cloud cluster with A100s and spot H100s, and an unreachable
    one: the dashboard's three clusters."""
    onprem = Cluster.objects.create(name="onprem", sim_nodes="2x8xh100", cost_rank=0,
                                    labels={"region": "eu-west", "cost": "owned"})
    cloud = Cluster.objects.create(name="cloud", sim_nodes="2x8xa100,1x8xh100", cost_rank=10,
                                   labels={"region": "us-east", "cost": "cloud"})
    NodePool.objects.create(cluster=cloud, name="spot-h100", gpu_type=world.h100, spot=True)
    lab = Cluster.objects.create(name="lab", sim_nodes="1x8xa100", cost_rank=5,
                                 labels={"region": "eu-west"},
                                 unreachable_since=timezone.now() - timedelta(minutes=4))
    publish(NodeInfo("onprem/n0", "h100", 8, 8, cluster="onprem"),
            NodeInfo("onprem/n1", "h100", 8, 2, cluster="onprem"),
            NodeInfo("cloud/a0", "a100", 8, 0, cluster="cloud"),
            NodeInfo("cloud/a1", "a100", 8, 4, cluster="cloud"),
            NodeInfo("cloud/s0", "h100", 8, 1, cluster="cloud", spot=True))
    return {"onprem": onprem, "cloud": cloud, "lab": lab}


def test_with_no_cluster_configured_the_implicit_one_is_listed(world: World) -> None:
    body = world.client(world.member).get(URL).json()
    assert [c["name"] for c in body] == [None]  # no URL of its own (clusters/{name}/)
    implicit = body[0]
    assert implicit["implicit"] is True and implicit["reachable"] is True
    # The test settings' simulated cluster: 2x8xh100, 2x8xa100, 1x7xmig-1g-10gb.
    by_type = {g["gpu_type"]: g for g in implicit["gpu_types"]}
    assert by_type["h100"]["capacity"] == 16 and by_type["h100"]["nodes"] == 2
    assert by_type["mig-1g-10gb"]["capacity"] == 7
    assert implicit["spot_capacity"] == 0


def test_every_user_lists_clusters_with_capacity_free_and_spot_per_gpu_type(world: World) -> None:
    three_clusters(world)
    body = world.client(world.outsider).get(URL).json()
    # Rule K2's order: the lowest cost rank first.
    assert [c["name"] for c in body] == ["onprem", "lab", "cloud"]
    onprem, lab, cloud = body
    assert onprem["gpu_types"] == [{"gpu_type": "h100", "nodes": 2, "capacity": 16, "free": 6,
                                    "spot_capacity": 0, "spot_free": 0, "held_by_jobs": 0}]
    assert onprem["labels"] == {"region": "eu-west", "cost": "owned"}
    cloud_types = {g["gpu_type"]: g for g in cloud["gpu_types"]}
    assert (cloud_types["a100"]["capacity"], cloud_types["a100"]["free"]) == (16, 12)
    assert (cloud_types["h100"]["spot_capacity"], cloud_types["h100"]["spot_free"]) == (8, 7)
    assert cloud["capacity"] == 24 and cloud["free"] == 19 and cloud["spot_capacity"] == 8
    assert cloud["pools"] == [{"name": "spot-h100", "gpu_type": "h100", "spot": True,
                               "node_labels": {}, "price_per_gpu_hour": None}]
    assert lab["reachable"] is False and lab["unreachable_since"] is not None
    assert onprem["reachable"] is True and onprem["unreachable_since"] is None
    # How fairq reaches a cluster is staff's business only.
    assert "sim_nodes" not in onprem and "kubeconfig" not in onprem
    staff_view = world.client(world.staff).get(URL).json()
    assert staff_view[0]["sim_nodes"] == "2x8xh100" and staff_view[0]["kube_context"] == ""


def test_a_cluster_counts_the_gpus_of_the_jobs_placed_in_it(world: World) -> None:
    clusters = three_clusters(world)
    JobFactory(team=world.vision, gpu_type=world.h100, gpus_per_replica=4, replicas=2,
               status="RUNNING", cluster=clusters["onprem"])
    JobFactory(team=world.vision, gpu_type=world.h100, gpus_per_replica=1, status="QUEUED")
    onprem = world.client(world.member).get(URL + "onprem/").json()
    assert onprem["running_jobs"] == 1 and onprem["gpu_types"][0]["held_by_jobs"] == 8


def test_staff_add_a_cluster_audited_with_its_location(world: World) -> None:
    r = world.client(world.staff).post(URL, {
        "name": "eu-cloud", "backend": "kubernetes", "kubeconfig": "/etc/fairq/eu.kubeconfig",
        "kube_context": "eu", "labels": {"region": "eu-west"}, "cost_rank": 10}, format="json")
    assert r.status_code == 201, r.json()
    assert r["Location"] == "/api/v1/clusters/eu-cloud/"
    row = Cluster.objects.get(name="eu-cloud")
    assert (row.backend, row.context, row.cost_rank) == ("kubernetes", "eu", 10)
    audit = AuditEntry.objects.get(object_type="queueing.Cluster", action="create")
    assert audit.actor == world.staff and audit.changes["kubeconfig"][1] == "/etc/fairq/eu.kubeconfig"


@pytest.mark.parametrize("user", ["admin", "member", "outsider"])
def test_only_staff_change_clusters(world: World, user: str) -> None:
    Cluster.objects.create(name="onprem", sim_nodes="1x8xh100")
    c = world.client(getattr(world, user))
    assert c.post(URL, {"name": "x", "sim_nodes": "1x8xh100"}, format="json").status_code == 403
    assert c.patch(URL + "onprem/", {"enabled": False}, format="json").status_code == 403
    assert c.post(URL + "onprem/pools/", {"name": "p", "gpu_type": "h100"},
                  format="json").status_code == 403
    assert Cluster.objects.get(name="onprem").enabled and not NodePool.objects.exists()
    assert not AuditEntry.objects.filter(object_type__startswith="queueing.").exists()


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"backend": "slurm", "sim_nodes": ""}, "backend", "Unknown backend 'slurm'"),
    ({"kubeconfig": "/etc/k.yaml"}, "kubeconfig", "simulated cluster"),
    ({"kube_context": "eu"}, "kube_context", "simulated cluster"),
    ({"sim_nodes": ""}, "sim_nodes", "needs its nodes"),
    ({"sim_nodes": "4xh100"}, "sim_nodes", "want COUNTxGPUSxTYPE"),
    ({"sim_nodes": "4x8xb200"}, "sim_nodes", "Unknown GPU types: b200"),
    ({"labels": {"region": "eu west"}}, "labels", "value 'eu west'"),
    ({"labels": {"a=b": "c"}}, "labels", "name 'a=b'"),
    ({"backend": "kubernetes", "sim_nodes": "", "kubeconfig": "k.yaml"}, "kubeconfig",
     "absolute path"),
    ({"backend": "kubernetes", "sim_nodes": "1x8xh100"}, "sim_nodes", "Only a simulated"),
    ({"backend": "kubernetes", "sim_nodes": "", "in_cluster": True,
      "kubeconfig": "/etc/k.yaml"}, "kubeconfig", "in_cluster"),
    ({"name": "Bad_Name"}, "name", "lower-case"),
    ({"privileged": True}, "privileged", "Unknown field"),
])
def test_a_bad_cluster_is_a_400_on_its_field(world: World, body: dict[str, Any], field: str,
                                             words: str) -> None:
    r = world.client(world.staff).post(URL, {"name": "eu", "sim_nodes": "1x8xh100", **body},
                                       format="json")
    assert r.status_code == 400, r.json()
    assert words in " ".join(r.json()["error"]["fields"][field])
    assert not Cluster.objects.exists()
    assert not AuditEntry.objects.filter(object_type="queueing.Cluster").exists()


def test_one_cluster_is_in_cluster_and_names_are_unique(world: World) -> None:
    Cluster.objects.create(name="home", backend="kubernetes", in_cluster=True)
    c = world.client(world.staff)
    r = c.post(URL, {"name": "other", "backend": "kubernetes", "in_cluster": True}, format="json")
    assert r.status_code == 400 and "Cluster home already" in r.json()["error"]["fields"]["in_cluster"][0]
    r = c.post(URL, {"name": "home", "sim_nodes": "1x8xh100"}, format="json")
    assert r.status_code == 400 and "exists" in r.json()["error"]["fields"]["name"][0]


def test_staff_disable_a_cluster_audited_and_it_keeps_its_name(world: World) -> None:
    Cluster.objects.create(name="onprem", sim_nodes="1x8xh100")
    c = world.client(world.staff)
    r = c.patch(URL + "onprem/", {"enabled": False, "cost_rank": 3}, format="json")
    assert r.status_code == 200 and r.json()["enabled"] is False and r.json()["cost_rank"] == 3
    audit = AuditEntry.objects.get(object_type="queueing.Cluster", action="update")
    assert audit.changes == {"enabled": [True, False], "cost_rank": [0, 3]}
    r = c.patch(URL + "onprem/", {"name": "renamed"}, format="json")
    assert r.status_code == 400 and "keeps its name" in r.json()["error"]["fields"]["name"][0]
    r = c.patch(URL + "onprem/", {"kubeconfig": "/x"}, format="json")
    assert r.status_code == 400 and "simulated" in r.json()["error"]["fields"]["kubeconfig"][0]
    assert c.patch(URL + "nowhere/", {"enabled": False}, format="json").status_code == 404


def test_staff_manage_node_pools_audited(world: World) -> None:
    Cluster.objects.create(name="cloud", sim_nodes="1x8xh100")
    c = world.client(world.staff)
    r = c.post(URL + "cloud/pools/", {"name": "spot-h100", "gpu_type": "h100", "spot": True,
                                      "price_per_gpu_hour": "1.2500"}, format="json")
    assert r.status_code == 201, r.json()
    assert r["Location"] == "/api/v1/clusters/cloud/pools/spot-h100/"
    r = c.post(URL + "cloud/pools/", {"name": "x", "gpu_type": "b200"}, format="json")
    assert r.status_code == 400 and "Unknown GPU type 'b200'" in r.json()["error"]["fields"]["gpu_type"][0]
    r = c.post(URL + "cloud/pools/", {"name": "spot-h100", "gpu_type": "h100"}, format="json")
    assert r.status_code == 400 and "has a pool named" in r.json()["error"]["fields"]["name"][0]
    r = c.patch(URL + "cloud/pools/spot-h100/", {"price_per_gpu_hour": "-1"}, format="json")
    assert r.status_code == 400 and "at least 0" in r.json()["error"]["fields"]["price_per_gpu_hour"][0]
    r = c.patch(URL + "cloud/pools/spot-h100/", {"spot": False}, format="json")
    assert r.status_code == 200 and r.json()["spot"] is False
    assert world.client(world.member).get(URL + "cloud/pools/").json()[0]["name"] == "spot-h100"
    assert c.delete(URL + "cloud/pools/spot-h100/").status_code == 204
    assert not NodePool.objects.exists()
    actions = list(AuditEntry.objects.filter(object_type="queueing.NodePool")
                   .order_by("id").values_list("action", flat=True))
    assert actions == ["create", "update", "delete"]


# --- a job's cluster fields (rule K3) ---------------------------------------------------------


def test_a_job_pins_a_cluster_with_a_selector_and_spot_opt_in(world: World) -> None:
    three_clusters(world)
    r = world.client(world.member).post("/api/v1/jobs/", job_body(
        requested_cluster="cloud", cluster_selector={"cost": "cloud"}, allow_spot=True,
        tier="critical"), format="json")
    assert r.status_code == 201, r.json()
    body = r.json()
    assert (body["requested_cluster"], body["cluster_selector"], body["allow_spot"]) == \
        ("cloud", {"cost": "cloud"}, True)
    assert body["cluster"] is None  # queued: not placed yet
    job = Job.objects.get(pk=body["id"])
    assert job.requested_cluster is not None and job.requested_cluster.name == "cloud"
    assert job.cluster_selector == {"cost": "cloud"} and job.allow_spot


def test_a_job_without_cluster_fields_stores_none(world: World) -> None:
    three_clusters(world)
    r = world.client(world.member).post("/api/v1/jobs/", job_body(), format="json")
    assert r.status_code == 201
    assert (r.json()["requested_cluster"], r.json()["cluster_selector"],
            r.json()["allow_spot"]) == (None, {}, False)


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"requested_cluster": "mars"}, "requested_cluster",
     "Unknown cluster 'mars'; enabled: cloud, lab, onprem."),
    ({"requested_cluster": "off"}, "requested_cluster", "Cluster off is disabled"),
    ({"cluster_selector": {"region": "ap-south"}}, "cluster_selector",
     "No enabled cluster carries region=ap-south"),
    ({"requested_cluster": "onprem", "cluster_selector": {"cost": "cloud"}}, "cluster_selector",
     "Cluster onprem carries cost=cloud (it does not)"),
    ({"requested_cluster": "lab"}, "requested_cluster",
     "No h100 nodes in cluster lab; clusters with h100 nodes: cloud, onprem."),
    ({"cluster_selector": {"region": "us-east"}, "gpu_type": "mig-1g-10gb", "gpus": 1},
     "cluster_selector", "No mig-1g-10gb nodes in cluster cloud"),
    ({"cluster_selector": {"region": "eu-west"}, "gpu_type": "a100"}, "cluster_selector",
     None),
    ({"cluster_selector": {"bad key": "x"}}, "cluster_selector", "Label name 'bad key'"),
])
def test_rule_k3_refuses_a_job_no_allowed_cluster_can_run(
        world: World, fields: dict[str, Any], field: str, words: str | None) -> None:
    three_clusters(world)
    Cluster.objects.create(name="off", sim_nodes="1x8xh100", enabled=False)
    r = world.client(world.member).post("/api/v1/jobs/", job_body(**fields), format="json")
    if words is None:  # the eu-west clusters: onprem (h100) and lab (a100): lab has a100
        assert r.status_code == 201, r.json()
        return
    assert r.status_code == 400, r.json()
    assert r.json()["error"]["fields"][field] == [words] or \
        words in r.json()["error"]["fields"][field][0]
    assert not Job.objects.exists()


def test_rule_k3_with_no_cluster_configured(world: World) -> None:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(requested_cluster="eu"),
                                        format="json")
    assert r.status_code == 400
    assert "no clusters are configured" in r.json()["error"]["fields"]["requested_cluster"][0]
    # allow_spot alone needs no cluster row: a preemptible job may use spot anyway.
    r = world.client(world.member).post("/api/v1/jobs/", job_body(allow_spot=True), format="json")
    assert r.status_code == 201 and r.json()["allow_spot"] is True


def test_a_cluster_refusal_comes_with_the_other_fields_refusals(world: World) -> None:
    three_clusters(world)
    r = world.client(world.member).post("/api/v1/jobs/", job_body(
        requested_cluster="mars", image="not an image"), format="json")
    assert r.status_code == 400
    assert set(r.json()["error"]["fields"]) == {"image", "requested_cluster"}


def test_an_array_job_carries_its_cluster_fields(world: World) -> None:
    three_clusters(world)
    r = world.client(world.member).post("/api/v1/jobs/bulk/", {
        **job_body(requested_cluster="onprem", allow_spot=True), "count": 3}, format="json")
    assert r.status_code == 201, r.json()
    jobs = Job.objects.filter(pk__in=r.json()["ids"])
    assert {j.requested_cluster.name for j in jobs if j.requested_cluster} == {"onprem"}
    assert all(j.allow_spot for j in jobs) and jobs.count() == 3
    r = world.client(world.member).post("/api/v1/jobs/bulk/", {
        **job_body(requested_cluster="mars"), "count": 3}, format="json")
    assert r.status_code == 400 and "requested_cluster" in r.json()["error"]["fields"]


def test_a_job_says_where_it_runs_and_the_list_filters_by_cluster(world: World) -> None:
    clusters = three_clusters(world)
    running = JobFactory(team=world.vision, gpu_type=world.h100, status="RUNNING",
                         cluster=clusters["cloud"], requested_cluster=clusters["cloud"])
    JobFactory(team=world.vision, gpu_type=world.h100, status="RUNNING",
               cluster=clusters["onprem"])
    JobFactory(team=world.vision, gpu_type=world.h100, status="QUEUED")
    c = world.client(world.member)
    detail = c.get(f"/api/v1/jobs/{running.pk}/").json()
    assert (detail["cluster"], detail["requested_cluster"]) == ("cloud", "cloud")
    listed = c.get("/api/v1/jobs/?cluster=cloud").json()["results"]
    assert [j["id"] for j in listed] == [running.pk] and listed[0]["cluster"] == "cloud"
    assert len(c.get("/api/v1/jobs/").json()["results"]) == 3
    assert c.get("/api/v1/jobs/?cluster=nowhere").json()["results"] == []


def test_idempotent_resubmit_with_a_pin_returns_the_first_job(world: World) -> None:
    three_clusters(world)
    c = world.client(world.member)
    body = job_body(requested_cluster="onprem")
    first = c.post("/api/v1/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    again = c.post("/api/v1/jobs/", body, format="json", HTTP_IDEMPOTENCY_KEY="k1")
    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    other = c.post("/api/v1/jobs/", job_body(requested_cluster="cloud"), format="json",
                   HTTP_IDEMPOTENCY_KEY="k1")
    assert other.status_code == 422


def test_unknown_clusters_and_pools_are_404_and_anonymous_callers_401(world: World) -> None:
    from rest_framework.test import APIClient

    Cluster.objects.create(name="onprem", sim_nodes="1x8xh100")
    c = world.client(world.member)
    r = c.get(URL + "nowhere/")
    assert r.status_code == 404 and r.json()["error"]["message"] == "cluster 'nowhere' not found"
    assert c.get(URL + "onprem/pools/nowhere/").status_code == 404
    assert c.get(URL + "onprem/pools/").json() == []
    assert APIClient().get(URL).status_code == 401


def test_k8_a_disabled_cluster_is_draining_with_its_jobs_left_then_drained(
        world: World) -> None:
    clusters = three_clusters(world)
    cloud = clusters["cloud"]
    JobFactory(team=world.vision, gpu_type=world.a100, gpus_per_replica=8, status="RUNNING",
               cluster=cloud)
    JobFactory(team=world.nlp, gpu_type=world.a100, gpus_per_replica=4, status="ADMITTED",
               cluster=cloud)
    assert world.client(world.member).get(URL + "cloud/").json()["state"] == "enabled"

    r = world.client(world.staff).patch(URL + "cloud/", {"enabled": False}, format="json")

    assert r.status_code == 200, r.json()
    body = r.json()
    assert (body["enabled"], body["state"], body["running_jobs"], body["drained_at"]) == (
        False, "draining", 2, None)
    states = {c["name"]: c["state"]
              for c in world.client(world.outsider).get(URL).json()}
    assert states == {"onprem": "enabled", "lab": "enabled", "cloud": "draining"}
    # The scheduler found nothing left there (rule K8): drained.
    Job.objects.filter(cluster=cloud).update(status="SUCCEEDED")
    Cluster.objects.filter(pk=cloud.pk).update(drained_at=timezone.now())
    body = world.client(world.member).get(URL + "cloud/").json()
    assert (body["state"], body["running_jobs"]) == ("drained", 0)
    assert body["drained_at"] is not None


def test_k8_enabling_a_drained_cluster_clears_drained_at_audited(world: World) -> None:
    three_clusters(world)
    at = timezone.now()
    Cluster.objects.filter(name="cloud").update(enabled=False, drained_at=at)

    body = world.client(world.staff).patch(URL + "cloud/", {"enabled": True},
                                           format="json").json()

    assert (body["state"], body["drained_at"]) == ("enabled", None)
    assert Cluster.objects.get(name="cloud").drained_at is None
    audit = AuditEntry.objects.get(object_type="queueing.Cluster", action="update")
    assert audit.changes == {"enabled": [False, True], "drained_at": [at.isoformat(), None]}
