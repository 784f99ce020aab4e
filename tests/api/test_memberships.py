"""Memberships over the API: the last team admin stays (409 `conflict` in the one error
shape, for staff too, nothing changed); a team admin who is not the last may leave."""

from __future__ import annotations

from typing import Any

import pytest

from accounts.models import AuditEntry, Membership, Role
from tests.conftest import World
from tests.factories import MembershipFactory

URL = "/api/v1/teams/vision/members/"
LAST_ADMIN = {"error": {"status": 409, "code": "conflict", "message":
                        "team vision would have no team admin; make someone else team-admin first"}}


def state(world: World) -> tuple[list[tuple[str, str]], int]:
    members = sorted(Membership.objects.filter(team=world.vision)
                     .values_list("user__username", "role"))
    return members, AuditEntry.objects.filter(object_type="accounts.Membership").count()


@pytest.mark.parametrize("who", ["admin", "staff"])
@pytest.mark.parametrize("request_", [
    ("delete", f"{URL}alice/", None),
    ("patch", f"{URL}alice/", {"role": "member"}),
    ("post", URL, {"username": "alice", "role": "member"}),
], ids=["delete", "patch", "post"])
def test_it_refuses_to_remove_or_demote_the_last_team_admin(
    world: World, who: str, request_: tuple[str, str, Any]
) -> None:
    method, url, body = request_
    before = state(world)
    client = world.client(getattr(world, who))
    r = getattr(client, method)(url, body, format="json")
    assert r.status_code == 409
    assert r.json() == LAST_ADMIN
    assert state(world) == before


def test_a_team_admin_who_is_not_the_last_may_remove_themselves(world: World) -> None:
    MembershipFactory(team=world.vision, user=world.outsider, role=Role.TEAM_ADMIN)
    r = world.client(world.admin).delete(f"{URL}alice/")
    assert r.status_code == 204
    assert not Membership.objects.filter(team=world.vision, user=world.admin).exists()
    entry = AuditEntry.objects.get(action="delete", object_type="accounts.Membership")
    assert entry.actor == world.admin and entry.changes["user"] == ["alice", None]


def test_a_team_admin_who_is_not_the_last_may_demote_themselves(world: World) -> None:
    MembershipFactory(team=world.vision, user=world.outsider, role=Role.TEAM_ADMIN)
    r = world.client(world.admin).patch(f"{URL}alice/", {"role": "member"}, format="json")
    assert r.status_code == 200 and r.json()["role"] == "member"
    entry = AuditEntry.objects.get(action="update", object_type="accounts.Membership")
    assert entry.actor == world.admin and entry.changes == {"role": ["team-admin", "member"]}


def test_member_removal_works(world: World) -> None:
    r = world.client(world.admin).delete(f"{URL}dave/")
    assert r.status_code == 204
    assert state(world)[0] == [("alice", "team-admin")]
