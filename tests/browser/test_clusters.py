"""Several clusters in a real browser: the dashboard with three clusters (capacity, free and spot
per GPU type, one unreachable), a job page saying where it runs, the submit form's
cluster fields and the staff cluster page's nodes per cluster. Screenshots go to
test-artifacts/screenshots/clusters-*.png."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from queueing.models import Cluster, Job
from tests.api.test_clusters import three_clusters
from tests.conftest import World
from tests.factories import JobFactory

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_dashboard_with_three_clusters(page: Any, world: World,
                                          shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    clusters = three_clusters(world)
    running = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                         gpus_per_replica=4, replicas=2, status="RUNNING", name="rn50-onprem",
                         cluster=clusters["onprem"], placement=["n0", "n0"],
                         submitter=world.member)
    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.low, gpus_per_replica=1,
               status="RUNNING", name="sweep-spot", cluster=clusters["cloud"],
               placement=["s0"], allow_spot=True, submitter=world.member)
    JobFactory(team=world.vision, gpu_type=world.a100, tier=world.normal, status="QUEUED",
               name="eu-only", cluster_selector={"region": "eu-west"}, submitter=world.member)
    login(page, "dave")
    card = page.locator("#clusters")
    expect(card).to_be_visible()
    rows = card.locator("tbody")
    expect(rows).to_have_count(3)
    expect(rows.nth(0)).to_contain_text("onprem")
    expect(rows.nth(0)).to_contain_text("6 / 16")
    expect(rows.nth(1)).to_contain_text("unreachable")
    expect(rows.nth(2)).to_contain_text("7 / 8")  # cloud's spot h100s
    card.scroll_into_view_if_needed()
    shoot(page, "clusters-dashboard")

    page.goto(f"/jobs/{running.pk}/")
    expect(page.locator("#job-cluster")).to_contain_text("runs in onprem")
    shoot(page, "clusters-job-detail")

    page.goto("/jobs/new/")
    expect(page.locator("#cluster-fields")).to_be_visible()
    page.get_by_label("GPU type").select_option("h100")
    page.get_by_label("Cluster", exact=True).select_option("lab")
    expect(page.locator("#requested_cluster-errors")).to_contain_text(
        "No h100 nodes in cluster lab")
    page.locator("#cluster-fields").scroll_into_view_if_needed()
    shoot(page, "clusters-submit-form")
    assert Job.objects.count() == 3


def test_the_staff_cluster_page_groups_nodes_by_cluster(page: Any, world: World,
                                                       shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    three_clusters(world)
    login(page, "root")
    page.goto("/cluster/")
    cloud = page.locator('tbody[data-cluster="cloud"]')
    cloud.locator("summary").click()
    expect(cloud).to_contain_text("s0 h100 7/8 free")
    shoot(page, "clusters-staff-page")


def test_k8_the_staff_cluster_page_shows_a_draining_clusters_capacity_and_use(
        page: Any, world: World, cycle: Callable[..., Any],
        shoot: Callable[[Any, str], Any]) -> None:
    """Rule K8 as a user sees it: a disabled cluster still running a job shows its real
    GPUs and their use (8 of 16 a100s, the job's) until it is drained, not 0 / 0."""
    from datetime import timedelta

    from django.utils import timezone
    from playwright.sync_api import expect

    from tests.clusters.conftest import queued

    Cluster.objects.create(name="onprem", sim_nodes="1x8xh100", cost_rank=0)
    cloud = Cluster.objects.create(name="cloud", sim_nodes="2x8xa100", cost_rank=10)
    t0 = timezone.now()
    job = queued(world, gpu_type=world.a100, seconds=3600, name="long-train")
    cycle(now=t0)
    cycle(now=t0 + timedelta(seconds=1))
    assert Job.objects.get(pk=job.pk).status == "RUNNING"
    cloud.enabled = False
    cloud.save()
    cycle(now=t0 + timedelta(seconds=2))  # read while it drains; nothing new goes there

    login(page, "root")
    page.goto("/cluster/")
    row = page.locator('tbody[data-cluster="cloud"]')
    expect(row).to_contain_text("draining")
    expect(row).to_contain_text("1 job still there")
    expect(row).to_contain_text("a100")
    expect(row).to_contain_text("8 / 16")
    row.locator("summary").click()
    expect(row).to_contain_text("2 nodes (draining: their free GPUs take no new work")
    expect(row).to_contain_text("sim-a100-001 a100 8/8 free")
    row.scroll_into_view_if_needed()
    shoot(page, "clusters-k8-draining")
