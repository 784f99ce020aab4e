"""The team page: the header names the team the page shows (a member of two teams), and
a team admin adds, disables, enables and deletes webhook endpoints there through the
services (docs/webhooks.md), the secret shown once."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from accounts.models import AuditEntry, Role
from queueing.models import WebhookEndpoint
from queueing.selectors.webhooks import webhook_endpoints_of_team
from queueing.services.webhooks import webhook_endpoint_create
from tests.conftest import World
from tests.factories import JobFactory, MembershipFactory

pytestmark = pytest.mark.django_db


def _client(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def _header_team(html: str) -> str:
    """The team the header's switcher has selected."""
    m = re.search(r'<select id="team-switch" name="team">(.*?)</select>', html, re.S)
    assert m, html[:2000]
    chosen = re.findall(r'<option value="([^"]+)" selected>', m.group(1))
    assert len(chosen) == 1, m.group(1)
    return chosen[0]


def test_the_header_names_the_team_the_page_shows_for_a_member_of_two_teams(
        world: World) -> None:
    MembershipFactory(user=world.admin, team=world.nlp, role=Role.MEMBER)
    c = _client(world.admin)
    assert _header_team(c.get("/").content.decode()) == "nlp"  # the first, by name
    page = c.get("/teams/vision/").content.decode()
    assert "<h1>Team vision" in page or "Team vision" in page
    assert _header_team(page) == "vision"
    # The dashboard goes on with the team last shown, as the switcher would.
    assert _header_team(c.get("/").content.decode()) == "vision"
    # A job of the other team: its page and the header name nlp.
    job = JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal)
    assert _header_team(c.get(f"/jobs/{job.pk}/").content.decode()) == "nlp"


def test_a_team_admin_adds_an_endpoint_and_sees_its_secret_once(world: World) -> None:
    c = _client(world.admin)
    r = c.post("/teams/vision/webhooks/", {"url": "https://ci.example.org/hooks/fairq",
                                           "description": "CI pipeline",
                                           "event_types": ["job.failed", "job.succeeded"]})
    assert r.status_code == 200, r.content.decode()[:3000]
    assert "no-store" in r["Cache-Control"] or "no-cache" in r["Cache-Control"]
    html = r.content.decode()
    secret = re.search(r'<code class="key" id="new-webhook-secret">([^<]+)</code>', html)
    assert secret and secret.group(1).startswith("whsec_")
    (endpoint,) = webhook_endpoints_of_team(team=world.vision)
    assert (endpoint.url, endpoint.description, endpoint.enabled, endpoint.event_types) == (
        "https://ci.example.org/hooks/fairq", "CI pipeline", True,
        ["job.succeeded", "job.failed"])
    assert AuditEntry.objects.filter(action="create", object_id=str(endpoint.pk)).exists()
    again = c.get("/teams/vision/").content.decode()
    assert secret.group(1) not in again and "whsec_" not in again
    assert "https://ci.example.org/hooks/fairq" in again


def test_a_bad_endpoint_url_is_refused_on_its_field_and_nothing_is_written(
        world: World) -> None:
    r = _client(world.admin).post("/teams/vision/webhooks/", {"url": "ftp://ci.example.org/"})
    assert r.status_code == 400
    assert 'id="url-errors"' in r.content.decode()
    assert "http:// or https://" in r.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_a_team_admin_disables_enables_and_deletes_an_endpoint(world: World) -> None:
    endpoint = webhook_endpoint_create(actor=world.admin, team=world.vision,
                                       url="https://ci.example.org/hooks").endpoint
    c = _client(world.admin)
    url = f"/teams/vision/webhooks/{endpoint.pk}/"
    r = c.post(url, {"action": "disable"})
    assert r.status_code == 302 and r["Location"].endswith("/teams/vision/#webhooks")
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).enabled is False
    assert "disabled" in c.get("/teams/vision/").content.decode()
    c.post(url, {"action": "enable"})
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).enabled is True
    c.post(url, {"action": "delete"})
    assert not WebhookEndpoint.objects.filter(pk=endpoint.pk).exists()
    assert AuditEntry.objects.filter(action="delete", object_id=str(endpoint.pk)).exists()


def test_only_team_admins_manage_endpoints(world: World) -> None:
    endpoint = webhook_endpoint_create(actor=world.admin, team=world.vision,
                                       url="https://ci.example.org/hooks").endpoint
    member = _client(world.member)
    assert member.post("/teams/vision/webhooks/",
                       {"url": "https://evil.example.org/"}).status_code == 403
    assert member.post(f"/teams/vision/webhooks/{endpoint.pk}/",
                       {"action": "delete"}).status_code == 403
    assert 'id="webhook-form"' not in member.get("/teams/vision/").content.decode()
    # Another team's admin: not their team's endpoint.
    outsider = _client(world.outsider)
    assert outsider.post(f"/teams/nlp/webhooks/{endpoint.pk}/",
                         {"action": "delete"}).status_code == 404
    assert WebhookEndpoint.objects.filter(pk=endpoint.pk, enabled=True).count() == 1
