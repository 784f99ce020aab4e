"""The Django admin audits what it changes: membership rows edited inline on the Team
page (through the membership services, so the last team admin stays there too), the
Membership pages, and token revocations (through token_revoke)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.test.utils import ContextList

from accounts.models import ApiToken, AuditEntry, Membership, Role
from accounts.services import token_issue
from tests.conftest import World
from tests.factories import UserFactory

LAST_ADMIN = "team vision would have no team admin; make someone else team-admin first"


@pytest.fixture
def su(world: World) -> Any:
    return UserFactory(username="su", is_staff=True, is_superuser=True)


@pytest.fixture
def client(su: Any) -> Client:
    c = Client()
    c.force_login(su)
    return c


def _value(v: Any) -> Any:
    return "" if v is None else v


def change_form(client: Client, world: World) -> tuple[str, dict[str, Any], dict[str, int]]:
    """The Team change page's POST body as the browser would send it unchanged, and the
    index of each member's inline row."""
    url = f"/admin/accounts/team/{world.vision.pk}/change/"
    r = client.get(url)
    assert r.status_code == 200
    ctx: ContextList = r.context  # type: ignore[attr-defined]
    form = ctx["adminform"].form
    data: dict[str, Any] = {form.add_prefix(n): _value(form[n].value()) for n in form.fields}
    rows: dict[str, int] = {}
    for inline in ctx["inline_admin_formsets"]:
        fs = inline.formset
        mf = fs.management_form
        data.update({mf.add_prefix(n): mf[n].value() for n in mf.fields})
        for i, f in enumerate(fs.forms):
            for n in f.fields:
                if n != "DELETE":
                    data[f.add_prefix(n)] = _value(f[n].value())
            rows[f.instance.user.username] = i
    return url, data, rows


def membership_audits() -> list[AuditEntry]:
    return list(AuditEntry.objects.filter(object_type="accounts.Membership").order_by("id"))


def vision(world: World) -> list[tuple[str, str]]:
    return sorted(Membership.objects.filter(team=world.vision)
                  .values_list("user__username", "role"))


class TestTeamInline:
    def test_an_inline_membership_added_is_audited(self, client: Client, world: World,
                                                   su: Any) -> None:
        url, data, _ = change_form(client, world)
        n = int(data["memberships-TOTAL_FORMS"])
        data.update({"memberships-TOTAL_FORMS": n + 1, f"memberships-{n}-user": world.outsider.pk,
                     f"memberships-{n}-role": "member", f"memberships-{n}-team": world.vision.pk})
        r = client.post(url, data)
        assert r.status_code == 302, r.content.decode()[:2000]
        assert ("bob", "member") in vision(world)
        [entry] = membership_audits()
        assert entry.actor == su and entry.action == "create"
        assert entry.changes == {"team": [None, "vision"], "user": [None, "bob"],
                                 "role": [None, "member"]}

    def test_an_inline_role_change_is_audited(self, client: Client, world: World,
                                              su: Any) -> None:
        url, data, rows = change_form(client, world)
        data[f"memberships-{rows['dave']}-role"] = "team-admin"
        assert client.post(url, data).status_code == 302
        [entry] = membership_audits()
        assert entry.actor == su and entry.action == "update"
        assert entry.changes == {"role": ["member", "team-admin"]}
        m = Membership.objects.get(team=world.vision, user=world.member)
        assert entry.object_id == str(m.pk) and m.role == Role.TEAM_ADMIN

    def test_an_inline_deletion_is_audited(self, client: Client, world: World, su: Any) -> None:
        url, data, rows = change_form(client, world)
        data[f"memberships-{rows['dave']}-DELETE"] = "on"
        assert client.post(url, data).status_code == 302
        assert vision(world) == [("alice", "team-admin")]
        [entry] = membership_audits()
        assert entry.actor == su and entry.action == "delete"
        assert entry.changes == {"team": ["vision", None], "user": ["dave", None],
                                 "role": ["member", None]}

    @pytest.mark.parametrize("change", ["demote", "delete"])
    def test_it_refuses_to_leave_the_team_without_a_team_admin(
        self, client: Client, world: World, change: str
    ) -> None:
        before = vision(world)
        url, data, rows = change_form(client, world)
        if change == "demote":
            data[f"memberships-{rows['alice']}-role"] = "member"
        else:
            data[f"memberships-{rows['alice']}-DELETE"] = "on"
        r = client.post(url, data)
        assert r.status_code == 200 and LAST_ADMIN in r.content.decode()
        assert vision(world) == before and AuditEntry.objects.count() == 0

    def test_a_swap_of_team_admins_in_one_save_is_allowed(self, client: Client,
                                                          world: World) -> None:
        url, data, rows = change_form(client, world)
        data[f"memberships-{rows['alice']}-role"] = "member"
        data[f"memberships-{rows['dave']}-role"] = "team-admin"
        assert client.post(url, data).status_code == 302
        assert vision(world) == [("alice", "member"), ("dave", "team-admin")]
        assert [e.changes["role"] for e in membership_audits()] == [
            ["member", "team-admin"], ["team-admin", "member"]]


