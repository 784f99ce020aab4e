"""Every error `code` the API can answer is listed in docs/api.md ("One error shape"):
the codes are collected from the code that emits them, not from a list kept by hand."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from rest_framework import exceptions as drf_exceptions

import queueing.api.urls  # noqa: F401  # loads every view, so every DomainError subclass
from queueing.errors import DomainError
from tests.conftest import World

ROOT = Path(__file__).resolve().parents[2]
# `error_body(413, "too_large", ...)`: a code written where the answer is made.
_LITERAL = re.compile(r'error_body\(\s*(?:\d+|[\w.]+),\s*"(\w+)"')


def _subclasses(cls: type) -> set[type]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_subclasses(sub)}
    return out


def emitted_codes() -> set[str]:
    """The codes of queueing/api/errors.py's handler: a DomainError's `code`; DRF's
    exceptions' `default_code` (the handler keeps it; a ValidationError is `invalid`);
    the literal codes of every `error_body(...)` call (middleware, handler, 404 view)."""
    codes = {c.code for c in {DomainError, *_subclasses(DomainError)}}
    for _, cls in inspect.getmembers(drf_exceptions, inspect.isclass):
        if issubclass(cls, drf_exceptions.APIException) and cls is not drf_exceptions.APIException:
            codes.add("invalid" if cls is drf_exceptions.ValidationError else cls.default_code)
    for path in [*ROOT.joinpath("queueing").rglob("*.py"), *ROOT.joinpath("accounts").rglob("*.py")]:
        codes |= set(_LITERAL.findall(path.read_text()))
    return codes


def documented_codes() -> set[str]:
    text = ROOT.joinpath("docs/api.md").read_text()
    section = text.split("## One error shape", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"`([a-z_]+)`", section))


def test_every_error_code_the_api_can_emit_is_in_docs_api_md() -> None:
    codes = emitted_codes()
    # The collector finds what it must (so it cannot pass by finding nothing).
    assert {"invalid", "parse_error", "too_large", "not_found", "throttled",
            "idempotency_key_reused", "not_acceptable", "invalid_transition"} <= codes
    missing = sorted(codes - documented_codes())
    assert not missing, f"docs/api.md does not list these error codes: {missing}"


def test_parse_error_and_not_acceptable_are_answered_as_documented(world: World) -> None:
    client = world.client(world.member)
    r = client.generic("POST", "/api/v1/jobs/", "{not json", content_type="application/json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "parse_error"
    r = client.get("/api/v1/jobs/", HTTP_ACCEPT="text/csv")
    assert r.status_code == 406 and r.json()["error"]["code"] == "not_acceptable"
