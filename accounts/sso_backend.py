"""The OpenID Connect authentication backend (accounts/sso.py has the views). Users by
the username claim (FAIRQ_OIDC_USERNAME_CLAIM); only accounts without a password (made
by sign-on) match. Creating and updating go through one service
(`accounts.services.sso_user_sync`), which also syncs the team memberships from the
groups claim."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from accounts.selectors import users_by_username
from accounts.services import sso_teams_from_groups, sso_user_sync


def _claim(claims: dict[str, Any], name: str) -> str:
    value = claims.get(name)
    return value.strip() if isinstance(value, str) else ""


def _groups(claims: dict[str, Any]) -> list[str]:
    value = claims.get(settings.FAIRQ_OIDC_GROUPS_CLAIM)
    if isinstance(value, str):  # some providers send one space-separated string
        return value.split()
    return [g for g in value if isinstance(g, str)] if isinstance(value, list) else []


class FairqOIDCBackend(OIDCAuthenticationBackend):  # type: ignore[misc]
    """mozilla-django-oidc's backend with fairq's user matching and membership sync."""

    def verify_claims(self, claims: dict[str, Any]) -> bool:
        return bool(_claim(claims, settings.FAIRQ_OIDC_USERNAME_CLAIM))

    def filter_users_by_claims(self, claims: dict[str, Any]) -> list[Any]:
        username = _claim(claims, settings.FAIRQ_OIDC_USERNAME_CLAIM)
        users = users_by_username(username=username) if username else []
        return [u for u in users if not u.has_usable_password()]

    def _sync(self, claims: dict[str, Any], user: Any) -> Any:
        teams = sso_teams_from_groups(
            _groups(claims), prefix=settings.FAIRQ_OIDC_TEAM_GROUP_PREFIX,
            admin_suffix=settings.FAIRQ_OIDC_ADMIN_GROUP_SUFFIX,
            staff_group=settings.FAIRQ_OIDC_STAFF_GROUP)
        return sso_user_sync(
            username=_claim(claims, settings.FAIRQ_OIDC_USERNAME_CLAIM),
            email=_claim(claims, "email"), first_name=_claim(claims, "given_name"),
            last_name=_claim(claims, "family_name"), teams=teams, user=user,
            sync_staff=bool(settings.FAIRQ_OIDC_STAFF_GROUP))

    def create_user(self, claims: dict[str, Any]) -> Any:
        return self._sync(claims, None)

    def update_user(self, user: Any, claims: dict[str, Any]) -> Any:
        return self._sync(claims, user)
