"""Notebook sessions in a real browser (docs/dashboard.md, "Notebook sessions"): "Start a
notebook" from the dashboard, a fraction picked, the session's page, "My sessions" with
Open and Stop, at desktop and phone width, no CSP violation. Screenshots:
test-artifacts/screenshots/session-*.png."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from queueing.composition import reset_backends
from queueing.models import Job, NotebookSession
from tests.conftest import World
from tests.factories import GpuTypeFactory

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_start_a_notebook_then_open_and_stop_it_from_my_sessions(
        page: Any, world: World, cycle: Callable[..., Any], settings: Any,
        shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    settings.FAIRQ_SIM_NODES = "2x8xh100,2x8xa100,1x7xmig-1g-10gb,2x4xt4-shared"
    reset_backends()
    GpuTypeFactory(slug="t4-shared", resource_name="nvidia.com/gpu.shared",
                   sharing="time-sliced", slices_per_gpu=4)
    world.vision.allowed_pvcs = ["home"]
    world.vision.save()
    violations: list[str] = []
    page.on("console", lambda m: violations.append(m.text)
            if "Content Security Policy" in m.text else None)
    login(page, world.member.username)
    page.get_by_role("link", name="Start a notebook").first.click()
    expect(page.get_by_role("heading", name="Start a notebook")).to_be_visible()
    gpu = page.get_by_label("GPU")
    expect(gpu).to_have_value("t4-shared:f1/4")  # a fraction first
    gpu.select_option("t4-shared:f2/4")
    page.get_by_label("PVC (the notebook's files)").select_option("home")
    page.get_by_label("Time limit (hours)").fill("2")
    shoot(page, "session-start-form")
    page.get_by_role("button", name="Start").click()
    session = NotebookSession.objects.get()
    expect(page).to_have_url(f"{page.url.split('/sessions/')[0]}/sessions/{session.job_id}/")
    expect(page.get_by_text("Opens once it runs.", exact=True)).to_be_visible()
    assert Job.objects.get(pk=session.job_id).gpu_slices == 2
    cycle()
    cycle()
    page.reload()
    expect(page.get_by_role("link", name="Open JupyterLab")).to_have_attribute(
        "href", f"/sessions/{session.job_id}/lab/")
    shoot(page, "session-page")
    page.goto(page.url.split("/sessions/")[0] + "/")
    card = page.locator("#my-sessions")
    expect(card.get_by_role("link", name="Open")).to_be_visible()
    expect(card).to_contain_text("2/4 t4-shared")
    shoot(page, "session-dashboard")
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()  # drawn at phone width (the usage chart sizes itself when drawn)
    card = page.locator("#my-sessions")
    expect(card.get_by_role("link", name="Open")).to_be_visible()
    shoot(page, "session-dashboard-phone")
    width = card.evaluate("e => e.scrollWidth - e.clientWidth")
    assert width <= 0, f"My sessions scrolls sideways at phone width: {width}px"
    page.set_viewport_size({"width": 1280, "height": 900})
    page.reload()
    card = page.locator("#my-sessions")
    card.get_by_role("button", name="Stop").click()
    expect(page.locator(".flash")).to_contain_text("stopped; its PVC and files are kept")
    assert Job.objects.get(pk=session.job_id).status == "CANCELLED"
    assert violations == []
