"""Single sign-on with OpenID Connect (mozilla-django-oidc; docs/deployment.md, "Single
sign-on"). On when OIDC_RP_CLIENT_ID is set: the login page offers it, a first login
creates the user, and every login makes their team memberships the ones the groups
claim (FAIRQ_OIDC_GROUPS_CLAIM) names. Password login stays for the demo and break-glass
staff, and sign-on never logs into a password account.

The authentication backend is `accounts.sso_backend.FairqOIDCBackend`, listed in
AUTHENTICATION_BACKENDS only when sign-on is on; mozilla-django-oidc is imported only then,
so a venv without it still runs everything else."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import Http404, HttpRequest, HttpResponse


def _enabled() -> None:
    if not settings.FAIRQ_OIDC_ENABLED:
        raise Http404("single sign-on is not configured")


def oidc_authenticate(request: HttpRequest) -> HttpResponse:
    """Redirect to the identity provider (with state and nonce in the session)."""
    _enabled()
    from mozilla_django_oidc.views import OIDCAuthenticationRequestView

    response: HttpResponse = OIDCAuthenticationRequestView.as_view()(request)
    return response


def oidc_callback(request: HttpRequest) -> HttpResponse:
    """The provider's redirect back: code → tokens → claims → the user, logged in."""
    _enabled()
    from mozilla_django_oidc.views import OIDCAuthenticationCallbackView

    response: HttpResponse = OIDCAuthenticationCallbackView.as_view()(request)
    return response


def sso_context(request: HttpRequest) -> dict[str, Any]:
    """Context processor: whether the login page offers single sign-on."""
    return {"fairq_sso_enabled": settings.FAIRQ_OIDC_ENABLED}
