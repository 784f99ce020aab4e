"""The `Location` header of a 201: where the resource just created can be read
(RFC 9110, 10.2.2), as a path under the API's own URLs."""

from __future__ import annotations

from typing import Any

from django.urls import reverse


def location(url_name: str, **kwargs: Any) -> dict[str, str]:
    """Response headers naming the created resource: `{"Location": "/api/v1/…/"}`."""
    return {"Location": reverse(url_name, kwargs=kwargs or None)}
