"""The team page's Webhooks section in a browser (docs/webhooks.md): endpoints and recent
deliveries for a team admin, at desktop and phone width (390 px, no sideways scroll)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from queueing.models import JobEvent
from queueing.services.webhooks import (
    webhook_attempt,
    webhook_deliveries_create,
    webhook_endpoint_create,
)
from tests.conftest import World
from tests.factories import JobFactory
from tests.webhooks.receiver import receiver

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_team_admin_sees_endpoints_and_deliveries(
    page: Any, world: World, shoot: Callable[[Any, str], Any]
) -> None:
    from playwright.sync_api import expect

    with receiver(answers=[500]) as rx:
        ok = webhook_endpoint_create(
            actor=world.admin, team=world.vision, url=rx.url, description="CI pipeline (GitLab)"
        )
        rx.secret = ok.secret
        webhook_endpoint_create(
            actor=world.admin,
            team=world.vision,
            url="http://169.254.169.254/latest/meta-data/",
            event_types=["job.failed"],
            enabled=True,
        )
        job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal, name="resnet-sweep-3")
        now = timezone.now()
        events = [
            JobEvent.objects.create(job=job, at=now, kind="transition", from_status=a, to_status=b)
            for a, b in (("", "QUEUED"), ("QUEUED", "FAILED"))
        ]
        for delivery_id in webhook_deliveries_create(event_ids=[e.pk for e in events], now=now):
            webhook_attempt(delivery_id=delivery_id, now=now)
    login(page, "alice")
    page.goto("/teams/vision/#webhooks")
    section = page.locator("#webhooks")
    expect(section.locator("#webhook-endpoints")).to_contain_text("CI pipeline (GitLab)")
    expect(section.locator("#webhook-deliveries")).to_contain_text("HTTP 500")
    expect(section.locator("#webhook-deliveries")).to_contain_text("refused: 169.254.169.254")
    assert "whsec_" not in page.content()
    section.scroll_into_view_if_needed()
    shoot(page, "team-webhooks")
    page.set_viewport_size({"width": 390, "height": 844})
    page.goto("/teams/vision/#webhooks")
    overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
    assert overflow <= 0, f"the team page is {overflow}px wider than a phone"
    shoot(page, "team-webhooks-phone")
