"""OpenAPI post-processing: the one error shape and the `Idempotency-Key` header, added to
every operation once here instead of on every view; closed request bodies for the
serializers that refuse unknown fields (queueing/api/strict.py); each operation's own
summary and description (`FairqAutoSchema`) and a description for every response."""

from __future__ import annotations

import inspect
import re
from typing import Any

from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerExtension,
)
from drf_spectacular.openapi import AutoSchema


class FairqAutoSchema(AutoSchema):
    """Each operation described by its own handler's docstring (`get`, `post`, `list`,
    an `@action`, ...), else by its view class's *own* docstring, never by one inherited
    from a base class: drf-spectacular's default takes `inspect.getdoc(view class)`, which
    walks the bases, so every view without a docstring showed `IdempotentPostMixin`'s
    ("Mix into an APIView ...") on all its operations. The summary is the description's
    first sentence. `tests/api/test_schema_descriptions.py` fails when an operation has no
    description of its own."""

    def _handler_doc(self) -> str:
        name = getattr(self.view, "action", None) or self.method.lower()
        handler = getattr(self.view, name, None)
        doc = getattr(handler, "__doc__", None)
        return inspect.cleandoc(doc) if doc else ""

    def get_description(self) -> str:  # type: ignore[override]
        own = type(self.view).__dict__.get("__doc__")
        return self._handler_doc() or (inspect.cleandoc(own) if own else "")

    def get_summary(self) -> str | None:
        return first_sentence(self.get_description()) or None


def first_sentence(text: str) -> str:
    """The text up to its first full stop followed by a space or the end, on one line."""
    flat = " ".join(text.split())
    match = re.match(r"(.+?[.!?])(\s|$)", flat)
    return (match.group(1) if match else flat)[:120]

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "The one error shape of API v1 (queueing/api/errors.py).",
    "properties": {
        "error": {
            "type": "object",
            "properties": {
                "status": {"type": "integer"},
                "code": {"type": "string"},
                "message": {"type": "string"},
                "fields": {
                    "type": "object",
                    "additionalProperties": {"type": "array", "items": {"type": "string"}},
                },
            },
            "required": ["status", "code", "message"],
        }
    },
    "required": ["error"],
}

_ERRORS: dict[str, str] = {
    "400": "Invalid request (see error.fields).",
    "401": "No or invalid credentials.",
    "403": "Not allowed for this user.",
    "404": "Not found, or not visible to this user.",
    "429": "Rate limited; retry after the Retry-After header's seconds.",
}
_POST_ERRORS: dict[str, str] = {
    "409": "Conflict with the current state (or the same Idempotency-Key still in progress).",
    "422": "The Idempotency-Key was used before for a different request.",
}
_BODY_ERRORS: dict[str, str] = {
    "413": "The body is over the size limit (DATA_UPLOAD_MAX_MEMORY_SIZE).",
    "415": "The body is not JSON (API v1 takes JSON bodies only).",
}
IDEMPOTENCY_PARAMETER: dict[str, Any] = {
    "in": "header",
    "name": "Idempotency-Key",
    "required": False,
    "schema": {"type": "string", "maxLength": 200},
    "description": "Retrying a POST with the same key returns the first response instead of "
    "doing the work again (for a day; per user).",
}


def add_errors_and_idempotency(result: dict[str, Any], generator: Any, request: Any,
                               public: bool) -> dict[str, Any]:
    """drf-spectacular POSTPROCESSING_HOOK."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for path, path_item in result.get("paths", {}).items():
        for method, operation in path_item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            if path.endswith("/{slug}/resources/"):  # the same view as workload-policy/
                operation["deprecated"] = True
                operation["summary"] = f"{operation.get('summary', '')} (old path)".strip()
                operation["description"] = (
                    "The former path of `/api/v1/teams/{slug}/workload-policy/`, kept for "
                    "old clients: the same operation. " + operation.get("description", ""))
            responses = operation.setdefault("responses", {})
            errors = dict(_ERRORS)
            if method == "post":
                errors.update(_POST_ERRORS)
                if "201" in responses and "200" not in responses:
                    responses["200"] = {
                        **responses["201"],
                        "description": "A replay (same Idempotency-Key) of an earlier 201.",
                    }
                params = operation.setdefault("parameters", [])
                if not any(p.get("name") == "Idempotency-Key" for p in params):
                    params.append(IDEMPOTENCY_PARAMETER)
            if method in {"delete", "patch"}:  # e.g. the last-admin rule on memberships
                errors["409"] = _POST_ERRORS["409"]
            if "requestBody" in operation:
                errors.update(_BODY_ERRORS)
            for code, description in errors.items():
                responses.setdefault(code, {"description": description, **ref})
            for code, response in responses.items():
                if not response.get("description"):
                    response["description"] = _success_description(method, code, responses)
            if method == "get":
                responses.setdefault("304", {"description": "Not modified (If-None-Match)."})
    return result


def _success_description(method: str, code: str, responses: dict[str, Any]) -> str:
    """A description for a success response the view did not describe."""
    if code == "201":
        return "Created; the `Location` header names the new resource."
    if code == "204":
        return "Done; no body."
    if method == "get":
        return "OK: the resource or list below."
    if method == "post" and "201" in responses:
        return ("An existing one changed (nothing created), or a replay (same "
                "Idempotency-Key) of an earlier 201.")
    if method == "delete":
        return "Done: the resource as it is now."
    return "OK: the resource as it is now."


class TokenAuthenticationScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """`Authorization: Token fq_<prefix>_<secret>` or `Bearer fq_<prefix>_<secret>` in the
    schema and in Swagger UI: two schemes, either one will do."""

    target_class = "accounts.authentication.TokenAuthentication"
    name = ["tokenAuth", "bearerAuth"]

    def get_security_requirement(self, auto_schema: Any) -> list[dict[str, list[Any]]]:
        return [{"tokenAuth": []}, {"bearerAuth": []}]  # either (OR)

    def get_security_definition(self, auto_schema: Any) -> list[dict[str, Any]]:
        return [
            {"type": "apiKey", "in": "header", "name": "Authorization",
             "description": "`Token fq_<prefix>_<secret>` (see `fairq` CLI docs)."},
            {"type": "http", "scheme": "bearer",
             "description": "`Bearer fq_<prefix>_<secret>`: the same API token."},
        ]


class StrictFieldsScheme(OpenApiSerializerExtension):  # type: ignore[no-untyped-call]
    """Request bodies of serializers with StrictFieldsMixin are closed
    (`additionalProperties: false`): unknown fields are refused (queueing/api/strict.py).
    Responses stay open, so clients tolerate fields added later."""

    target_class = "queueing.api.strict.StrictFieldsMixin"
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> Any:
        schema = auto_schema._map_basic_serializer(self.target, direction)
        if direction == "request":
            schema["additionalProperties"] = False
        return schema


class CheckpointTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    """`Authorization: Bearer fqc.<signed>`: one attempt's FAIRQ_CHECKPOINT_TOKEN, taken
    only by `POST /jobs/{id}/checkpoints/` (docs/api.md, "Checkpoints")."""

    target_class = "queueing.api.checkpoints.CheckpointTokenAuthentication"
    name = "checkpointToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {"type": "http", "scheme": "bearer",
                "description": "The attempt's FAIRQ_CHECKPOINT_TOKEN (`fqc.…`), set in its "
                               "pods' environment; a user's API token is refused (403)."}
