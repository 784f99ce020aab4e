"""The one answer to "which address is this client?" for the API rate limits, the limit
on failed token authentication, login throttling (django-axes) and audit records.

Behind `FAIRQ_TRUSTED_PROXY_COUNT` = N reverse proxies (an ingress, a load balancer),
each proxy appends the address it received the request from to `X-Forwarded-For`, so the
client is the N-th entry from the right; everything left of it was written by the client
and is ignored. With N = 0 (the default) the header is ignored and `REMOTE_ADDR` is the
client. A header with fewer than N entries, or an entry that is not an IP address, did
not come through the proxies as configured: `REMOTE_ADDR` then."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Protocol

from django.conf import settings
from django.http import HttpRequest
from django.http.response import HttpResponseBase


class _HasMeta(Protocol):  # a Django HttpRequest, or DRF's Request wrapping one
    @property
    def META(self) -> dict[str, Any]: ...  # Django's name


def _address(value: str) -> str | None:
    try:
        return str(ipaddress.ip_address(value.strip()))
    except ValueError:
        return None


def client_ip(request: _HasMeta) -> str:
    """The client's address, normalized (`2001:db8::1`); never raises."""
    meta = request.META
    remote = str(meta.get("REMOTE_ADDR") or "")
    remote = _address(remote) or remote
    proxies = int(getattr(settings, "FAIRQ_TRUSTED_PROXY_COUNT", 0))
    if proxies <= 0:
        return remote
    hops = [h for h in str(meta.get("HTTP_X_FORWARDED_FOR", "")).split(",") if h.strip()]
    if len(hops) < proxies:
        return remote
    return _address(hops[-proxies]) or remote


_current: ContextVar[str | None] = ContextVar("fairq_client_ip", default=None)


def current_client_ip() -> str | None:
    """The client address of the request this thread serves (ClientIpMiddleware); None
    outside a request (a command, a Celery task)."""
    return _current.get()


class ClientIpMiddleware:
    """Makes `client_ip(request)` available to code without the request (audit records
    written by services)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponseBase]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        token = _current.set(client_ip(request))
        try:
            return self.get_response(request)
        finally:
            _current.reset(token)
