"""Issue 19 in a real browser: the dashboard with three clusters (capacity, free and spot
per GPU type, one unreachable), a job page saying where it runs, the submit form's
cluster fields and the staff cluster page's nodes per cluster. Screenshots go to
test-artifacts/screenshots/clusters-*.png."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from queueing.models import Job
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
