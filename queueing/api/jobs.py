"""`POST /api/v1/jobs/` without DRF's machinery for the plain case.

A pipeline's submit (a token, a JSON job of plain fields, no Idempotency-Key) goes here:

1. The body, read by `parsers.parse_json` as SafeJSONParser reads it, and shaped by
   `lean_shaped`: the same result as `shaped(JobCreateSerializer, body)`, read from the
   serializer's own field declarations (one pass over the JSON, no DRF field objects
   run). A field is declared once, in JobCreateSerializer; one whose kind `lean_shaped`
   does not know (nested serializers, choices, custom validators) still works: a body
   that sets it goes to DRF.
2. The token (`Token` or `Bearer`), found among the tokens the process remembers
   (queueing/api/auth_cache.py) for its user's rate-limit bucket.
3. One cache round trip: the user's rate-limit bucket counted and the token generation
   read (throttling.hit_and_read). Then the token is checked by
   `accounts.authentication.authenticate_key`, the check DRF's TokenAuthentication makes,
   with the remembered tokens of that generation as its lookup. The address's failed
   authentications are not read: a token that authenticates is never refused by that
   limit (docs/api.md).
4. The same job input and service as the DRF view: `services.job_input.job_input_of` (every
   submit rule, the cluster fields, the dependencies), `job_submit_with_event`
   (membership with the INSERT); the answer built from the rows just written
   (`job_submitted_data`), rendered by DRF's own JSON renderer.

Anything else, and every refusal, is answered by the DRF view (JobViewSet): an unknown or
ill-shaped field, a refused token, the rate limit, a submit rule. Its answer is the one
the API always gave, by construction; the rate-limit hit already made is handed over
(`throttling.COUNTED_ATTR`), not counted twice. Nothing is written before the hand-over.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import (
    MaxLengthValidator,
    MaxValueValidator,
    MinLengthValidator,
    MinValueValidator,
    ProhibitNullCharactersValidator,
)
from django.http import Http404, HttpRequest, HttpResponse
from django.urls import get_script_prefix, reverse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import HTTP_HEADER_ENCODING, serializers
from rest_framework.exceptions import APIException, AuthenticationFailed
from rest_framework.renderers import JSONRenderer
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from accounts.authentication import authenticate_key, token_key
from queueing.errors import DomainError
from queueing.services.job_input import job_input_of
from queueing.services.jobs import job_submit_with_event
from queueing.validation import parse_gpus

from . import auth_cache, throttling
from .bulk import job_submitted_data
from .fields import GpusField
from .parsers import parse_json
from .serializers import JobCreateSerializer, shaper

_SURROGATE = re.compile("[\ud800-\udfff]")
_BIG = 10**18  # larger ints go to DRF (its max_string_length rule, the columns' ranges)
_RENDERER = JSONRenderer()
# What DRF's answer carries besides the middleware's headers.
_DRF_HEADERS = {"Vary": "Accept", "Allow": "GET, POST, HEAD, OPTIONS"}


class _ToDrf(Exception):
    """This request is DRF's to answer."""


# --- 1. shapes --------------------------------------------------------------------------

Check = Callable[[Any], Any]


def _char(field: serializers.CharField) -> Check:
    trim, blank = field.trim_whitespace, field.allow_blank
    most, least = field.max_length, field.min_length

    def check(value: Any) -> Any:
        if type(value) is not str:
            raise _ToDrf
        if value == "" or (trim and value.strip() == ""):
            if not blank:
                raise _ToDrf
            return ""
        if trim:
            value = value.strip()
        if (most is not None and len(value) > most) or (least is not None and len(value) < least):
            raise _ToDrf
        if not value.isascii() and _SURROGATE.search(value):
            raise _ToDrf
        return value  # NUL: refused with the whole body (check_json_value)

    return check


def _integer(field: serializers.IntegerField) -> Check:
    least = -_BIG if field.min_value is None else field.min_value
    most = _BIG if field.max_value is None else field.max_value

    def check(value: Any) -> Any:
        if type(value) is not int or not least <= value <= most:
            raise _ToDrf
        return value

    return check


def _gpus(value: Any) -> Any:
    try:
        return parse_gpus(value)
    except ValueError:
        raise _ToDrf from None


def _boolean(_field: serializers.BooleanField) -> Check:
    def check(value: Any) -> Any:
        if value is not True and value is not False:
            raise _ToDrf
        return value

    return check


