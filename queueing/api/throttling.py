"""Rate limits of API v1: one bucket per API token (or per session user), one per client
address for anonymous requests. Buckets live in the cache: Redis in production, so every
web process shares them; local memory elsewhere (per process)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from rest_framework.throttling import SimpleRateThrottle

if TYPE_CHECKING:  # rest_framework.views imports the throttle classes: no runtime import
    from rest_framework.request import Request


class TokenRateThrottle(SimpleRateThrottle):
    """`FAIRQ_API_RATE` (e.g. "6000/min") per token; a session user is one bucket."""

    scope = "token"

    def get_rate(self) -> str | None:
        return str(settings.FAIRQ_API_RATE) if settings.FAIRQ_API_RATE else None

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        from accounts.models import ApiToken

        if isinstance(request.auth, ApiToken):
            ident = f"token-{request.auth.pk}"
        elif request.user and request.user.is_authenticated:
            ident = f"user-{request.user.pk}"
        else:
            return None
        return self.cache_format % {"scope": self.scope, "ident": ident}


class AnonymousRateThrottle(SimpleRateThrottle):
    """`FAIRQ_API_ANON_RATE` per client address for requests without credentials."""

    scope = "anon"

    def get_rate(self) -> str | None:
        return str(settings.FAIRQ_API_ANON_RATE) if settings.FAIRQ_API_ANON_RATE else None

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        if request.user and request.user.is_authenticated:
            return None
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
