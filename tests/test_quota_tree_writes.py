"""Rule Q8 (docs/scheduling.md, "Quotas in a tree: what admins write and see"): a
department's teams' nominals fit in its own quota row, checked on every writer - the
quota API (POST and PATCH), a team's parent (PATCH /teams/{slug}/), the quota board and
the admin - with a 400 naming the field and nothing written, not even an audit entry.

The tree is tests/api/test_quota_tree_api.py's: research 64 h100 > vision 16, lang (no
row: 32) > nlp 8, speech 24; ops 40 beside it."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from accounts.models import AuditEntry, Team
from queueing.models import Quota
from tests.api.test_quota_tree_api import three_level_tree
from tests.conftest import World
from tests.factories import QuotaFactory, TeamFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def tree(world: World, settings: Any) -> dict[str, Team]:
    return three_level_tree(world, settings)


def _quota(team: Team, gpu_type: Any) -> Quota:
    return Quota.objects.get(team=team, gpu_type=gpu_type)


def _audits() -> int:
    """Quota and team changes audited (a token each client issues is audited too)."""
    return AuditEntry.objects.filter(object_type__in=["queueing.Quota",
                                                      "accounts.Team"]).count()


def test_rule_q8_a_team_raised_past_its_department_is_refused(world: World,
                                                              tree: dict[str, Team]) -> None:
    before = _audits()
    q = _quota(world.speech, world.h100)
    # research: vision 16 + lang (nlp 8 + speech 40) = 64: still fits.
    r = world.client(world.staff).patch(f"/api/v1/quotas/{q.pk}/", {"nominal": 40},
                                        format="json")
    assert r.status_code == 200, r.content
    # 16 + 8 + 41 = 65 > 64, through a department without a row (lang).
    r = world.client(world.staff).patch(f"/api/v1/quotas/{q.pk}/", {"nominal": 41},
                                        format="json")
    assert r.status_code == 400, r.content
    assert r.json()["error"]["fields"] == {"nominal": [
        "The teams of research are guaranteed 65 h100, more than research's nominal 64."]}
    assert _quota(world.speech, world.h100).nominal == 40
    assert _audits() == before + 1  # the change that fitted, audited; the refusal not


def test_rule_q8_a_department_lowered_below_its_teams_is_refused(world: World,
                                                                 tree: dict[str, Team]) -> None:
    before = _audits()
    research = _quota(tree["research"], world.h100)
    r = world.client(world.staff).patch(f"/api/v1/quotas/{research.pk}/", {"nominal": 47},
                                        format="json")
    assert r.status_code == 400
    assert r.json()["error"]["fields"] == {"nominal": [
        "The teams of research are guaranteed 48 h100, more than research's nominal 47."]}
    assert _quota(tree["research"], world.h100).nominal == 64 and _audits() == before
    # A department's first row of a type: POST, refused below its teams' 24 a100.
    r = world.client(world.staff).post("/api/v1/quotas/", {
        "team": "research", "gpu_type": "a100", "nominal": 20}, format="json")
    assert r.status_code == 400
    assert r.json()["error"]["fields"]["nominal"] == [
        "The teams of research are guaranteed 24 a100, more than research's nominal 20."]
    assert not Quota.objects.filter(team=tree["research"], gpu_type=world.a100).exists()
    r = world.client(world.staff).post("/api/v1/quotas/", {
        "team": "research", "gpu_type": "a100", "nominal": 24}, format="json")
    assert r.status_code == 201, r.content


def test_rule_q8_a_new_team_quota_under_a_full_department_is_refused(
        world: World, tree: dict[str, Team]) -> None:
    TeamFactory(slug="robotics", parent=tree["research"])  # 16 + 32 taken of 64
    r = world.client(world.staff).post("/api/v1/quotas/", {
        "team": "robotics", "gpu_type": "h100", "nominal": 17}, format="json")
    assert r.status_code == 400
    assert r.json()["error"]["fields"]["nominal"] == [
        "The teams of research are guaranteed 65 h100, more than research's nominal 64."]


def test_rule_q8_a_team_moved_under_a_full_department_is_refused(world: World,
                                                                 tree: dict[str, Team]) -> None:
    before = _audits()
    r = world.client(world.staff).patch("/api/v1/teams/ops/", {"parent": "research"},
                                        format="json")
    assert r.status_code == 400, r.content
    assert r.json()["error"]["fields"] == {"parent": [
        "The teams of research are guaranteed 88 h100, more than research's nominal 64."]}
    assert Team.objects.get(slug="ops").parent is None and _audits() == before
    # Moving a team out, or into a department with room, passes and is audited.
    r = world.client(world.staff).patch("/api/v1/teams/speech/", {"parent": None},
                                        format="json")
    assert r.status_code == 200, r.content
    r = world.client(world.staff).patch("/api/v1/teams/speech/", {"parent": "research"},
                                        format="json")
    assert r.status_code == 200, r.content
    entries = AuditEntry.objects.filter(object_type="accounts.Team").order_by("-id")[:2]
    assert [e.changes["parent"] for e in entries] == [[None, tree["research"].pk],
                                                      [tree["lang"].pk, None]]


def test_rule_q8_an_old_excess_may_shrink_but_not_grow(world: World,
                                                       tree: dict[str, Team]) -> None:
    # Written before the rule (no service): research's teams 16 + 8 + 50 = 74 > 64.
    Quota.objects.filter(team=world.speech, gpu_type=world.h100).update(nominal=50)
    q = _quota(world.speech, world.h100)
    client = world.client(world.staff)
    assert client.patch(f"/api/v1/quotas/{q.pk}/", {"nominal": 45},
                        format="json").status_code == 200
    r = client.patch(f"/api/v1/quotas/{q.pk}/", {"nominal": 46}, format="json")
    assert r.status_code == 400
    # Other changes elsewhere are not held hostage by it.
    ops = _quota(tree["ops"], world.h100)
    assert client.patch(f"/api/v1/quotas/{ops.pk}/", {"nominal": 41},
                        format="json").status_code == 200


def test_rule_q8_the_quota_board_shows_the_message_in_the_cell(world: World,
                                                               tree: dict[str, Team]) -> None:
    c = Client()
    c.force_login(world.staff)
    r = c.post("/quotas/vision/h100/", {"nominal": "33", "borrowing_limit": "",
                                        "lending_limit": ""}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    html = r.content.decode()
    assert ("The teams of research are guaranteed 65 h100, more than research&#x27;s "
            "nominal 64.") in html
    assert 'aria-invalid="true"' in html and _quota(world.vision, world.h100).nominal == 16


def test_rule_q8_the_quota_board_moves_a_team_or_says_why_not(world: World,
                                                              tree: dict[str, Team]) -> None:
    c = Client()
    c.force_login(world.staff)
    r = c.post("/parents/ops/", {"parent": "research"}, HTTP_HX_REQUEST="true")
    assert r.status_code == 200
    assert ("The teams of research are guaranteed 88 h100, more than research&#x27;s "
            "nominal 64.") in r.content.decode()
    assert Team.objects.get(slug="ops").parent is None
    r = c.post("/parents/ops/", {"parent": "lang"})  # no htmx: back to the board
    assert r.status_code == 400
    assert "The teams of research are guaranteed" in r.content.decode()
    r = c.post("/parents/speech/", {"parent": ""})
    assert r.status_code == 302 and Team.objects.get(slug="speech").parent is None
    # A member of no staff never reaches it.
    m = Client()
    m.force_login(world.member)
    assert m.post("/parents/ops/", {"parent": ""}).status_code == 404


def test_rule_q8_the_admin_refuses_both_writes(world: World, tree: dict[str, Team]) -> None:
    world.staff.is_superuser = True
    world.staff.save()
    c = Client()
    c.force_login(world.staff)
    q = _quota(world.nlp, world.h100)
    r = c.post(f"/admin/queueing/quota/{q.pk}/change/", {
        "team": world.nlp.pk, "gpu_type": world.h100.pk, "nominal": 25,
        "borrowing_limit": "12", "lending_limit": ""})
    assert r.status_code == 200  # the form again, with the error
    assert ("The teams of research are guaranteed 65 h100, more than research&#x27;s "
            "nominal 64.") in r.content.decode()
    assert _quota(world.nlp, world.h100).nominal == 8
    ops = tree["ops"]
    form = {"slug": "ops", "name": ops.name, "weight": "1", "parent": tree["lang"].pk,
            "run_as_non_root": "on", "flavor_fallback": "",
            "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0"}
    r = c.post(f"/admin/accounts/team/{ops.pk}/change/", form)
    assert r.status_code == 200
    assert "The teams of research are guaranteed 88 h100" in r.content.decode()
    assert Team.objects.get(slug="ops").parent is None


def test_a_department_without_a_row_is_never_over(world: World, settings: Any) -> None:
    # No row anywhere above: the department's nominal is its teams' sum.
    dept = TeamFactory(slug="dept")
    team = TeamFactory(slug="solo", parent=dept)
    QuotaFactory(team=team, gpu_type=world.h100, nominal=500)
    r = world.client(world.staff).patch(f"/api/v1/quotas/{_quota(team, world.h100).pk}/",
                                        {"nominal": 900}, format="json")
    assert r.status_code == 200, r.content