def _list(field: serializers.ListField, child: Check) -> Check:
    most, least, empty = field.max_length, field.min_length, field.allow_empty

    def check(value: Any) -> Any:
        if type(value) is not list or (not value and not empty) or \
                (most is not None and len(value) > most) or \
                (least is not None and len(value) < least):
            raise _ToDrf
        return [child(item) for item in value]

    return check


def _dict(field: serializers.DictField, child: Check) -> Check:
    empty = field.allow_empty

    def check(value: Any) -> Any:
        if type(value) is not dict or (not value and not empty):
            raise _ToDrf
        return {key: child(item) for key, item in value.items()}

    return check


# The validators the kinds above check themselves (DRF adds them from the arguments).
_OWN_VALIDATORS = (MaxLengthValidator, MinLengthValidator, MaxValueValidator,
                   MinValueValidator, ProhibitNullCharactersValidator,
                   ProhibitSurrogateCharactersValidator)


def _check_of(field: serializers.Field[Any, Any, Any, Any]) -> Check | None:
    """The lean check of `field`, or None when its kind is DRF's alone."""
    if any(not isinstance(v, _OWN_VALIDATORS) for v in field.validators):
        return None
    kind = type(field)
    if kind is GpusField:
        return _gpus
    if kind is serializers.CharField:
        return _char(field)  # type: ignore[arg-type]
    if kind is serializers.IntegerField:
        return _integer(field)  # type: ignore[arg-type]
    if kind is serializers.BooleanField:
        return _boolean(field)  # type: ignore[arg-type]
    if kind in (serializers.ListField, serializers.DictField):
        child = _check_of(field.child)  # type: ignore[attr-defined]
        if child is None:
            return None
        return (_list if kind is serializers.ListField else _dict)(field, child)  # type: ignore[arg-type]
    return None


class _Absent:
    """A field left out: its default (called when callable), omitted, or DRF's refusal."""

    def __init__(self, field: serializers.Field[Any, Any, Any, Any]) -> None:
        self.required = field.required
        self.default = field.default

    def value(self) -> Any:
        if self.required or self.default is serializers.empty:
            raise _ToDrf
        return self.default() if callable(self.default) else self.default


@functools.cache
def _fields_of(serializer_class: type[serializers.Serializer[Any]]
               ) -> dict[str, tuple[Check | None, _Absent, bool]]:
    """Per writable field of the serializer: (its check or None, what leaving it out
    gives, whether null is allowed). A serializer with validation of its own (`validate`,
    `validate_<field>`, class validators) has none: all of it is DRF's."""
    one = shaper(serializer_class)
    if one.validators or type(one).validate is not serializers.Serializer.validate:
        return {}
    out: dict[str, tuple[Check | None, _Absent, bool]] = {}
    for name, field in one.fields.items():
        if field.read_only:
            continue
        own = hasattr(one, f"validate_{name}") or field.source != name
        out[name] = (None if own else _check_of(field), _Absent(field), field.allow_null)
    return out


def lean_shaped(serializer_class: type[serializers.Serializer[Any]], data: Any
                ) -> dict[str, Any] | None:
    """What `shaped(serializer_class, data)` returns, when it can tell without DRF's field
    objects; None otherwise (data that DRF refuses, or that sets a field whose kind only
    DRF checks). Never a different value: tests/api/test_submit_fast.py holds it to that
    on many bodies, valid and not."""
    fields = _fields_of(serializer_class)
    if not fields or type(data) is not dict:
        return None
    try:
        for key in data:
            if key not in fields:  # an unknown field: DRF's 400 names it
                return None
        out: dict[str, Any] = {}
        for name, (check, absent, nullable) in fields.items():
            if name not in data:
                if not absent.required and absent.default is serializers.empty:
                    continue  # left out, no default: not in DRF's result either
                out[name] = absent.value()
                continue
            value = data[name]
            if value is None:
                if not nullable:
                    return None
                out[name] = None
            elif check is None:
                return None
            else:
                out[name] = check(value)
        return out
    except _ToDrf:
        return None


# --- the view ---------------------------------------------------------------------------

_MARK = 987654321987654321


@functools.lru_cache(maxsize=8)
def _location_template(script_prefix: str) -> tuple[str, str]:
    """`reverse("job-detail")` split around the id, once per script prefix (the URL
    resolver costs ~50 µs a call; only the id differs from submit to submit)."""
    head, _, tail = reverse("job-detail", kwargs={"pk": _MARK}).partition(str(_MARK))
    return head, tail


def _job_location(pk: int) -> str:
    head, tail = _location_template(get_script_prefix())
    return f"{head}{pk}{tail}"



