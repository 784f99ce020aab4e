"""Single sign-on without a browser (tests/browser/test_sso.py has the end-to-end flow
against a real provider): the groups claim → teams mapping, the user sync and its
audit, the last-admin rule, and the routes and login page with sign-on off and on."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from accounts.models import AuditEntry, Membership, Role
from accounts.services import SsoTeams, sso_teams_from_groups, sso_user_sync
from tests.conftest import World

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("groups", "prefix", "suffix", "expected"), [
    (["vision", "nlp"], "", ":admin", {"vision": Role.MEMBER, "nlp": Role.MEMBER}),
    (["vision:admin", "vision"], "", ":admin", {"vision": Role.TEAM_ADMIN}),
    (["vision", "vision:admin"], "", ":admin", {"vision": Role.TEAM_ADMIN}),
    (["fairq-vision", "vision", "fairq-nlp-admins"], "fairq-", "-admins",
     {"vision": Role.MEMBER, "nlp": Role.TEAM_ADMIN}),
    (["no-such-team", "hr", "", 7, None], "", ":admin", {}),
    (["vision:admin"], "", "", {}),  # no admin suffix: "vision:admin" is no team's name
])
def test_the_groups_claim_names_existing_teams_and_roles(
        world: World, groups: list[Any], prefix: str, suffix: str,
        expected: dict[str, str]) -> None:
    assert sso_teams_from_groups(groups, prefix=prefix, admin_suffix=suffix).roles == expected


def sync(user: User | None, roles: dict[str, str], username: str = "erin") -> User | None:
    return sso_user_sync(username=username, email=f"{username}@example.com", first_name="E",
                         last_name="R", teams=SsoTeams(roles=roles), user=user)


def memberships(user: User) -> list[tuple[str, str]]:
    return sorted((m.team.slug, m.role) for m in Membership.objects.filter(user=user))


def test_a_first_sign_on_creates_a_passwordless_user_with_audited_memberships(
        world: World) -> None:
    user = sync(None, {"vision": Role.MEMBER, "nlp": Role.TEAM_ADMIN})
    assert user is not None and not user.has_usable_password()
    assert memberships(user) == [("nlp", Role.TEAM_ADMIN), ("vision", Role.MEMBER)]
    actions = sorted(AuditEntry.objects.filter(actor=None).values_list("object_type", "action"))
    assert actions == [("accounts.Membership", "create"), ("accounts.Membership", "create"),
                       ("auth.User", "create")]


def test_the_next_sign_on_adds_changes_and_removes_memberships(world: World) -> None:
    user = sync(None, {"vision": Role.MEMBER, "speech": Role.MEMBER})
    assert user is not None
    user = sync(user, {"vision": Role.TEAM_ADMIN, "nlp": Role.MEMBER})
    assert user is not None
    assert memberships(user) == [("nlp", Role.MEMBER), ("vision", Role.TEAM_ADMIN)]
    assert AuditEntry.objects.filter(object_type="accounts.Membership", action="delete",
                                     changes__team=["speech", None]).exists()


def test_the_last_admin_of_a_team_keeps_the_role_the_claim_drops(world: World) -> None:
    user = sync(None, {"speech": Role.TEAM_ADMIN})
    assert user is not None
    Membership.objects.filter(team__slug="speech").exclude(user=user).delete()
    user = sync(user, {"vision": Role.MEMBER})
    assert user is not None
    assert memberships(user) == [("speech", Role.TEAM_ADMIN), ("vision", Role.MEMBER)]


def test_sign_on_refuses_a_username_taken_by_a_password_account(world: World) -> None:
    before = AuditEntry.objects.count()
    assert sync(None, {"nlp": Role.TEAM_ADMIN}, username=world.member.username) is None
    assert world.member.has_usable_password()
    assert not Membership.objects.filter(user=world.member, team__slug="nlp").exists()
    assert AuditEntry.objects.count() == before


@pytest.mark.parametrize(("groups", "staff_group", "expected"), [
    (["fairq-staff", "vision"], "fairq-staff", True),
    (["vision"], "fairq-staff", False),
    (["fairq-staff-not"], "fairq-staff", False),  # matched whole, not as a prefix
    (["fairq-staff"], "", False),  # no staff group configured: nobody is made staff
])
def test_the_staff_group_is_matched_whole(
        world: World, groups: list[str], staff_group: str, expected: bool) -> None:
    teams = sso_teams_from_groups(groups, prefix="", admin_suffix=":admin",
                                  staff_group=staff_group)
    assert teams.staff is expected


def test_staff_rights_follow_the_staff_group_at_every_sign_on(world: World) -> None:
    def staff_sync(user: User | None, staff: bool) -> User | None:
        return sso_user_sync(username="erin", email="erin@example.com", first_name="E",
                             last_name="R", teams=SsoTeams(roles={}, staff=staff), user=user,
                             sync_staff=True)

    user = staff_sync(None, True)
    assert user is not None
    user.refresh_from_db()
    assert user.is_staff and not user.is_superuser
    user = staff_sync(user, False)
    assert user is not None
    user.refresh_from_db()
    assert not user.is_staff
    granted, revoked = AuditEntry.objects.filter(
        object_type="auth.User", action="update").order_by("id")
    assert granted.changes == {"is_staff": [False, True]}
    assert revoked.changes == {"is_staff": [True, False]}


def test_without_a_staff_group_sign_on_keeps_staff_given_by_hand(world: World) -> None:
    user = sync(None, {"vision": Role.MEMBER})
    assert user is not None
    User.objects.filter(pk=user.pk).update(is_staff=True)
    user.refresh_from_db()
    user = sync(user, {"vision": Role.MEMBER})
    assert user is not None
    user.refresh_from_db()
    assert user.is_staff


def test_with_sign_on_off_the_routes_are_404_and_the_login_page_has_no_button(
        db: None) -> None:
    c = Client()
    assert c.get("/oidc/authenticate/").status_code == 404
    assert c.get("/oidc/callback/").status_code == 404
    assert "single sign-on" not in c.get("/accounts/login/").content.decode()


def test_with_sign_on_on_the_login_page_offers_it_and_says_when_it_failed(
        db: None, settings: Any) -> None:
    settings.FAIRQ_OIDC_ENABLED = True
    page = Client().get("/accounts/login/?next=/jobs/").content.decode()
    assert 'href="/oidc/authenticate/?next=/jobs/"' in page
    failed = Client().get("/accounts/login/?sso=failed").content.decode()
    assert "Single sign-on did not log you in" in failed


def test_a_client_id_without_the_providers_endpoints_stops_start_up() -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test",
           "OIDC_RP_CLIENT_ID": "fairq", "OIDC_OP_TOKEN_ENDPOINT": "https://idp/token"}
    out = subprocess.run([sys.executable, "-c", "import django; django.setup()"], env=env,
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert ("single sign-on needs OIDC_OP_AUTHORIZATION_ENDPOINT, OIDC_OP_USER_ENDPOINT, "
            "OIDC_OP_JWKS_ENDPOINT") in out.stderr
