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
from typing import Any, Protocol

from django.conf import settings


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
