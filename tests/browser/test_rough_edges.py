"""The web's rough edges in a real browser: the quota board's cluster row and team weights
saved in place, the filters and the team switcher do not navigate on arrow keys (WCAG
3.2.2), the usage chart's y axis starts at 0, the staff's cluster view fits a phone."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.conftest import World
from tests.factories import JobFactory, MembershipFactory

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_cluster_row_and_a_teams_weight_save_in_place(
    page: Any, world: World, shoot: Callable[[Any, str], Any]
) -> None:
    from playwright.sync_api import expect

    login(page, "root")
    page.goto("/quotas/")
    expect(page.locator("#cap-h100")).to_contain_text("24 guaranteed")
    cell = page.get_by_label("nlp h100 nominal")
    cell.fill("0")
    cell.press("Enter")
    expect(page.locator("#cell-nlp-h100")).to_contain_text("saved")
    expect(page.locator("#cap-h100")).to_contain_text("16 guaranteed")
    weight = page.get_by_label("vision fair-share weight")
    weight.fill("6")
    weight.press("Enter")
    expect(page.locator("#weight-vision")).to_contain_text("saved")
    expect(page.locator("#quota-audit")).to_contain_text("weight: 3.0 → 6.0")
    world.vision.refresh_from_db()
    assert world.vision.weight == 6.0
    bad = page.get_by_label("speech fair-share weight")
    bad.fill("0")
    bad.press("Enter")
    page.wait_for_timeout(500)
    # The browser refuses it on the field (min 0.0001); the server would too (tests/web).
    assert bad.evaluate("e => e.validity.valid") is False
    expect(page.locator("#weight-speech")).not_to_contain_text("saved")
    world.speech.refresh_from_db()
    assert world.speech.weight == 1.0
    shoot(page, "quota-board-weights")


def test_arrow_keys_in_the_filters_do_not_navigate(page: Any, world: World) -> None:
    MembershipFactory(user=world.member, team=world.nlp)
    login(page, "dave")
    page.goto("/jobs/")
    status = page.locator("#status-filter")
    status.focus()
    status.press("ArrowDown")
    status.press("ArrowDown")
    page.wait_for_timeout(500)
    assert page.url.endswith("/jobs/")  # nothing happened yet
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url("**/jobs/?status=*")
    switch = page.locator("#team-switch")
    before = switch.input_value()
    switch.focus()
    switch.press("ArrowDown")
    page.wait_for_timeout(500)
    assert "/jobs/?status=" in page.url  # still here, team not switched
    page.get_by_role("button", name="Switch").click()
    page.wait_for_load_state("networkidle")
    assert page.locator("#team-switch").input_value() != before


def test_the_usage_chart_starts_at_zero(page: Any, world: World) -> None:
    from queueing.models import FairShareSnapshot
    from queueing.policy.states import JobState
    from queueing.selectors.fairshare import fairshare_standings
    from queueing.services.usage import usage_record_attempt

    now = timezone.now()
    for team in (world.nlp, world.vision):
        done = JobFactory(
            team=team, gpu_type=world.a100, tier=world.normal, gpus_per_replica=8, status=JobState.SUCCEEDED
        )
        usage_record_attempt(job=done, start=now - timedelta(hours=300), end=now - timedelta(hours=30))
    current = {t: s.usage for t, s in fairshare_standings(now=now).items()}
    # A day of usage far from 0 and nearly flat: an axis fitted to the data would start
    # near it, not at 0.
    for h in range(24, 0, -1):
        FairShareSnapshot.objects.create(
            at=now - timedelta(hours=h),
            half_life_hours=168.0,
            standings={
                "nlp": [current["nlp"] * (1 + h / 1000), 0, 0.5, 1],
                "vision": [current["vision"] * (1 + h / 900), 0, 0.5, 1],
            },
        )
    login(page, "root")
    page.goto("/")
    page.wait_for_function("() => document.getElementById('usage-chart').uplot")
    y = page.evaluate("() => document.getElementById('usage-chart').uplot.scales.y")
    assert y["min"] == 0 and y["max"] >= current["nlp"], (y, current)


def test_a_fresh_installs_chart_has_no_negative_gpu_hours(page: Any, world: World) -> None:
    """Every team at 0 and no snapshots yet: the axis runs from 0 to 1 GPU-hour (uPlot's
    own choice for all-zero data is 0 to 100, which reads as a lot of nothing)."""
    login(page, "root")
    page.goto("/")
    page.wait_for_function("() => document.getElementById('usage-chart').uplot")
    y = page.evaluate("() => document.getElementById('usage-chart').uplot.scales.y")
    assert y["min"] == 0 and y["max"] == 1, y


def test_the_cluster_view_fits_a_phone(page: Any, world: World, shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    for team in (world.vision, world.nlp, world.speech):
        JobFactory(
            team=team,
            gpu_type=world.h100,
            tier=world.normal,
            replicas=2,
            gpus_per_replica=4,
            name=f"{team.slug}-long-job-name-for-a-phone",
        )
    login(page, "root")
    page.goto("/cluster/")
    expect(page.locator("#cqueue-h")).to_contain_text("3 waiting")
    shoot(page, "cluster")
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    expect(page.locator("#cqueue-h")).to_be_visible()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    shoot(page, "cluster-phone")
