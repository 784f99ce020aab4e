"""`manage.py issue_token`: tokens expire after FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS unless told
otherwise, as tokens made in the dashboard or the API do (docs/deployment.md)."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from accounts.models import ApiToken
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


def _issue(*args: str) -> tuple[ApiToken, str]:
    out, err = StringIO(), StringIO()
    call_command("issue_token", *args, stdout=out, stderr=err)
    token = ApiToken.objects.latest("id")
    assert out.getvalue().strip(), "the key is printed"
    return token, err.getvalue()


def test_the_default_expiry_applies(settings):
    settings.FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS = 30
    user = UserFactory()
    token, said = _issue(user.username)
    assert token.expires_at is not None
    assert abs(token.expires_at - (timezone.now() + timedelta(days=30))) < timedelta(minutes=1)
    assert said.startswith("expires ")


def test_expires_days_and_never_expires(settings):
    settings.FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS = 30
    user = UserFactory()
    token, _ = _issue(user.username, "--expires-days", "2")
    assert abs(token.expires_at - (timezone.now() + timedelta(days=2))) < timedelta(minutes=1)
    token, said = _issue(user.username, "--never-expires")
    assert token.expires_at is None
    assert "never expires" in said


def test_no_default_when_the_setting_is_zero(settings):
    settings.FAIRQ_TOKEN_DEFAULT_EXPIRY_DAYS = 0
    token, _ = _issue(UserFactory().username)
    assert token.expires_at is None


def test_bad_input_is_refused_and_writes_nothing():
    user = UserFactory()
    with pytest.raises(CommandError, match="positive"):
        call_command("issue_token", user.username, "--expires-days", "0", stdout=StringIO())
    with pytest.raises(CommandError, match="no user"):
        call_command("issue_token", "nobody-such", stdout=StringIO())
    assert not ApiToken.objects.exists()
