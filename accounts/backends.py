"""Login throttling (django-axes) as the first authentication backend."""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


class LoginThrottleBackend(AxesStandaloneBackend):  # type: ignore[misc]  # axes is untyped
    """Refuses a locked-out username at the client's address before any password is
    checked (the lockout page then comes from axes' middleware).

    `authenticate()` without a request (Django's test client `login()`, a script) has no
    client to count and is passed on to the next backend; every web login path (the login
    page, the admin's) passes its request, so none of them escapes the limit."""

    def authenticate(self, request: HttpRequest | None, username: str | None = None,
                     password: str | None = None, **kwargs: Any) -> None:
        if request is None:
            return None
        return super().authenticate(request, username=username, password=password,  # type: ignore[no-any-return]
                                    **kwargs)


def lockout_response(request: HttpRequest, original_response: Any = None,
                     credentials: Any = None) -> HttpResponse:
    """The page a locked-out login gets (axes' AXES_LOCKOUT_CALLABLE): 429, readable, and
    the same whether or not the username exists."""
    return render(request, "registration/lockout.html", {
        "failure_limit": settings.FAIRQ_LOGIN_FAILURE_LIMIT,
        "cooloff_minutes": settings.FAIRQ_LOGIN_COOLOFF_MINUTES,
    }, status=429)
