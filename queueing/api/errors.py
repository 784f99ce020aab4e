"""One JSON error shape for every API error:

    {"error": {"status": 400, "code": "invalid", "message": "...",
               "fields": {"gpus": ["Ensure this value is greater than or equal to 1."]}}}
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.http import Http404, HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from queueing.errors import DomainError
from queueing.policy.states import IllegalTransition


def _flatten(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            # A list's errors by index (DRF's ListField): "volumes[1].mount_path".
            name = f"{prefix}[{key}]" if isinstance(key, int) and prefix else \
                f"{prefix}.{key}" if prefix else str(key)
            out.update(_flatten(value, name))
    elif isinstance(detail, list):
        if all(not isinstance(v, (dict, list)) for v in detail):
            out[prefix or "non_field_errors"] = [str(v) for v in detail]
        else:
            for i, value in enumerate(detail):
                out.update(_flatten(value, f"{prefix}[{i}]" if prefix else f"[{i}]"))
    else:
        out[prefix or "non_field_errors"] = [str(detail)]
    return out


def error_body(status_code: int, code: str, message: str,
               fields: dict[str, list[str]] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"status": status_code, "code": code, "message": message}
    if fields:
        body["fields"] = fields
    return {"error": body}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, DomainError):
        return Response(error_body(exc.status_code, exc.code, exc.message, exc.fields),
                        status=exc.status_code)
    if isinstance(exc, RequestDataTooBig):  # a body read whole (the idempotency fingerprint)
        return Response(error_body(413, "too_large", "The request body is too large."),
                        status=413)
    if isinstance(exc, IllegalTransition):
        return Response(error_body(409, "invalid_transition", str(exc)), status=409)
    if isinstance(exc, DjangoValidationError):
        # A model's full_clean() in a service (a unique or check rule): the caller's
        # input, so a 400 with the fields, never a 500.
        exc = exceptions.ValidationError(
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages})
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, exceptions.ValidationError):
        response.data = error_body(status.HTTP_400_BAD_REQUEST, "invalid",
                                   "The request has invalid fields.", _flatten(exc.detail))
    else:
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        code = getattr(detail, "code", None) or getattr(exc, "default_code", "error")
        response.data = error_body(response.status_code, str(code), str(detail))
    return response


@csrf_exempt  # no state changes: a POST to a wrong path must get JSON, not the CSRF page
def api_not_found(request: HttpRequest, *args: Any, **kwargs: Any) -> JsonResponse:
    """Unmatched /api/ paths: a JSON 404 in the one error shape."""
    return JsonResponse(error_body(404, "not_found", f"No API endpoint at {request.path}."),
                        status=404)
