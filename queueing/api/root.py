"""`GET /api/v1/`: every resource of the API with its absolute link (docs/api.md,
"The API root"), read from the URL patterns themselves, so a resource added to
queueing/api/urls.py is listed without being named here.

A resource whose path has parameters is listed as a URI template (RFC 6570 level 1):
`"jobs/{pk}": "https://fairq.example.com/api/v1/jobs/{pk}/"`. The keys are the paths
under `/api/v1/` without their trailing slash."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from django.urls import reverse
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

# A named regex group (DRF's router: `(?P<pk>[^/.]+)`) or a converter (`<int:id>`).
_REGEX_PARAM = re.compile(r"\(\?P<(\w+)>[^)]*\)")
_CONVERTER = re.compile(r"<(?:\w+:)?(\w+)>")
# Names of patterns that are no resource: the catch-all 404 and DRF's format suffixes.
_NOT_RESOURCES = frozenset({"api-not-found", "api-root"})


def _template(pattern: str) -> str | None:
    """A URL pattern as a path template ("jobs/{pk}/"), or None for one that is no plain
    path (a format suffix, the catch-all)."""
    path = _CONVERTER.sub(r"{\1}", _REGEX_PARAM.sub(r"{\1}", pattern))
    path = path.removeprefix("^").removesuffix("$")
    if "format" in path or any(c in path for c in "()[]*+?\\"):
        return None
    return path


def resource_paths(patterns: Iterable[Any], prefix: str = "") -> list[str]:
    """Every resource path (templates included) of `patterns`, included ones followed, in
    order, each once."""
    out: list[str] = []
    for p in patterns:
        here = _template(str(p.pattern))
        if here is None:
            continue
        if hasattr(p, "url_patterns"):  # an include()
            out.extend(resource_paths(p.url_patterns, prefix + here))
        elif getattr(p, "name", None) not in _NOT_RESOURCES and prefix + here:
            out.append(prefix + here)
    return list(dict.fromkeys(out))


class ApiRootView(APIView):
    """Every resource of the API by its path, with its absolute link (a URI template
    when the path has parameters)."""

    @extend_schema(responses={200: {"type": "object", "additionalProperties": {
        "type": "string", "description": "An absolute link, or a URI template (RFC 6570) "
        "when the path has parameters."}}}, examples=[OpenApiExample(
        "root", value={"jobs": "https://fairq.example.com/api/v1/jobs/",
                       "jobs/{pk}": "https://fairq.example.com/api/v1/jobs/{pk}/"})])
    def get(self, request: Request) -> Response:
        """Every resource of the API: its path under `/api/v1/` (no trailing slash) and
        its absolute link; a path with parameters is a URI template (`{pk}`)."""
        from . import urls  # the patterns this view is one of

        base = request.build_absolute_uri(reverse("api-root"))
        return Response({path.rstrip("/"): base + path
                         for path in resource_paths(urls.urlpatterns)})
