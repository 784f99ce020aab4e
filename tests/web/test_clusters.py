"""Several clusters on the web pages: the dashboard's capacity per cluster (GPUs, free, spot,
reachable or unreachable since), the job page's cluster, pin, selector and spot opt-in,
the submit form's cluster choice and spot opt-in (rule K3's refusals inline), the staff
cluster page's nodes grouped by cluster, and the Django admin of clusters and pools."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from accounts.models import AuditEntry
from queueing.memo import forget_all
from queueing.models import Cluster, Job, NodePool
from tests.api.test_clusters import three_clusters
from tests.conftest import World
from tests.factories import JobFactory
from tests.web.test_pages import form_body, login

pytestmark = pytest.mark.django_db


def _text(html: bytes) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html.decode()))


def test_the_dashboard_shows_capacity_per_cluster(world: World) -> None:
    three_clusters(world)
    page = login(world.member).get("/")
    assert page.status_code == 200
    html = page.content.decode()
    section = html[html.index('id="clusters"'):html.index("</section>", html.index('id="clusters"'))]
    text = _text(section.encode())
    # Rule K2's order, each with its state and per GPU type free / GPUs and spot.
    assert text.index("onprem") < text.index("lab") < text.index("cloud")
    assert "onprem cost=owned, region=eu-west reachable h100 6 / 16" in text
    assert "lab region=eu-west unreachable since" in text and "4 minutes ago" in text
    assert "no nodes seen (unreachable: its nodes left the plan)" in text
    assert "h100 7 / 8 7 / 8" in text  # cloud's spot h100s: free / GPUs, spot free / spot
    assert "a100 12 / 16 —" in text


def test_k8_the_dashboard_shows_a_draining_cluster_with_its_jobs_left(world: World) -> None:
    clusters = three_clusters(world)
    Cluster.objects.filter(pk=clusters["cloud"].pk).update(enabled=False)
    Cluster.objects.filter(pk=clusters["lab"].pk).update(enabled=False,
                                                          drained_at=clusters["lab"].created_at)
    JobFactory(team=world.vision, gpu_type=world.a100, status="RUNNING",
               cluster=clusters["cloud"])
    html = login(world.member).get("/").content.decode()
    section = html[html.index('id="clusters"'):html.index("</section>", html.index('id="clusters"'))]
    text = _text(section.encode())
    assert "cloud cost=cloud, region=us-east draining 1 job still there a100" in text
    assert "lab region=eu-west drained" in text


def test_the_dashboard_has_no_cluster_card_without_clusters(world: World) -> None:
    page = login(world.member).get("/")
    assert page.status_code == 200 and b'id="clusters"' not in page.content


def test_the_job_page_says_where_it_runs_and_what_it_asked(world: World) -> None:
    clusters = three_clusters(world)
    job = JobFactory(team=world.vision, gpu_type=world.h100, status="RUNNING",
                     cluster=clusters["cloud"], requested_cluster=clusters["cloud"],
                     cluster_selector={"cost": "cloud"}, allow_spot=True)
    text = _text(login(world.member).get(f"/jobs/{job.pk}/").content)
    assert "Cluster runs in cloud pinned to cloud clusters with cost=cloud may run on spot " \
           "nodes (rule K4)" in text
    queued = JobFactory(team=world.vision, gpu_type=world.h100, status="QUEUED",
                        cluster_selector={"region": "eu-west"})
    assert "Cluster not placed yet clusters with region=eu-west" in \
        _text(login(world.member).get(f"/jobs/{queued.pk}/").content)


def test_the_submit_form_pins_a_cluster_with_labels_and_spot(world: World) -> None:
    three_clusters(world)
    c = login(world.member)
    form = c.get("/jobs/new/").content.decode()
    assert 'id="cluster-fields"' in form
    assert '<option value="onprem">onprem (cost=owned, region=eu-west)</option>' in form
    r = c.post("/jobs/new/", form_body(requested_cluster="cloud",
                                       cluster_selector="cost=cloud", allow_spot="on"))
    assert r.status_code == 302, _text(r.content)[:2000]
    job = Job.objects.get()
    assert job.requested_cluster is not None and job.requested_cluster.name == "cloud"
    assert job.cluster_selector == {"cost": "cloud"} and job.allow_spot


@pytest.mark.parametrize(("fields", "words"), [
    ({"requested_cluster": "lab"}, "No h100 nodes in cluster lab"),
    ({"cluster_selector": "region=mars"}, "No enabled cluster carries region=mars"),
    ({"cluster_selector": "region"}, "Line 1: write key=value."),
])
def test_the_submit_form_shows_rule_k3_on_the_field(world: World, fields: dict[str, Any],
                                                    words: str) -> None:
    three_clusters(world)
    r = login(world.member).post("/jobs/new/", form_body(**fields))
    assert r.status_code == 400
    html = r.content.decode()
    field = next(iter(fields))
    errors = html[html.index(f'id="{field}-errors"'):]
    assert words in errors[:errors.index("</ul>")]
    assert not Job.objects.exists()


def test_edit_and_resubmit_keeps_the_cluster_fields(world: World) -> None:
    clusters = three_clusters(world)
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                     submitter=world.member, requested_cluster=clusters["onprem"],
                     cluster_selector={"region": "eu-west"}, allow_spot=True)
    form = login(world.member).get(f"/jobs/new/?from={job.pk}").content.decode()
    assert '<option value="onprem" selected>' in form
    assert "region=eu-west</textarea>" in form
    assert re.search(r'name="allow_spot"[^>]*checked', form)
    r = login(world.member).post(f"/jobs/{job.pk}/resubmit/")
    assert r.status_code == 302
    copy = Job.objects.exclude(pk=job.pk).get()
    assert copy.requested_cluster == clusters["onprem"] and copy.allow_spot


def test_the_staff_cluster_page_groups_nodes_by_cluster(world: World) -> None:
    three_clusters(world)
    html = login(world.staff).get("/cluster/").content.decode()
    cloud = html[html.index('data-cluster="cloud"'):]
    cloud = cloud[:cloud.index("</tbody>")]
    assert "3 nodes" in cloud and "<code>s0</code> h100 7/8 free" in cloud and "spot" in cloud
    onprem = html[html.index('data-cluster="onprem"'):]
    onprem = onprem[:onprem.index("</tbody>")]
    assert "<code>n0</code>" in onprem and "<code>s0</code>" not in onprem
    assert login(world.member).get("/cluster/").status_code == 404


def test_the_staff_cluster_page_lists_the_implicit_cluster_nodes(world: World) -> None:
    html = login(world.staff).get("/cluster/").content.decode()
    default = html[html.index('data-cluster="default"'):]
    assert "5 nodes" in default[:default.index("</tbody>")]


def test_the_admin_edits_clusters_and_pools_audited_with_the_api_rules(world: World) -> None:
    world.staff.is_superuser = True
    world.staff.save()
    c = Client()
    c.force_login(world.staff)
    base = {"name": "eu", "backend": "simulated", "kubeconfig": "/etc/k.yaml", "context": "",
            "sim_nodes": "1x8xh100", "enabled": "on", "labels": '{"region": "eu-west"}',
            "cost_rank": "0", "pools-TOTAL_FORMS": "1", "pools-INITIAL_FORMS": "0",
            "pools-MIN_NUM_FORMS": "0", "pools-MAX_NUM_FORMS": "1000",
            "pools-0-name": "spot-h100", "pools-0-gpu_type": str(world.h100.pk),
            "pools-0-spot": "on", "pools-0-node_labels": "{}", "pools-0-price_per_gpu_hour": ""}
    r = c.post("/admin/queueing/cluster/add/", base)
    assert r.status_code == 200 and "A simulated cluster runs in the scheduler" in r.content.decode()
    assert not Cluster.objects.exists()
    r = c.post("/admin/queueing/cluster/add/", {**base, "kubeconfig": ""})
    assert r.status_code == 302, _text(r.content)[:1500]
    pool = NodePool.objects.get()
    assert pool.cluster.name == "eu" and pool.spot
    kinds = set(AuditEntry.objects.filter(object_type__in=["queueing.Cluster",
                                                           "queueing.NodePool"])
                .values_list("object_type", "action"))
    assert kinds == {("queueing.Cluster", "create"), ("queueing.NodePool", "create")}
    assert c.get("/admin/queueing/cluster/").status_code == 200


def test_k8_the_admin_shows_the_state_and_enabling_a_drained_cluster_clears_it(
        world: World) -> None:
    from django.utils import timezone

    world.staff.is_superuser = True
    world.staff.save()
    c = Client()
    c.force_login(world.staff)
    eu = Cluster.objects.create(name="eu", sim_nodes="1x8xh100", enabled=False,
                                drained_at=timezone.now())
    us = Cluster.objects.create(name="us", sim_nodes="1x8xh100", enabled=False)
    JobFactory(team=world.vision, gpu_type=world.h100, status="RUNNING", cluster=us)
    listing = _text(c.get("/admin/queueing/cluster/").content)
    assert "drained" in listing and "draining: 1 job still there" in listing
    form = {"name": "eu", "backend": "simulated", "kubeconfig": "", "context": "",
            "sim_nodes": "1x8xh100", "enabled": "on", "labels": "{}", "cost_rank": "0",
            "pools-TOTAL_FORMS": "0", "pools-INITIAL_FORMS": "0",
            "pools-MIN_NUM_FORMS": "0", "pools-MAX_NUM_FORMS": "1000"}
    r = c.post(f"/admin/queueing/cluster/{eu.pk}/change/", form)
    assert r.status_code == 302, _text(r.content)[:1500]
    eu.refresh_from_db()
    assert eu.enabled and eu.drained_at is None
    update = AuditEntry.objects.get(object_type="queueing.Cluster", action="update")
    assert update.changes["drained_at"][1] is None


def test_the_running_tables_name_the_cluster_before_the_nodes(world: World) -> None:
    clusters = three_clusters(world)
    JobFactory(team=world.vision, gpu_type=world.h100, status="RUNNING", name="placed",
               cluster=clusters["onprem"], placement=["n0"])
    assert re.search(r"onprem\s*: n0", _text(login(world.member).get("/").content))
    assert re.search(r"onprem\s*: n0", _text(login(world.staff).get("/cluster/").content))


def test_the_dashboard_reads_no_cluster_rows_without_clusters(world: World) -> None:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    c = login(world.member)
    c.get("/")  # the memos filled
    with CaptureQueriesContext(connection) as ctx:
        assert c.get("/").status_code == 200
    assert not [q for q in ctx.captured_queries if "queueing_nodepool" in q["sql"]]
    three_clusters(world)
    forget_all()
    with CaptureQueriesContext(connection) as ctx:
        assert b'id="clusters"' in c.get("/").content
    assert [q for q in ctx.captured_queries if "queueing_nodepool" in q["sql"]]


def test_the_job_list_has_a_cluster_column_when_clusters_exist(world: World) -> None:
    c = login(world.member)
    JobFactory(team=world.vision, gpu_type=world.h100, status="QUEUED", name="waiting")
    assert "<th class=\"hide-sm\">Cluster</th>" not in c.get("/jobs/").content.decode()
    clusters = three_clusters(world)
    JobFactory(team=world.vision, gpu_type=world.h100, status="RUNNING", name="placed",
               cluster=clusters["cloud"])
    forget_all()  # the memo of whether clusters exist
    text = _text(c.get("/jobs/").content)
    assert "Cluster" in text
    assert re.search(r"placed running \S+ 1 × 1 h100 cloud", text), text[:600]
    assert re.search(r"waiting queued \S+ 1 × 1 h100 —", text)
