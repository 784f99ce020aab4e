"""Single sign-on in a real browser against a real OpenID Connect provider: the
`oidc-provider-mock` server (PyPI), started as a process by a fixture. A first login
creates the user and puts them in the team their groups claim names; the next login
after the provider changed the claim moves them. Password login stays.

Without oidc-provider-mock or mozilla-django-oidc these skip with the reason, unless
FAIRQ_REQUIRE_OIDC=1 (CI), when they fail."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
from django.contrib.auth.models import User

from accounts.models import AuditEntry, Membership, Role
from tests.conftest import World

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _missing() -> str | None:
    for module in ("oidc_provider_mock", "mozilla_django_oidc"):
        try:
            __import__(module)
        except ImportError:
            return f"{module.replace('_', '-')} is not installed (pip install -e '.[dev]')"
    return None


@pytest.fixture(scope="module")
def provider() -> Iterator[str]:
    """A running OpenID provider on a free loopback port; its base URL."""
    reason = _missing()
    if reason:
        if os.environ.get("FAIRQ_REQUIRE_OIDC") == "1":
            pytest.fail(f"FAIRQ_REQUIRE_OIDC=1 but {reason}")
        pytest.skip(reason)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-W", "ignore", "-m", "oidc_provider_mock", "--port", str(port),
         "--host", "127.0.0.1"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/.well-known/openid-configuration",
                                            timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                out = proc.stdout.read() if proc.stdout else ""
                pytest.fail(f"oidc-provider-mock did not start: {out[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def set_claims(provider: str, sub: str, claims: dict[str, Any]) -> None:
    """What the provider will say about `sub` (its PUT /users/<sub>)."""
    req = urllib.request.Request(f"{provider}/users/{sub}", data=json.dumps(claims).encode(),
                                 method="PUT", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.status == 204


@pytest.fixture
def sso(settings: Any, provider: str) -> str:
    settings.OIDC_RP_CLIENT_ID = "fairq"
    settings.OIDC_RP_CLIENT_SECRET = "fairq-secret"
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = f"{provider}/oauth2/authorize"
    settings.OIDC_OP_TOKEN_ENDPOINT = f"{provider}/oauth2/token"
    settings.OIDC_OP_USER_ENDPOINT = f"{provider}/userinfo"
    settings.OIDC_OP_JWKS_ENDPOINT = f"{provider}/jwks"
    # The mock signs its ID tokens without a `kid` header and publishes one key.
    settings.OIDC_VERIFY_KID = False
    settings.FAIRQ_OIDC_ENABLED = True
    settings.AUTHENTICATION_BACKENDS = [*settings.AUTHENTICATION_BACKENDS,
                                        "accounts.sso_backend.FairqOIDCBackend"]
    return provider


def sign_on(pg: Any, sub: str) -> None:
    pg.goto("/accounts/login/")
    pg.get_by_role("link", name="Log in with single sign-on").click()
    # The provider's own page: type the subject and authorize.
    pg.wait_for_url("**/oauth2/authorize**")
    pg.get_by_placeholder("sub").fill(sub)
    pg.get_by_role("button", name="Authorize").click()
    pg.wait_for_url(lambda url: "/oauth2/" not in url and "/oidc/" not in url)


def test_sign_on_creates_the_user_in_the_team_the_groups_claim_names(
        page: Any, world: World, sso: str, shoot: Any) -> None:
    from playwright.sync_api import expect

    set_claims(sso, "u-7431", {"preferred_username": "dana", "email": "dana@example.com",
                               "given_name": "Dana", "groups": ["vision", "no-such-team",
                                                                "hr-everyone"]})
    sign_on(page, "u-7431")
    assert urlparse(page.url).path == "/"
    expect(page.get_by_role("heading", name="Team vision")).to_be_visible()
    expect(page.get_by_role("banner").get_by_text("Team vision")).to_be_visible()
    expect(page.get_by_role("banner").get_by_text("dana")).to_be_visible()
    shoot(page, "sso-landed-on-vision")
    dana = User.objects.get(username="dana")
    assert not dana.has_usable_password() and dana.email == "dana@example.com"
    assert [(m.team.slug, m.role) for m in Membership.objects.filter(user=dana)] == [
        ("vision", Role.MEMBER)]
    assert AuditEntry.objects.filter(object_type="auth.User", object_id=str(dana.pk),
                                     action="create").exists()

    # The provider moves dana to nlp as its team admin: the next sign-on follows.
    page.get_by_role("button", name="Log out").click()
    set_claims(sso, "u-7431", {"preferred_username": "dana", "email": "dana@example.com",
                               "groups": ["nlp:admin"]})
    sign_on(page, "u-7431")
    expect(page.get_by_role("heading", name="Team nlp")).to_be_visible()
    assert [(m.team.slug, m.role) for m in Membership.objects.filter(user=dana)] == [
        ("nlp", Role.TEAM_ADMIN)]
    assert User.objects.filter(username="dana").count() == 1


def test_sign_on_never_logs_into_a_password_account_and_password_login_stays(
        page: Any, world: World, sso: str) -> None:
    from playwright.sync_api import expect

    # world.member is a password account; the provider claims the same username.
    set_claims(sso, "u-evil", {"preferred_username": world.member.username,
                               "groups": ["nlp:admin"]})
    sign_on(page, "u-evil")
    expect(page.get_by_role("alert")).to_contain_text("Single sign-on did not log you in")
    assert not Membership.objects.filter(user=world.member, team__slug="nlp").exists()
    # Break-glass: the password form is still there and works.
    login(page, world.member.username)
    expect(page.get_by_text(world.member.username).first).to_be_visible()
