"""`Authorization: Token fq_<prefix>_<secret>` (or `Bearer fq_<prefix>_<secret>`) for DRF."""

from __future__ import annotations

import hmac
import time
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from .client_ip import client_ip
from .models import ApiToken
from .selectors import api_token_with_user

_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def failure_window(ip: str) -> tuple[str, int, int] | None:
    """(cache key, limit, seconds left) of the current window of `ip`'s failed token
    authentications under FAIRQ_API_AUTH_FAILURE_RATE; None when the limit is off."""
    rate = str(settings.FAIRQ_API_AUTH_FAILURE_RATE or "")
    if not rate:
        return None
    count, unit = rate.split("/")
    period = _PERIODS[unit[0]]
    now = int(time.time())
    start = now - now % period
    return f"fairq:api-auth-failures:{ip}:{start}", int(count), start + period - now


def count_failure(ip: str) -> None:
    """Count a failed token authentication from `ip`, and answer 429 (Throttled) instead
    of 401 once the address is past FAIRQ_API_AUTH_FAILURE_RATE in the current fixed
    window. Called only after a token failed: a token that authenticates is never
    refused by this limit, from any address (docs/api.md, "Authentication"). The count
    lives in the cache (Redis in production: every process)."""
    window = failure_window(ip)
    if window is None:
        return
    key, limit, left = window
    if cache.add(key, 1, timeout=left + 1):
        count = 1
    else:
        try:
            count = int(cache.incr(key))
        except ValueError:  # expired between add and incr: count it in a fresh window
            cache.add(key, 1, timeout=left + 1)
            count = 1
    if count > limit:
        raise exceptions.Throttled(wait=max(1, left),
                                   detail="Too many failed authentications from this address.")


KEYWORDS = (b"token", b"bearer")  # `Authorization: Token <key>` or `Bearer <key>`


class TokenAuthentication(authentication.BaseAuthentication):
    """`Token <key>` or `Bearer <key>` (RFC 6750's scheme), the same keys. The token is
    checked first; only a failure is counted against the client address (count_failure),
    so guesses from an address never lock out a valid token used from it."""

    keyword = "Token"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() not in KEYWORDS:
            return None
        try:
            if len(header) != 2:
                raise exceptions.AuthenticationFailed(
                    "Token header must be 'Token <key>' or 'Bearer <key>'.")
            try:
                key = header[1].decode()
            except UnicodeError as exc:
                raise exceptions.AuthenticationFailed("Invalid token.") from exc
            return self.authenticate_key(key)
        except exceptions.AuthenticationFailed:
            count_failure(client_ip(request))
            raise

    def authenticate_key(self, key: str) -> tuple[Any, ApiToken]:
        parts = key.split("_", 2)  # the secret itself may contain "_"
        if len(parts) != 3 or parts[0] != "fq":
            raise exceptions.AuthenticationFailed("Invalid token.")
        token = api_token_with_user(prefix=parts[1])
        # Compare in constant time so the hash cannot be probed byte by byte.
        if token is None or not hmac.compare_digest(token.key_hash, ApiToken.hash_key(key)):
            raise exceptions.AuthenticationFailed("Invalid token.")
        now = timezone.now()
        if not token.is_active(now):
            raise exceptions.AuthenticationFailed("Token revoked or expired.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive.")
        # Touch last_used_at at most once a minute: a write per request would be waste.
        if token.last_used_at is None or (now - token.last_used_at).total_seconds() > 60:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
