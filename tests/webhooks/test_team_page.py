"""The team page's Webhooks section (docs/webhooks.md): endpoints and recent deliveries
for team admins, never a secret; members see neither."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from queueing.services.webhooks import webhook_attempt, webhook_endpoint_create
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _page(user) -> str:
    c = Client()
    c.force_login(user)
    r = c.get("/teams/vision/")
    assert r.status_code == 200
    return r.content.decode()


def test_team_admins_see_endpoints_and_deliveries_without_secrets(world):
    from queueing.models import JobEvent
    from queueing.services.webhooks import webhook_deliveries_create

    created = webhook_endpoint_create(
        actor=world.admin, team=world.vision, url="http://169.254.169.254/x", description="CI hook"
    )
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    event = JobEvent.objects.create(
        job=job, at=timezone.now(), kind="transition", from_status="", to_status="QUEUED"
    )
    now = timezone.now()
    [delivery_id] = webhook_deliveries_create(event_ids=[event.pk], now=now)
    assert webhook_attempt(delivery_id=delivery_id, now=now) is not None
    page = _page(world.admin)
    assert 'id="webhook-endpoints"' in page and "CI hook" in page
    assert 'id="webhook-deliveries"' in page and "job.queued" in page
    assert "refused: 169.254.169.254 is link-local" in page and f"#{job.pk}" in page
    assert created.secret not in page and "whsec_" not in page


def test_members_see_no_webhooks(world):
    webhook_endpoint_create(
        actor=world.admin, team=world.vision, url="https://ci.example.com/h", description="CI hook"
    )
    page = _page(world.member)
    assert 'id="webhooks"' in page and "CI hook" not in page
    assert "Team admins see the team's webhooks" in page
