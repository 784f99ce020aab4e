"""Login throttling with django-axes on the real login views
(`/accounts/login/`, `/admin/login/`): locked per username and client address after
FAIRQ_LOGIN_FAILURE_LIMIT failures, for FAIRQ_LOGIN_COOLOFF_MINUTES; reset on success."""

from __future__ import annotations

from datetime import timedelta

import pytest
from axes.models import AccessAttempt
from django.conf import settings
from django.test import Client, override_settings
from django.utils import timezone

from tests.conftest import World

LOGIN_URLS = ["/accounts/login/", "/admin/login/"]


def _limit() -> int:
    return int(settings.FAIRQ_LOGIN_FAILURE_LIMIT)


def _cooloff() -> int:
    return int(settings.FAIRQ_LOGIN_COOLOFF_MINUTES)


def _post(client: Client, url: str, username: str, password: str, ip: str = "10.0.0.5") -> object:
    return client.post(url, {"username": username, "password": password}, REMOTE_ADDR=ip)


def _fail(client: Client, url: str, username: str = "dave", ip: str = "10.0.0.5") -> None:
    """Fail the limit's number of times: the form again until the last, which locks."""
    codes = [_post(client, url, username, "wrong", ip).status_code  # type: ignore[attr-defined]
             for _ in range(_limit())]
    assert codes == [200] * (_limit() - 1) + [429]


@pytest.fixture
def staff_password(world: World) -> str:
    world.staff.set_password("pw")
    world.staff.save()
    return "pw"


@pytest.mark.parametrize("url", LOGIN_URLS)
def test_a_username_is_locked_out_at_one_address_after_the_failure_limit(
        world: World, staff_password: str, url: str) -> None:
    c = Client()
    _fail(c, url, username="root")
    r = _post(c, url, "root", staff_password)
    assert r.status_code == 429  # type: ignore[attr-defined]
    html = r.content.decode()  # type: ignore[attr-defined]
    assert "Too many failed logins" in html
    assert f"{_cooloff()} minutes" in html
    assert "_auth_user_id" not in c.session


@pytest.mark.parametrize("url", LOGIN_URLS)
def test_the_lockout_is_per_username_and_address(world: World, staff_password: str,
                                                 url: str) -> None:
    _fail(Client(), url, username="root", ip="10.0.0.5")
    # The same user from another address is not locked out (no denial of service)...
    other = Client()
    r = _post(other, url, "root", staff_password, ip="10.0.0.6")
    assert r.status_code == 302  # type: ignore[attr-defined]
    # ...nor another username from the locked address.
    r = _post(Client(), url, "dave", "wrong", ip="10.0.0.5")
    assert r.status_code == 200  # type: ignore[attr-defined]


def test_a_success_resets_the_failures(world: World) -> None:
    world.member.set_password("pw")
    world.member.save()
    c = Client()
    for _ in range(_limit() - 1):
        _post(c, "/accounts/login/", "dave", "wrong")
    assert _post(c, "/accounts/login/", "dave", "pw").status_code == 302  # type: ignore[attr-defined]
    c.post("/accounts/logout/")
    for _ in range(_limit() - 1):
        _post(c, "/accounts/login/", "dave", "wrong")
    assert _post(c, "/accounts/login/", "dave", "pw").status_code == 302  # type: ignore[attr-defined]


def test_the_lockout_ends_after_the_cool_off(world: World) -> None:
    world.member.set_password("pw")
    world.member.save()
    c = Client()
    _fail(c, "/accounts/login/")
    assert _post(c, "/accounts/login/", "dave", "pw").status_code == 429  # type: ignore[attr-defined]
    past = timezone.now() - timedelta(minutes=_cooloff(), seconds=1)
    AccessAttempt.objects.update(attempt_time=past)
    assert _post(c, "/accounts/login/", "dave", "pw").status_code == 302  # type: ignore[attr-defined]


@override_settings(FAIRQ_TRUSTED_PROXY_COUNT=1)
def test_the_lockout_counts_the_client_address_behind_the_proxy(world: World) -> None:
    world.member.set_password("pw")
    world.member.save()
    c = Client()
    for _ in range(_limit()):
        c.post("/accounts/login/", {"username": "dave", "password": "wrong"},
               REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="1.1.1.1")
    attempt = AccessAttempt.objects.get()
    assert attempt.ip_address == "1.1.1.1"
    r = c.post("/accounts/login/", {"username": "dave", "password": "pw"},
               REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="2.2.2.2")
    assert r.status_code == 302