class TestMembershipAdmin:
    def test_demoting_the_last_team_admin_is_refused(self, client: Client, world: World) -> None:
        m = Membership.objects.get(team=world.vision, user=world.admin)
        r = client.post(f"/admin/accounts/membership/{m.pk}/change/", {"role": "member"})
        assert r.status_code == 200 and LAST_ADMIN in r.content.decode()
        m.refresh_from_db()
        assert m.role == Role.TEAM_ADMIN and AuditEntry.objects.count() == 0

    def test_a_role_change_is_audited(self, client: Client, world: World, su: Any) -> None:
        m = Membership.objects.get(team=world.vision, user=world.member)
        r = client.post(f"/admin/accounts/membership/{m.pk}/change/", {"role": "team-admin"})
        assert r.status_code == 302
        [entry] = membership_audits()
        assert entry.actor == su and entry.changes == {"role": ["member", "team-admin"]}

    def test_deleting_the_last_team_admin_is_refused(self, client: Client, world: World) -> None:
        m = Membership.objects.get(team=world.vision, user=world.admin)
        r = client.post(f"/admin/accounts/membership/{m.pk}/delete/", {"post": "yes"},
                        follow=True)
        assert LAST_ADMIN in r.content.decode().lower()  # the admin capitalises messages
        assert Membership.objects.filter(pk=m.pk).exists() and AuditEntry.objects.count() == 0

    def test_deleting_a_member_is_audited(self, client: Client, world: World, su: Any) -> None:
        m = Membership.objects.get(team=world.vision, user=world.member)
        r = client.post(f"/admin/accounts/membership/{m.pk}/delete/", {"post": "yes"})
        assert r.status_code == 302 and not Membership.objects.filter(pk=m.pk).exists()
        [entry] = membership_audits()
        assert entry.actor == su and entry.action == "delete"

    def test_bulk_deleting_a_teams_admins_is_refused(self, client: Client, world: World) -> None:
        ids = list(Membership.objects.filter(team=world.vision).values_list("pk", flat=True))
        r = client.post("/admin/accounts/membership/",
                        {"action": "delete_selected", "_selected_action": ids, "post": "yes"},
                        follow=True)
        assert LAST_ADMIN in r.content.decode().lower()  # the admin capitalises messages
        assert Membership.objects.filter(pk__in=ids).count() == 2
        assert AuditEntry.objects.count() == 0


class TestTokens:
    def test_revoking_in_the_admin_is_audited(self, client: Client, world: World,
                                              su: Any) -> None:
        token = token_issue(user=world.member, name="ci").token
        AuditEntry.objects.all().delete()
        r = client.post("/admin/accounts/apitoken/",
                        {"action": "revoke_tokens", "_selected_action": [token.pk]})
        assert r.status_code == 302
        token.refresh_from_db()
        assert token.revoked_at is not None
        [entry] = AuditEntry.objects.all()
        assert entry.actor == su and entry.action == "update"
        assert entry.object_type == "accounts.ApiToken" and entry.object_id == str(token.pk)
        assert entry.changes == {"revoked_at": [None, token.revoked_at.isoformat()]}

    def test_the_change_form_cannot_revoke_or_unrevoke_and_edits_are_audited(
        self, client: Client, world: World, su: Any
    ) -> None:
        token = token_issue(user=world.member, name="ci").token
        AuditEntry.objects.all().delete()
        url = f"/admin/accounts/apitoken/{token.pk}/change/"
        r = client.post(url, {"name": "ci-2", "expires_at_0": "", "expires_at_1": "",
                              "revoked_at_0": "2020-01-01", "revoked_at_1": "00:00:00"})
        assert r.status_code == 302
        token.refresh_from_db()
        assert token.name == "ci-2" and token.revoked_at is None
        [entry] = AuditEntry.objects.all()
        assert entry.actor == su and entry.changes == {"name": ["ci", "ci-2"]}

    def test_deleting_a_token_is_audited_without_its_hash(self, client: Client, world: World,
                                                          su: Any) -> None:
        token = token_issue(user=world.member, name="ci").token
        AuditEntry.objects.all().delete()
        r = client.post(f"/admin/accounts/apitoken/{token.pk}/delete/", {"post": "yes"})
        assert r.status_code == 302 and not ApiToken.objects.filter(pk=token.pk).exists()
        [entry] = AuditEntry.objects.all()
        assert entry.actor == su and entry.action == "delete" and "key_hash" not in entry.changes
