"""The dashboard in a real browser: log in, submit a job (inline validation and
preview), watch it run, cancel another, see the standings change, and an outsider's 404.
Screenshots go to test-artifacts/screenshots/."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.models import Job
from queueing.policy.states import JobState
from tests.conftest import World
from tests.factories import JobFactory

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def factor_of(pg: Any, team: str) -> str:
    return str(pg.locator(f'td[data-factor="{team}"]').inner_text())


def seed_history(world: World) -> None:
    """Two days of standings snapshots (as the periodic task leaves them) and an earlier
    nlp job's 8 a100-hours, so the chart and the standings have something to show."""
    from queueing.models import FairShareSnapshot
    from queueing.services.usage import usage_record_attempt

    now = timezone.now()
    for h in range(48, 0, -1):
        nlp = 8.0 * min(1.0, (48 - h) / 24) * 0.5 ** (max(0, 24 - h) / 168)
        FairShareSnapshot.objects.create(
            at=now - timedelta(hours=h), half_life_hours=168.0,
            standings={"nlp": [nlp, 0, 0.333, 1], "speech": [0.0, 0, 0.167, 1],
                       "vision": [0.0, 0, 0.5, 1]})
    old = JobFactory(team=world.nlp, gpu_type=world.a100, tier=world.normal,
                     gpus_per_replica=8, name="nlp-earlier", status=JobState.SUCCEEDED)
    usage_record_attempt(job=old, start=now - timedelta(hours=2), end=now - timedelta(hours=1))


def test_member_submits_watches_it_run_cancels_another_and_sees_standings_move(
        page: Any, world: World, cycle: Callable[..., Any],
        shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    seed_history(world)
    login(page, "dave")
    expect(page.get_by_role("heading", name="Team vision")).to_be_visible()
    expect(page.get_by_text("Nothing waiting.")).to_be_visible()
    assert factor_of(page, "vision") == "1.000"

    # Submit, with an inline error first (the API's rule, shown without a reload).
    page.get_by_role("link", name="Submit", exact=True).click()
    page.get_by_label("Name").fill("Bad_Name")
    page.get_by_label("Container image").click()
    expect(page.locator("#name-errors")).to_contain_text("lower-case letters")
    expect(page.get_by_label("Name")).to_have_attribute("aria-invalid", "true")
    shoot(page, "submit-form-errors")
    page.get_by_label("Name").fill("resnet-web")
    page.get_by_label("Container image").fill("ghcr.io/acme/train:1.4")
    page.get_by_label("Command").fill("python train.py")
    page.get_by_label("Environment").fill("FAIRQ_SIM_SECONDS=600")
    page.get_by_label("GPU type").select_option("h100")
    page.get_by_label("GPUs per replica").fill("8")
    page.get_by_label("Replicas (gang size)").click()
    expect(page.locator("#preview")).to_contain_text("the next scheduling cycle admits it")
    expect(page.locator("#name-errors")).to_be_empty()
    shoot(page, "submit-form")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = Job.objects.get(name="resnet-web")
    expect(page.locator("#job-status")).to_have_text("QUEUED")
    expect(page.locator("#queue-position")).to_contain_text("Position 1 of 1")

    # Watch it run: the page refreshes itself while the scheduler admits and starts it.
    now = timezone.now()
    cycle(now)
    cycle(now + timedelta(seconds=1))
    expect(page.locator("#job-status")).to_have_text("RUNNING", timeout=10_000)
    expect(page.get_by_text(re.compile(r"running on .*h100"))).to_be_visible()
    expect(page.locator("pre.logs")).to_contain_text("started fq-")
    shoot(page, "job-detail")

    # Cancel another job from its page.
    other = JobFactory(team=world.vision, gpu_type=world.a100, tier=world.low,
                       submitter=world.member, name="to-cancel", env={"FAIRQ_SIM_SECONDS": "5"})
    page.goto(f"/jobs/{other.pk}/")
    page.once("dialog", lambda d: d.accept())
    page.get_by_role("button", name="Cancel job").click()
    expect(page.locator("#job-status")).to_have_text("CANCELLED")
    expect(page.get_by_role("status")).to_contain_text(f"Job #{other.pk} cancelled")
    other.refresh_from_db()
    assert other.status == JobState.CANCELLED

    # The dashboard: the running job, the cancelled one, capacity; then the first job
    # finishes, its 8 h100 for 10 minutes are charged, and the standings move live.
    page.goto("/")
    expect(page.locator("#live")).to_contain_text("resnet-web")
    expect(page.locator("#live")).to_contain_text("to-cancel")
    expect(page.locator("#usage-chart canvas")).to_have_count(1)
    before = factor_of(page, "vision")
    cycle(now + timedelta(seconds=602))
    job.refresh_from_db()
    assert job.status == JobState.SUCCEEDED
    expect(page.locator("#live")).to_contain_text("No jobs running", timeout=10_000)
    expect(page.locator('td[data-factor="vision"]')).not_to_have_text(before)
    # 8 h100 (billing weight 2) for 602 s: 2.67 GPU-h against nlp's 8: vision is now
    # a quarter of the usage for half the share, F = 2^(-0.25/0.5) = 0.707.
    assert 0.6 < float(factor_of(page, "vision")) < 0.8 < float(before)
    shoot(page, "dashboard")

    # Phone width: nothing wider than the screen.
    page.set_viewport_size({"width": 390, "height": 844})
    page.reload()
    expect(page.get_by_role("heading", name="Team vision")).to_be_visible()
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the page is {overflow}px wider than a phone"
    shoot(page, "dashboard-phone")


def test_outsider_cannot_open_another_teams_job(page: Any, world: World,
                                                shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal, name="secret")
    login(page, "bob")
    response = page.goto(f"/jobs/{job.pk}/")
    assert response is not None and response.status == 404
    expect(page.get_by_role("heading", name="Page not found")).to_be_visible()
    expect(page.locator("body")).not_to_contain_text("secret")
    shoot(page, "outsider-404")


def test_platform_admin_edits_a_quota_in_place(page: Any, world: World,
                                               shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    login(page, "root")
    page.goto("/quotas/")
    expect(page.get_by_text("Guaranteed h100 quotas (24 GPUs)")).to_be_visible()
    cell = page.get_by_label("nlp h100 nominal")
    cell.fill("0")
    cell.press("Enter")
    expect(page.locator("#cell-nlp-h100")).to_contain_text("saved")
    expect(page.locator("#quota-audit")).to_contain_text("nominal: 8 → 0")
    page.get_by_label("speech h100 nominal").fill("0")
    page.get_by_label("speech h100 nominal").press("Tab")
    expect(page.locator("#quota-warnings")).not_to_contain_text("Guaranteed h100")
    lend = page.get_by_label("vision a100 lending limit")
    lend.fill("99")
    lend.press("Enter")
    expect(page.locator("#cell-vision-a100")).to_contain_text("Cannot lend more than the nominal 8")
    shoot(page, "quota-board")


def test_team_admin_creates_a_token_shown_once(page: Any, world: World,
                                               shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    login(page, "alice")
    page.get_by_role("link", name="Team", exact=True).click()
    expect(page.get_by_role("heading", name="Members")).to_be_visible()
    page.get_by_label("Token name").fill("ci-pipeline")
    page.get_by_role("button", name="Create token").click()
    key = page.locator("#new-token").inner_text()
    assert key.startswith("fq_")
    shoot(page, "team")
    page.reload()
    expect(page.locator("body")).not_to_contain_text(key)
    expect(page.get_by_role("button", name="Revoke token ci-pipeline")).to_be_visible()
