"""Swagger: every operation of the generated schema has its own summary and
description (none borrowed from a base class's docstring, as 11 operations showed
`IdempotentPostMixin`'s), and every response has a description."""

from __future__ import annotations

import io
from collections import defaultdict
from typing import Any

import pytest
import yaml
from django.core.management import call_command

from queueing.api.schema import first_sentence

METHODS = {"get", "post", "put", "patch", "delete"}


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    out = io.StringIO()
    call_command("spectacular", stdout=out, settings="config.settings.test")
    return dict(yaml.safe_load(out.getvalue()))


def _operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method.upper(), path, op) for path, item in schema["paths"].items()
            for method, op in item.items() if method in METHODS]


def test_every_operation_has_its_own_summary_and_description(schema: dict[str, Any]) -> None:
    ops = _operations(schema)
    assert len(ops) > 30
    by_description: dict[str, list[str]] = defaultdict(list)
    for method, path, op in ops:
        name = f"{method} {path}"
        assert op.get("summary"), f"{name} has no summary"
        description = (op.get("description") or "").strip()
        assert description, f"{name} has no description"
        assert "Mix into an APIView" not in description, f"{name}: a mixin's docstring"
        by_description[description].append(name)
    shared = {d[:60]: names for d, names in by_description.items() if len(names) > 1}
    assert not shared, f"operations sharing one description: {shared}"


def test_every_response_is_described(schema: dict[str, Any]) -> None:
    for method, path, op in _operations(schema):
        for code, response in op["responses"].items():
            assert (response.get("description") or "").strip(), f"{method} {path} {code}"
        if "201" in op["responses"]:
            assert "Location" in op["responses"]["201"]["description"], (method, path)


def test_the_submit_and_the_list_describe_themselves(schema: dict[str, Any]) -> None:
    jobs = schema["paths"]["/api/v1/jobs/"]
    assert jobs["post"]["summary"].startswith("Submit a job")
    assert "position" in jobs["get"]["description"] and "rule E5" in jobs["get"]["description"]
    props = schema["components"]["schemas"]["JobList"]["properties"]
    assert {"position", "jobs_ahead", "reason"} <= set(props)


@pytest.mark.parametrize(("text", "first"), [
    ("Cancel a job. It stops.", "Cancel a job."),
    ("One line\n  wrapped here. Then more.", "One line wrapped here."),
    ("No full stop", "No full stop"),
    ("Rules e.g.x apply. Next.", "Rules e.g.x apply."),
])
def test_the_summary_is_the_first_sentence(text: str, first: str) -> None:
    assert first_sentence(text) == first
