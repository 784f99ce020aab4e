"""A team's resource defaults and maxima: team admins and staff set
them through /api/v1/teams/{slug}/resources/, audited; members read them; bad quantities
and a default above its maximum are a 400 changing nothing."""

from __future__ import annotations

from typing import Any

import pytest

from accounts.models import AuditEntry, Team
from tests.conftest import World, job_body

pytestmark = pytest.mark.django_db

GI = 2**30
URL = "/api/v1/teams/vision/resources/"


def test_a_team_admin_sets_defaults_and_maxima_audited(world: World) -> None:
    r = world.client(world.admin).patch(URL, {"default_cpu": "4", "max_cpu": "64",
                                              "default_memory": "16Gi", "max_shm_size": "128Gi"},
                                        format="json")
    assert r.status_code == 200, r.json()
    assert r.json() == {"default_cpu": "4", "max_cpu": "64", "default_memory": "16Gi",
                        "max_memory": None, "default_ephemeral_storage": None,
                        "max_ephemeral_storage": None, "default_shm_size": None,
                        "max_shm_size": "128Gi", "allowed_pvcs": [], "allowed_secrets": [],
                        "allowed_pull_secrets": [], "allowed_notify_url_prefixes": []}
    team = Team.objects.get(slug="vision")
    assert (team.default_cpu_millicores, team.max_cpu_millicores) == (4000, 64000)
    assert team.default_memory_bytes == 16 * GI and team.max_shm_size_bytes == 128 * GI
    audit = AuditEntry.objects.filter(object_type="accounts.Team", action="update").latest("id")
    assert audit.changes["default_cpu_millicores"] == [None, 4000]
    assert audit.actor == world.admin
    assert world.client(world.member).get(URL).json()["max_cpu"] == "64"
    assert world.client(world.member).get("/api/v1/teams/vision/").json()["resources"][
        "default_memory"] == "16Gi"


def test_staff_set_them_and_null_clears(world: World) -> None:
    c = world.client(world.staff)
    assert c.patch(URL, {"max_memory": "1Ti"}, format="json").status_code == 200
    r = c.patch(URL, {"max_memory": None}, format="json")
    assert r.status_code == 200 and r.json()["max_memory"] is None
    assert Team.objects.get(slug="vision").max_memory_bytes is None


@pytest.mark.parametrize("user", ["member", "outsider"])
def test_members_and_outsiders_cannot_set_them(world: World, user: str) -> None:
    r = world.client(getattr(world, user)).patch(URL, {"max_cpu": "1"}, format="json")
    assert r.status_code == (403 if user == "member" else 404)
    assert Team.objects.get(slug="vision").max_cpu_millicores is None


@pytest.mark.parametrize(("body", "refused"), [
    ({"default_cpu": "-1"}, "default_cpu"),
    ({"max_memory": "1e999"}, "max_memory"),
    ({"max_shm_size": "lots"}, "max_shm_size"),
    ({"default_ephemeral_storage": "0"}, "default_ephemeral_storage"),
    ({"default_cpu": "8", "max_cpu": "4"}, "default_cpu"),
    ({"max_gpu": "8"}, "max_gpu"),
])
def test_bad_quantities_are_refused_changing_nothing(
        world: World, body: dict[str, Any], refused: str) -> None:
    client = world.client(world.admin)
    before = AuditEntry.objects.count()
    r = client.patch(URL, body, format="json")
    assert r.status_code == 400, r.json()
    assert refused in r.json()["error"]["fields"]
    team = Team.objects.get(slug="vision")
    assert team.default_cpu_millicores is None and team.max_cpu_millicores is None
    assert AuditEntry.objects.count() == before


def test_a_default_above_an_earlier_maximum_is_refused(world: World) -> None:
    c = world.client(world.admin)
    assert c.patch(URL, {"max_shm_size": "8Gi"}, format="json").status_code == 200
    r = c.patch(URL, {"default_shm_size": "16Gi"}, format="json")
    assert r.status_code == 400 and "default_shm_size" in r.json()["error"]["fields"]


def test_submits_follow_the_policy_set_through_the_api(world: World) -> None:
    world.client(world.admin).patch(URL, {"default_shm_size": "2Gi", "max_cpu": "8"},
                                    format="json")
    c = world.client(world.member)
    r = c.post("/api/v1/jobs/", job_body(), format="json")
    assert r.status_code == 201 and r.json()["shm_size"] == "2Gi"
    r = c.post("/api/v1/jobs/", job_body(resources={"cpu": "9"}), format="json")
    assert r.status_code == 400 and "resources.cpu" in r.json()["error"]["fields"]


def test_staff_set_them_in_the_django_admin_audited(world: World) -> None:
    from django.test import Client

    from tests.factories import UserFactory
    from tests.test_admin_audit import change_form

    su = UserFactory(username="su", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(su)
    url, data, _ = change_form(client, world)
    r = client.post(url, {**data, "default_memory_bytes": str(8 * GI),
                          "max_memory_bytes": str(4 * GI)})
    assert r.status_code == 200 and Team.objects.get(slug="vision").max_memory_bytes is None
    r = client.post(url, {**data, "max_memory_bytes": str(64 * GI)})
    assert r.status_code == 302
    assert Team.objects.get(slug="vision").max_memory_bytes == 64 * GI
    audit = AuditEntry.objects.filter(object_type="accounts.Team").latest("id")
    assert audit.changes["max_memory_bytes"] == [None, 64 * GI]
