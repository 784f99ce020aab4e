"""Idle GPUs in a real browser (docs/scheduling.md, "Idle GPUs"): the dashboard's idle
badge and the job page's utilization chart, drawn by uPlot. Screenshots go to
test-artifacts/screenshots/ (dashboard-idle-badge, job-utilization)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.models import Tier
from tests.conftest import World, job_body

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_idle_badge_and_the_utilization_chart(
        page: Any, world: World, cycle: Callable[..., Any],
        shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    Tier.objects.filter(pk=world.normal.pk).update(idle_window_minutes=10,
                                                   idle_action="flag")
    ids = {}
    for name, profile in (("train-busy", "35,60,80,85,90,88,92,91,89,93,90,94,92,90"),
                          ("train-idle", "85,70,40,3,2,1,1,2,1,1,2,1,1,1,1,2,1")):
        r = world.client(world.member).post("/api/v1/jobs/", job_body(
            name=name, env={"FAIRQ_SIM_SECONDS": "7200", "FAIRQ_SIM_GPU_UTIL": profile}),
            format="json")
        assert r.status_code == 201, r.json()
        ids[name] = r.json()["id"]
    # Fifteen minutes of readings, one cycle a minute, ending now.
    t0 = timezone.now().replace(second=0, microsecond=0) - timedelta(minutes=16)
    cycle(t0 - timedelta(seconds=30))
    for i in range(16):
        cycle(t0 + timedelta(minutes=i, seconds=1))

    login(page, "dave")
    idle_row = page.locator("tr", has_text=f"#{ids['train-idle']} train-idle")
    busy_row = page.locator("tr", has_text=f"#{ids['train-busy']} train-busy")
    expect(idle_row.locator(".st-idle")).to_have_text("idle")
    expect(busy_row.locator(".st-idle")).to_have_count(0)
    shoot(page, "dashboard-idle-badge")

    page.goto(f"/jobs/{ids['train-idle']}/")
    expect(page.locator("#job-idle")).to_contain_text("GPUs idle since")
    expect(page.locator("#util-chart canvas")).to_have_count(1)  # uPlot drew it
    expect(page.locator("#util-table")).to_contain_text("%")
    page.locator("#util-h").scroll_into_view_if_needed()
    shoot(page, "job-utilization")
