"""The dashboard's queue and the quota board at phone width (390 px, docs/dashboard.md
"Phones"): the wait reason and each GPU type's quota are read inside their card, not
in a column cut off at the card's edge that has to be scrolled sideways."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from queueing.policy.states import JobState
from tests.conftest import World
from tests.factories import JobFactory

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

PHONE = {"width": 390, "height": 844}

# For every element matching the selector: how far its right edge passes the right edge
# of its card (the section.card it is in) and of what its scroll container shows.
_CUT = """sel => [...document.querySelectorAll(sel)].map(el => {
  const card = el.closest('section.card').getBoundingClientRect();
  const box = el.getBoundingClientRect();
  const scroll = el.closest('.scroll');
  return {text: el.innerText.slice(0, 40),
          past_card: Math.round(box.right - card.right),
          hidden: scroll ? scroll.scrollWidth - scroll.clientWidth : 0,
          width: Math.round(box.width)};
})"""


def test_the_dashboards_why_it_waits_is_readable_at_phone_width(
        page: Any, world: World, cycle: Callable[..., Any],
        shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    for i in range(3):  # 24 h100 GPUs asked, 16 there: the last waits, and says why
        JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                   gpus_per_replica=8, name=f"sweep-{i}", submitter=world.admin)
    JobFactory(team=world.vision, gpu_type=world.a100, tier=world.normal,
               gpus_per_replica=8, replicas=3, name="gang-of-three", submitter=world.admin)
    cycle()
    login(page, "alice")
    page.set_viewport_size(PHONE)
    page.goto("/")
    queue = 'section[aria-labelledby="queue-h"]'
    why = page.locator(f"{queue} td.why")
    expect(why.first).to_be_visible()
    assert why.count() >= 1
    cells = page.evaluate(_CUT, f"{queue} td.why")
    for cell in cells:
        assert cell["past_card"] <= 0 and cell["hidden"] <= 0, cells
        assert cell["width"] >= 250, cells  # the card's width, not a squeezed column
        assert len(cell["text"]) > 10, cells
    page.locator(queue).scroll_into_view_if_needed()
    shoot(page, "dashboard-queue-phone")


def test_the_quota_boards_gpu_columns_are_readable_at_phone_width(
        page: Any, world: World, shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
               status=JobState.QUEUED)
    login(page, "root")
    page.set_viewport_size(PHONE)
    page.goto("/quotas/")
    expect(page.locator("table.quota-grid")).to_be_visible()
    cells = page.evaluate(_CUT, "table.quota-grid td:has(.quota-cell)")
    assert len(cells) >= 3 * 3, cells  # three teams, each GPU type (and the weights)
    for cell in cells:
        assert cell["past_card"] <= 0 and cell["hidden"] <= 0, cells
    # Each GPU type's inputs can be typed into where they are.
    field = page.get_by_label("vision mig-1g-10gb nominal")
    field.scroll_into_view_if_needed()
    assert field.is_visible()
    box = field.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"]
    shoot(page, "quotas-phone")


def test_a_team_admin_adds_and_disables_a_webhook_on_the_team_page_at_phone_width(
        page: Any, world: World, shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    from queueing.models import WebhookEndpoint

    login(page, "alice")
    page.set_viewport_size(PHONE)
    page.goto("/teams/vision/#webhooks")
    form = page.locator("#webhook-form")
    form.get_by_label("Endpoint URL").fill("https://ci.example.org/hooks/fairq")
    form.get_by_label("Description").fill("CI pipeline (GitLab)")
    form.get_by_role("button", name="Add endpoint").click()
    secret = page.locator("#new-webhook-secret")
    expect(secret).to_contain_text("whsec_")
    expect(page.locator("#webhook-endpoints")).to_contain_text("CI pipeline (GitLab)")
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the team page is {overflow}px wider than a phone"
    cells = page.evaluate(_CUT, "#webhook-endpoints td")
    assert cells and all(c["past_card"] <= 0 and c["hidden"] <= 0 for c in cells), cells
    page.locator("#webhooks").scroll_into_view_if_needed()
    shoot(page, "team-webhook-created-phone")

    page.get_by_role("button", name="Disable webhook #").first.click()
    expect(page.locator("#webhook-endpoints")).to_contain_text("disabled")
    expect(page.locator("#new-webhook-secret")).to_have_count(0)  # shown once
    assert WebhookEndpoint.objects.get().enabled is False
    page.locator("#webhooks").scroll_into_view_if_needed()
    shoot(page, "team-webhook-disabled-phone")

    # Delete asks first, by the page's script (the Content-Security-Policy allows no
    # inline handler); Disable above asked nothing (Playwright dismisses a dialog no one
    # handles, which would have kept the endpoint enabled).
    asked: list[str] = []

    def answer(accept: bool) -> Callable[[Any], None]:
        def on_dialog(dialog: Any) -> None:
            asked.append(dialog.message)
            if accept:
                dialog.accept()
            else:
                dialog.dismiss()
        return on_dialog

    page.once("dialog", answer(False))
    page.get_by_role("button", name="Delete webhook #").first.click()
    expect(page.locator("#webhook-endpoints")).to_contain_text("disabled")
    assert WebhookEndpoint.objects.count() == 1
    page.once("dialog", answer(True))
    page.get_by_role("button", name="Delete webhook #").first.click()
    expect(page.locator("#webhook-endpoints")).to_have_count(0)
    assert WebhookEndpoint.objects.count() == 0
    assert len(asked) == 2 and all("Delete webhook endpoint #" in m for m in asked), asked
