"""Input every view would otherwise have to distrust, refused once before any view runs.

* NUL characters in the path, a header, the query string or a form body. PostgreSQL text cannot
  hold them, so a lookup with one (`?team=%00`, `/teams/red/members/%00/`, the team
  switch's `team=\\x00`) raised a 500. The API's bodies are JSON only, checked by its
  parser (queueing/api/parsers.py).
* API bodies over DATA_UPLOAD_MAX_MEMORY_SIZE (by Content-Length): 413 in the API's error
  shape. Django refused them only where it read the whole body (an HTML 400), and a JSON
  body read as a stream was not bounded at all.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

from queueing.api.errors import error_body

NUL_MESSAGE = "NUL characters are not allowed."
API_PREFIX = "/api/"


def _nul_in(request: HttpRequest, *, with_form: bool) -> str | None:
    """Where a NUL is ('path', a header or parameter name), or None."""
    if "\x00" in request.path_info:
        return "path"
    for name, value in request.headers.items():
        if "\x00" in value:
            return str(name)
    sources = [request.GET]
    if with_form and request.method == "POST" and request.content_type in {
            "application/x-www-form-urlencoded", "multipart/form-data"}:
        sources.append(request.POST)
    for query in sources:
        for key, values in query.lists():
            if "\x00" in key or any("\x00" in v for v in values):
                return key.replace("\x00", "") or "query"
    return None


class RefuseBadInputMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:

        api = request.path_info.startswith(API_PREFIX)
        if api:
            limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if limit is not None and length > limit:
                return JsonResponse(error_body(
                    413, "too_large", f"The request body is over {limit} bytes."), status=413)
        try:
            # The API takes JSON only (its parser checks it): reading a form body here
            # would leave DRF an empty body instead of its 415.
            where = _nul_in(request, with_form=not api)
        except RequestDataTooBig:
            if not api:
                raise  # Django's 400 page
            return JsonResponse(error_body(413, "too_large", "The request body is too large."),
                                status=413)
        if where is not None:
            if api:
                return JsonResponse(error_body(400, "invalid", NUL_MESSAGE,
                                               {where: [NUL_MESSAGE]}), status=400)
            return HttpResponseBadRequest(NUL_MESSAGE, content_type="text/plain")
        return self.get_response(request)
