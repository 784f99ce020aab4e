"""Rate limits of API v1: one bucket per user (all their tokens and their session share
it), one per client address (`accounts.client_ip.client_ip`) for anonymous requests.
Buckets live in the cache: Redis in production, so every web process shares them; local
memory elsewhere (per process).

Each bucket is a fixed-window counter (django-ratelimit: `cache.add` + `cache.incr`, the
windows of different buckets staggered), so a request costs the same whatever the rate.
DRF's own SimpleRateThrottle keeps a list of every request's time in the window and
rewrites it on each request: at the default 6,000/min a busy pipeline token moved ~50 KB
to and from Redis per request. The price of a fixed window is that a client may send up
to twice its rate across a window's edge."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django_ratelimit.core import get_usage
from rest_framework.throttling import BaseThrottle

from accounts.client_ip import client_ip

if TYPE_CHECKING:  # rest_framework.views imports the throttle classes: no runtime import
    from rest_framework.request import Request


class _FixedWindowThrottle(BaseThrottle):
    group = ""

    def rate(self) -> str | None:
        raise NotImplementedError

    def ident(self, request: Request) -> str | None:
        """The bucket of this request; None: this throttle does not apply."""
        raise NotImplementedError

    def allow_request(self, request: Request, view: Any) -> bool:
        self._wait: float | None = None
        rate = self.rate()
        ident = self.ident(request) if rate else None
        if ident is None:
            return True
        usage = get_usage(request, group=self.group, key=lambda _group, _request: ident,
                          rate=rate, increment=True)
        if usage is None or not usage["should_limit"]:
            return True
        self._wait = max(1, usage["time_left"])
        return False

    def wait(self) -> float | None:
        return self._wait


class TokenRateThrottle(_FixedWindowThrottle):
    """`FAIRQ_API_RATE` (e.g. "6000/min") per user: issuing more tokens does not buy a
    higher rate."""

    group = "fairq-api-token"

    def rate(self) -> str | None:
        return str(settings.FAIRQ_API_RATE) if settings.FAIRQ_API_RATE else None

    def ident(self, request: Request) -> str | None:
        if request.user and request.user.is_authenticated:
            return f"user-{request.user.pk}"
        return None


class AnonymousRateThrottle(_FixedWindowThrottle):
    """`FAIRQ_API_ANON_RATE` per client address for requests without credentials."""

    group = "fairq-api-anon"

    def rate(self) -> str | None:
        return str(settings.FAIRQ_API_ANON_RATE) if settings.FAIRQ_API_ANON_RATE else None

    def ident(self, request: Request) -> str | None:
        if request.user and request.user.is_authenticated:
            return None
        return client_ip(request)
