"""`Authorization: Token fq_<prefix>_<secret>` (or `Bearer fq_<prefix>_<secret>`): the one
check of an API token (`authenticate_key`), for DRF's TokenAuthentication and the submit
lane's fast path (queueing/api/jobs.py); the limit on failed authentications per address
(`count_failure`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from .client_ip import client_ip
from .models import ApiToken
from .selectors import api_token_for_key
from .services import token_touch

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
INVALID = "Invalid token."

# (prefix, digest of the whole key) -> the token with that prefix whose key hashes to that
# digest, its user loaded; None otherwise. The database's (`api_token_for_key`) unless a
# caller remembers tokens (queueing/api/auth_cache.py): the lookup is the only part of the
# check that differs between callers.
TokenLookup = Callable[[str, str], "ApiToken | None"]


def token_key(header: bytes) -> str | None:
    """The key of an `Authorization` header (as DRF's `get_authorization_header` gives it):
    None when it is not `Token ...` or `Bearer ...` (another scheme, or none);
    AuthenticationFailed when it is one of those but not `<scheme> <key>`."""
    parts = header.split()
    if not parts or parts[0].lower() not in KEYWORDS:
        return None
    if len(parts) != 2:
        raise exceptions.AuthenticationFailed(
            "Token header must be 'Token <key>' or 'Bearer <key>'.")
    try:
        return parts[1].decode()
    except UnicodeError as exc:
        raise exceptions.AuthenticationFailed(INVALID) from exc


def key_parts(key: str) -> tuple[str, str] | None:
    """(prefix, digest) of a key of the form `fq_<prefix>_<secret>`; None otherwise."""
    parts = key.split("_", 2)  # the secret itself may contain "_"
    if len(parts) != 3 or parts[0] != "fq":
        return None
    return parts[1], ApiToken.hash_key(key)


def _from_database(prefix: str, digest: str) -> ApiToken | None:
    return api_token_for_key(prefix=prefix, digest=digest)


def authenticate_key(key: str, *, lookup: TokenLookup = _from_database) -> ApiToken:
    """The token of `key`, its user loaded, if it authenticates now: `lookup` finds the
    token whose hash the key matches, the token is neither revoked nor expired, its user
    is active. Its `last_used_at` is touched (`token_touch`). AuthenticationFailed
    otherwise, with the reason. The one check of a token, for DRF's TokenAuthentication
    and the submit lane's fast path alike; failures are counted by the caller
    (`count_failure`), never here."""
    parts = key_parts(key)
    if parts is None:
        raise exceptions.AuthenticationFailed(INVALID)
    prefix, digest = parts
    token = lookup(prefix, digest)
    if token is None:
        raise exceptions.AuthenticationFailed(INVALID)
    now = timezone.now()
    if not token.is_active(now):
        raise exceptions.AuthenticationFailed("Token revoked or expired.")
    if not token.user.is_active:
        raise exceptions.AuthenticationFailed("User inactive.")
    token_touch(token=token, now=now)
    return token


class TokenAuthentication(authentication.BaseAuthentication):
    """`Token <key>` or `Bearer <key>` (RFC 6750's scheme), the same keys. The token is
    checked first (`authenticate_key`); only a failure is counted against the client
    address (count_failure), so guesses from an address never lock out a valid token used
    from it."""

    keyword = "Token"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        try:
            key = token_key(authentication.get_authorization_header(request))
            if key is None:
                return None
            token = authenticate_key(key)
        except exceptions.AuthenticationFailed:
            count_failure(client_ip(request))
            raise
        return token.user, token

    def authenticate_header(self, request: Request) -> str:
        return self.keyword
