"""The submit lane: `POST /api/v1/jobs/` through the middleware that applies to it.

Django runs every request through all of `settings.MIDDLEWARE` and the URL resolver.
For a pipeline's submit (a token, a JSON body, no session, no form, no page) most of that
chain has nothing to do, and it cost ~0.6-0.8 ms of a ~3 ms submit
(docs/performance.md). The lane is a WSGI wrapper around the project's application:

* A `POST` to the jobs list with a token and no Idempotency-Key goes through
  `lane_middleware()` — `settings.MIDDLEWARE` without the entries of
  `FAIRQ_SUBMIT_LANE_SKIPS`, each skipped for a reason written there — to the submit fast
  path (queueing/api/jobs.py), in Django's own request handler (signals, the request's
  closing, error logging, exceptions to responses). So the host check, HTTPS redirect,
  security headers, client address, NUL and size refusals are the same middleware's.
* Whatever the fast path hands over (a body or token it does not decide, any refusal) is
  served by the whole application from the start, its body rewound, with the rate-limit
  hit already made carried in the environ (throttling.COUNTED_ATTR) and the request
  marked (jobs.HANDED_OVER_MARK) so that the application's `jobs/` gives it to the DRF
  view without trying the fast path again: nothing is counted or written twice.
* Everything else goes to the application untouched.

A middleware added to MIDDLEWARE later is in the lane unless it is listed as skipped; one
that needs Django's view hooks (`process_view`, `process_exception`,
`process_template_response`) cannot be in the lane and stops it at start-up
(ImproperlyConfigured), so the lane never silently drops what a middleware does.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig
from django.core.handlers.exception import convert_exception_to_response
from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpRequest, HttpResponse, RawPostDataException
from django.utils.module_loading import import_string

from . import jobs

JOBS_PATH = "/api/v1/jobs/"
_SCHEMES = ("token ", "bearer ")  # accounts/authentication.py takes both
_VIEW_HOOKS = ("process_view", "process_exception", "process_template_response")

WSGIApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def lane_middleware() -> list[str]:
    """`settings.MIDDLEWARE` in order, without the lane's skips."""
    skips = settings.FAIRQ_SUBMIT_LANE_SKIPS
    return [path for path in settings.MIDDLEWARE if path not in skips]


class _HandOver(HttpResponse):
    """The fast path did not decide this request: the application serves it."""

    lane_body: bytes | None = None


class LaneHandler(WSGIHandler):
    """Django's WSGI handler with the lane's middleware around the fast submit instead of
    the URL resolver and a view."""

    def load_middleware(self, is_async: bool = False) -> None:
        self._view_middleware: list[Any] = []
        self._template_response_middleware: list[Any] = []
        self._exception_middleware: list[Any] = []
        handler = convert_exception_to_response(self._get_response)
        for path in reversed(lane_middleware()):
            middleware = import_string(path)(handler)
            hooks = [hook for hook in _VIEW_HOOKS if hasattr(middleware, hook)]
            if hooks:
                raise ImproperlyConfigured(
                    f"{path} has {', '.join(hooks)}, which the submit lane does not run: "
                    "list it in FAIRQ_SUBMIT_LANE_SKIPS with the reason, or turn the lane "
                    "off (FAIRQ_FAST_SUBMIT=0).")
            handler = convert_exception_to_response(middleware)
        self._middleware_chain = handler

    def _get_response(self, request: HttpRequest) -> HttpResponse:
        try:
            return jobs.submit_or_hand_over(request)
        except jobs.HANDED_OVER:
            handed = _HandOver(status=299)
            handed.lane_body = _body_read(request)
            return handed


def _body_read(request: HttpRequest) -> bytes | None:
    """The request's body, for the application to read again: what the fast path read
    (Django keeps it), or read now; None when the stream was consumed without being kept
    (a form a middleware parsed) or is larger than Django reads into memory: then the
    application gets the stream as it is, and answers as it always does."""
    try:
        return request.body
    except (RawPostDataException, RequestDataTooBig):
        return None


class SubmitLane:
    """The WSGI application: the lane for a plain token submit, `app` for the rest."""

    def __init__(self, app: WSGIApp) -> None:
        self.app = app
        self.lane = LaneHandler()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]
                 ) -> Iterable[bytes]:
        if not (environ.get("REQUEST_METHOD") == "POST"
                and environ.get("PATH_INFO") == JOBS_PATH
                and "HTTP_IDEMPOTENCY_KEY" not in environ
                and environ.get("HTTP_AUTHORIZATION", "")[:7].lower().startswith(_SCHEMES)
                and settings.FAIRQ_FAST_SUBMIT):
            return self.app(environ, start_response)
        answered: list[Any] = []

        def start_lane(status: str, headers: list[Any], exc_info: Any = None) -> Any:
            answered.append((status, headers, exc_info))

        response = self.lane(environ, start_lane)
        if not isinstance(response, _HandOver):
            status, headers, exc_info = answered[0]
            start_response(status, headers, exc_info)
            return response
        body = response.lane_body
        response.close()  # request_finished: the application's request starts afresh
        if body is not None:
            environ["wsgi.input"] = io.BytesIO(body)
        environ[jobs.HANDED_OVER_MARK] = True
        return self.app(environ, start_response)


def submit_lane(app: WSGIApp) -> WSGIApp:
    """`app` behind the lane (config/wsgi.py)."""
    return SubmitLane(app)
