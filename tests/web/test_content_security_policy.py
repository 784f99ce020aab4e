"""The Content-Security-Policy header (django-csp; config/settings/base.py) on the pages,
the error pages, Swagger UI and the API, and the templates it asks for: no inline script
and no event-handler attribute anywhere in templates/ (the browser would refuse them:
tests/browser/test_csp.py shows the pages working under the policy)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from tests.conftest import World
from tests.factories import JobFactory

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def _policy(response: Any) -> dict[str, list[str]]:
    header = response.headers.get("Content-Security-Policy")
    assert header, f"no Content-Security-Policy ({response.status_code})"
    return {part.split()[0]: part.split()[1:] for part in header.split(";") if part.strip()}


@pytest.mark.django_db
def test_every_page_carries_a_policy_without_inline_scripts(world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                     submitter=world.member, name="csp")
    c = Client()
    assert _policy(c.get("/accounts/login/"))["script-src"] == ["'self'"]
    c.force_login(world.member)
    for path in ("/", "/jobs/", "/jobs/new/", f"/jobs/{job.pk}/", "/teams/vision/",
                 "/reports/", "/api/v1/docs/", "/no-such-page/"):
        r = c.get(path)
        assert r.status_code in (200, 404), (path, r.status_code)
        policy = _policy(r)
        assert policy["script-src"] == ["'self'"], (path, policy)
        assert policy["default-src"] == ["'self'"]
        assert policy["object-src"] == ["'none'"]
        assert policy["frame-ancestors"] == ["'none'"]
        assert policy["base-uri"] == ["'self'"] and policy["form-action"] == ["'self'"]
        if r["Content-Type"].startswith("text/html"):
            html = r.content.decode()
            inline = [m for m in re.findall(r"<script\b[^>]*>", html)
                      if "src=" not in m and 'type="application/json"' not in m]
            assert inline == [], (path, inline)
            assert not re.search(r"\son[a-z]+=", html), path
    # Swagger UI's script is a file of its own (the split view), not inline.
    assert b"?script" in c.get("/api/v1/docs/").content
    r = c.get("/api/v1/docs/?script")
    assert r.status_code == 200 and r["Content-Type"].startswith("application/javascript")


@pytest.mark.django_db
def test_the_api_answers_carry_the_policy_too(world: World) -> None:
    r = world.client(world.member).get("/api/v1/tiers/")
    assert r.status_code == 200
    assert _policy(r)["script-src"] == ["'self'"]


def test_no_template_has_an_inline_script_or_handler() -> None:
    """`<script>` only with `src` (or a JSON data block, `json_script`), and no `on…=`
    attribute: script-src 'self' would refuse them and the page would silently lose
    what they did (a confirmation before a cancel, once)."""
    found: list[str] = []
    for path in sorted(TEMPLATES.rglob("*.html")):
        text = path.read_text()
        for tag in re.findall(r"<script\b[^>]*>", text):
            if "src=" not in tag:
                found.append(f"{path.relative_to(TEMPLATES)}: {tag}")
        for handler in re.findall(r"\s(on[a-z]+)=", text):
            found.append(f"{path.relative_to(TEMPLATES)}: {handler}=")
        if re.search(r"href=\"javascript:", text):
            found.append(f"{path.relative_to(TEMPLATES)}: javascript: URL")
    assert found == []
