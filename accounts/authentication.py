"""`Authorization: Token fq_<prefix>_<secret>` for DRF."""

from __future__ import annotations

import hmac
from typing import Any

from django.utils import timezone
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from .models import ApiToken
from .selectors import api_token_with_user


class TokenAuthentication(authentication.BaseAuthentication):
    keyword = "Token"

    def authenticate(self, request: Request) -> tuple[Any, ApiToken] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Token header must be 'Token <key>'.")
        try:
            key = header[1].decode()
        except UnicodeError as exc:
            raise exceptions.AuthenticationFailed("Invalid token.") from exc
        return self.authenticate_key(key)

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
