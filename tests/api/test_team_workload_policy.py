"""A team's workload policy: GET/PATCH /api/v1/teams/{slug}/workload-policy/
(the same view as /resources/) holds the resource defaults and maxima and the PVCs,
Secrets and pull secrets of the team's namespace its jobs may name. Team admins and staff
set the allowlists, audited; bad names are a 400 changing nothing; jobs follow them."""

from __future__ import annotations

from typing import Any

import pytest

from accounts.models import AuditEntry, Team
from queueing.models import Job
from tests.conftest import World, job_body

pytestmark = pytest.mark.django_db

URL = "/api/v1/teams/vision/workload-policy/"


def test_a_team_admin_sets_the_allowlists_audited_and_members_read_them(world: World) -> None:
    r = world.client(world.admin).patch(URL, {
        "allowed_pvcs": ["imagenet", "ckpt-llm"], "allowed_secrets": ["hf-token"],
        "allowed_pull_secrets": ["regcred"], "max_cpu": "64"}, format="json")
    assert r.status_code == 200, r.json()
    assert r.json()["allowed_pvcs"] == ["ckpt-llm", "imagenet"]  # sorted
    assert r.json()["max_cpu"] == "64"
    team = Team.objects.get(slug="vision")
    assert (team.allowed_secrets, team.allowed_pull_secrets) == (["hf-token"], ["regcred"])
    audit = AuditEntry.objects.filter(object_type="accounts.Team", action="update").latest("id")
    assert audit.changes["allowed_pvcs"] == [[], ["ckpt-llm", "imagenet"]]
    assert audit.actor == world.admin
    member = world.client(world.member)
    assert member.get(URL).json() == r.json()
    # /resources/ is the same view; the team's own body shows the policy too.
    assert member.get("/api/v1/teams/vision/resources/").json() == r.json()
    assert member.get("/api/v1/teams/vision/").json()["resources"]["allowed_pvcs"] == [
        "ckpt-llm", "imagenet"]


def test_an_empty_list_clears_one_and_leaves_the_others(world: World) -> None:
    c = world.client(world.staff)
    c.patch(URL, {"allowed_pvcs": ["a"], "allowed_secrets": ["b"]}, format="json")
    r = c.patch(URL, {"allowed_pvcs": []}, format="json")
    assert r.status_code == 200
    assert (r.json()["allowed_pvcs"], r.json()["allowed_secrets"]) == ([], ["b"])


@pytest.mark.parametrize("user", ["member", "outsider"])
def test_members_and_outsiders_cannot_set_them(world: World, user: str) -> None:
    r = world.client(getattr(world, user)).patch(URL, {"allowed_pvcs": ["x"]}, format="json")
    assert r.status_code == (403 if user == "member" else 404)
    assert Team.objects.get(slug="vision").allowed_pvcs == []


@pytest.mark.parametrize(("body", "refused"), [
    ({"allowed_pvcs": ["kube-system/etcd"]}, "allowed_pvcs"),
    ({"allowed_pvcs": ["Upper"]}, "allowed_pvcs"),
    ({"allowed_secrets": ["a", "a"]}, "allowed_secrets"),
    ({"allowed_secrets": "hf-token"}, "allowed_secrets"),
    ({"allowed_pull_secrets": [""]}, "allowed_pull_secrets"),
    ({"allowed_pull_secrets": [f"x{i}" for i in range(201)]}, "allowed_pull_secrets"),
    ({"allowed_pvcs": ["ok"], "max_cpu": "-1"}, "max_cpu"),
    ({"allowed_hostpaths": ["/"]}, "allowed_hostpaths"),
])
def test_bad_allowlists_are_refused_changing_nothing(
        world: World, body: dict[str, Any], refused: str) -> None:
    client = world.client(world.admin)
    before = AuditEntry.objects.count()
    r = client.patch(URL, body, format="json")
    assert r.status_code == 400, r.json()
    assert refused in str(r.json()["error"]["fields"])
    team = Team.objects.get(slug="vision")
    assert team.allowed_pvcs == [] and team.allowed_secrets == []
    assert team.allowed_pull_secrets == [] and AuditEntry.objects.count() == before


def test_submits_follow_the_allowlists_set_through_the_api(world: World) -> None:
    body = job_body(volumes=[{"name": "d", "pvc": "imagenet", "mount_path": "/d"}])
    member = world.client(world.member)
    assert member.post("/api/v1/jobs/", body, format="json").status_code == 400
    world.client(world.admin).patch(URL, {"allowed_pvcs": ["imagenet"]}, format="json")
    assert member.post("/api/v1/jobs/", body, format="json").status_code == 201
    world.client(world.admin).patch(URL, {"allowed_pvcs": []}, format="json")
    assert member.post("/api/v1/jobs/", body, format="json").status_code == 400
    assert Job.objects.count() == 1


def test_staff_set_them_in_the_django_admin_audited(world: World) -> None:
    from django.test import Client

    from tests.factories import UserFactory
    from tests.test_admin_audit import change_form

    su: Any = UserFactory(  # type: ignore[no-untyped-call] # factory_boy: no types
        username="su", is_staff=True, is_superuser=True)
    client = Client()
    client.force_login(su)
    url, data, _ = change_form(client, world)
    r = client.post(url, {**data, "allowed_pvcs": '["ns/x"]'})
    assert r.status_code == 200 and Team.objects.get(slug="vision").allowed_pvcs == []
    r = client.post(url, {**data, "allowed_pvcs": '["imagenet"]'})
    assert r.status_code == 302, r.content[:2000]
    assert Team.objects.get(slug="vision").allowed_pvcs == ["imagenet"]
    audit = AuditEntry.objects.filter(object_type="accounts.Team").latest("id")
    assert audit.changes["allowed_pvcs"] == [[], ["imagenet"]]


def test_the_tier_api_shows_the_grace_cap(world: World) -> None:
    world.normal.max_termination_grace_seconds = 600
    world.normal.save()
    tiers = {t["slug"]: t for t in world.client(world.member).get("/api/v1/tiers/").json()}
    assert tiers["normal"]["max_termination_grace_seconds"] == 600
    assert tiers["low"]["max_termination_grace_seconds"] is None