def _body(request: HttpRequest) -> Any:
    """The JSON body as SafeJSONParser reads it (`parse_json`), or _ToDrf (DRF says what
    is wrong)."""
    if request.content_type != "application/json" or \
            (request.content_params or {}).get("charset", "utf-8").lower() not in ("utf-8", "utf8"):
        raise _ToDrf
    accept = request.META.get("HTTP_ACCEPT", "")
    if accept not in ("", "*/*", "application/json"):
        raise _ToDrf  # content negotiation is DRF's
    try:
        length = int(request.META.get("CONTENT_LENGTH") or "")
    except ValueError:
        raise _ToDrf from None
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    if limit is not None and length > limit:
        raise _ToDrf
    try:
        return parse_json(request.body.decode("utf-8"))
    except Exception:  # not JSON, a key twice, too deep, a NUL, a body Django will not read
        raise _ToDrf from None


def _authenticated(request: HttpRequest) -> tuple[Any, object]:
    """The user of the request's token after the one round trip (step 3), and the
    generation read then; or _ToDrf. The token is checked by `authenticate_key`, as
    TokenAuthentication checks it, given the process's remembered tokens as its lookup."""
    try:
        key = token_key(request.META.get("HTTP_AUTHORIZATION", "").encode(HTTP_HEADER_ENCODING))
    except AuthenticationFailed:
        raise _ToDrf from None  # TokenAuthentication refuses it (and counts the failure)
    seen = auth_cache.token_seen(key) if key is not None else None
    if key is None or seen is None:
        raise _ToDrf
    rate = settings.FAIRQ_API_RATE
    limit, period = throttling.split_rate(str(rate)) if rate else (0, 60)
    bucket = f"{throttling.TokenRateThrottle.group}:user-{seen[0].user_id}"
    count, left, (generation,) = throttling.hit_and_read(
        bucket, period, [auth_cache.GENERATION_KEY])
    if rate:
        # In the environ, so that the request the DRF view gets after a hand-over sees it,
        # in the same request object (jobs_view) or built afresh from it (lane.py).
        request.META[throttling.COUNTED_ATTR] = (bucket, count, left)
    try:
        token = authenticate_key(key, lookup=auth_cache.token_lookup(generation, seen))
    except AuthenticationFailed:
        raise _ToDrf from None
    # A token that authenticates is never refused by the failed-authentication limit of
    # its address (accounts/authentication.py, count_failure): not read here.
    if rate and count > limit:
        raise _ToDrf  # TokenRateThrottle's 429, with this hit
    return token.user, generation


def jobs_view(drf_view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """The view of `jobs/`: POST through the fast submit above, the rest and every
    hand-over to `drf_view` (the router's JobViewSet list-and-create view)."""

    @csrf_exempt  # token requests only; the DRF view keeps its own CSRF rule for sessions
    def jobs_list_or_submit(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        if request.method != "POST" or "HTTP_IDEMPOTENCY_KEY" in request.META \
                or HANDED_OVER_MARK in request.META:
            return drf_view(request, *args, **kwargs)
        try:
            return submit_or_hand_over(request)
        except HANDED_OVER:
            return drf_view(request, *args, **kwargs)

    return jobs_list_or_submit


# In the environ of a request the submit lane (lane.py) tried and handed over: the
# application's `jobs/` gives it to the DRF view at once, not to the fast path again
# (which would count it twice against the rate).
HANDED_OVER_MARK = "fairq.submit_handed_over"

# Refusals: DRF's exception handler answers them (queueing/api/errors.py); nothing has
# been written when one is raised.
HANDED_OVER = (_ToDrf, DomainError, DjangoValidationError, Http404, PermissionDenied,
                APIException)


def submit_or_hand_over(request: HttpRequest) -> HttpResponse:
    """The fast submit's 201, or one of HANDED_OVER (nothing written): the DRF view's to
    answer."""
    data = _body(request)
    fields = lean_shaped(JobCreateSerializer, data)
    if fields is None:
        raise _ToDrf
    user, generation = _authenticated(request)
    job_input = job_input_of(
        actor=user, fields=fields,
        team_lookup=lambda slug: auth_cache.team_remembered(user, slug, generation))
    job, event, created = job_submit_with_event(actor=user, data=job_input)
    request.user = user
    if not created or event is None:  # no idempotency key: cannot happen
        raise RuntimeError("a submit without an idempotency key created no job")
    body = _RENDERER.render(job_submitted_data(job, [event]))
    response = HttpResponse(body, status=201, content_type="application/json")
    response["Location"] = _job_location(job.pk)
    for name, value in _DRF_HEADERS.items():
        response[name] = value
    return response
