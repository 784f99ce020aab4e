"""`GET /api/v1/` lists every resource of the API with its absolute link (docs/api.md,
"The API root"), not only the router's `jobs`."""

from __future__ import annotations

import pytest

from tests.conftest import World

pytestmark = pytest.mark.django_db

BASE = "http://testserver/api/v1/"


def test_the_root_lists_every_resource_with_absolute_links(world: World) -> None:
    r = world.client(world.member).get("/api/v1/")
    assert r.status_code == 200
    links = r.json()
    for path in ("jobs", "jobs/bulk", "jobs/stream", "jobs/starts", "jobs/{pk}",
                 "jobs/{pk}/cancel", "jobs/{pk}/events", "jobs/{pk}/logs",
                 "arrays/{array_id}", "fairshare", "teams", "teams/{slug}",
                 "teams/{slug}/members", "teams/{slug}/webhooks", "tokens", "quotas", "tiers",
                 "gpu-types", "usage", "accounting", "costs", "gpu-prices", "budgets",
                 "capacity", "clusters", "clusters/{name}/pools", "schema", "docs"):
        assert links.get(path) == f"{BASE}{path}/", path
    assert all(link.startswith(BASE) and link.endswith("/") for link in links.values())


def test_every_plain_link_of_the_root_is_served(world: World) -> None:
    """Each link without parameters answers (a POST-only one 405), none is a 404."""
    client = world.client(world.staff)
    links = client.get("/api/v1/").json()
    plain = {path: link for path, link in links.items()
             if "{" not in link and path != "jobs/stream"}  # (a stream stays open)
    assert len(plain) >= 15
    for path, link in plain.items():
        status = client.get(link).status_code
        assert status in (200, 405), (path, status)


def test_the_root_needs_a_login_like_every_resource(world: World) -> None:
    from rest_framework.test import APIClient

    assert APIClient().get("/api/v1/").status_code == 401
