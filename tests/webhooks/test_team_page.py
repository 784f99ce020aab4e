"""The team page's Webhooks section (docs/webhooks.md): endpoints and recent deliveries
for team admins, never a secret; members see neither."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from queueing.sealing import unseal
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


def test_staff_edit_an_endpoint_in_the_admin_audited_without_the_secret(world):
    from accounts.models import AuditEntry
    from queueing.models import WebhookEndpoint

    created = webhook_endpoint_create(actor=world.admin, team=world.vision, url="https://ci.example.com/h")
    c = Client()
    c.force_login(world.staff)
    world.staff.is_superuser = True
    world.staff.save()
    url = f"/admin/queueing/webhookendpoint/{created.endpoint.pk}/change/"
    page = c.get(url)
    assert page.status_code == 200 and created.secret not in page.content.decode()
    form = {
        "url": "https://ci.example.com/other",
        "description": "moved",
        "enabled": "on",
        "event_types": '["job.exploded"]',
    }
    assert "A list of: job.queued" in c.post(url, form).content.decode()
    r = c.post(url, {**form, "event_types": '["job.failed"]'})
    assert r.status_code == 302
    endpoint = WebhookEndpoint.objects.get(pk=created.endpoint.pk)
    assert (endpoint.url, endpoint.event_types) == ("https://ci.example.com/other", ["job.failed"])
    assert unseal(endpoint.secret) == created.secret
    entry = AuditEntry.objects.filter(object_type="queueing.WebhookEndpoint").latest("id")
    assert entry.changes["url"] == ["https://ci.example.com/h", "https://ci.example.com/other"]
    assert "secret" not in entry.changes
