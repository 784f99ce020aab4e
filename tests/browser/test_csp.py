"""The pages under their Content-Security-Policy (config/settings/base.py; docs/deployment.md,
"Content-Security-Policy") in headless Chromium: every page carries the header, scripts
only from fairq's own files, and the browser reports no violation while htmx, the
charts, the confirmations and the submit form's advanced section work."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.utils import timezone

from queueing.models import Job, JobState
from tests.conftest import World
from tests.factories import JobFactory

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

# Every `securitypolicyviolation` the document raises, kept for the test to read (an init
# script is the browser's own, outside the page's policy).
WATCH = """
window.__csp = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__csp.push(e.violatedDirective + " " + (e.blockedURI || "inline") + " at " +
                    e.sourceFile + ":" + e.lineNumber);
});
"""


def _watched(page: Any) -> list[str]:
    """Console messages about the policy; the page's own report is read per page."""
    said: list[str] = []
    page.add_init_script(WATCH)
    page.on("console", lambda m: said.append(m.text)
            if "Content Security Policy" in m.text else None)
    return said


def _policy(response: Any) -> dict[str, list[str]]:
    header = response.headers.get("content-security-policy")
    assert header, f"no Content-Security-Policy on {response.url}"
    return {part.split()[0]: part.split()[1:] for part in header.split(";") if part.strip()}


def _open(page: Any, path: str) -> dict[str, list[str]]:
    response = page.goto(path)
    assert response is not None and response.status == 200, (path, response and response.status)
    page.wait_for_load_state("networkidle")
    violations = page.evaluate("window.__csp")
    assert violations == [], (path, violations)
    return _policy(response)


def test_every_page_carries_the_policy_and_breaks_none_of_it(page: Any, world: World) -> None:
    said = _watched(page)
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                     submitter=world.staff, name="csp-check")
    world.staff.is_superuser = True  # the admin's lists too
    world.staff.save(update_fields=["is_superuser"])
    login(page, "root")
    for path in ("/", "/jobs/", "/jobs/new/", f"/jobs/{job.pk}/", "/teams/vision/",
                 "/reports/", "/cluster/", "/quotas/", "/admin/", "/admin/queueing/job/",
                 "/api/v1/docs/"):
        policy = _open(page, path)
        assert policy["script-src"] == ["'self'"], (path, policy)
        assert "'unsafe-inline'" not in policy.get("default-src", []), path
        assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    # Swagger UI drew the schema from its script file (the split view).
    page.goto("/api/v1/docs/")
    page.wait_for_selector(".swagger-ui .info .title", timeout=15_000)
    assert "fairq API" in page.locator(".swagger-ui .info .title").inner_text()
    assert said == [], said


def test_the_pages_work_under_the_policy(page: Any, world: World, cycle: Any) -> None:
    """htmx's live check and polling, the confirmation before a cancel (once inline
    `onsubmit`, now static/js/fairq.js) and the advanced section kept open (once inline
    `ontoggle`): all with scripts only from fairq's files."""
    from playwright.sync_api import expect

    said = _watched(page)
    login(page, "dave")
    assert _open(page, "/jobs/new/")["script-src"] == ["'self'"]
    # The advanced section records that it is open (its hidden field), for the live
    # check's swap of the form.
    kept = page.locator("input[name=advanced_open]")
    assert kept.input_value() == ""
    page.get_by_text("Storage, secrets and metadata").click()
    expect(kept).to_have_value("1")
    page.get_by_text("Storage, secrets and metadata").click()
    expect(kept).to_have_value("")
    # htmx's live check (a POST with the CSRF header fairq.js adds) answers in place.
    page.get_by_label("Name").fill("Bad_Name")
    page.get_by_label("Container image").click()
    expect(page.locator("#name-errors")).to_contain_text("lower-case letters")
    page.get_by_label("Name").fill("csp-job")
    page.get_by_label("Container image").fill("ghcr.io/acme/train:1.4")
    page.get_by_label("Command").fill("python train.py")
    page.get_by_label("GPU type").select_option("h100")
    page.get_by_label("GPUs per replica").fill("1")
    page.get_by_label("Replicas (gang size)").click()
    expect(page.locator("#preview")).to_contain_text("the next scheduling cycle admits it")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = Job.objects.get(name="csp-job")
    expect(page.locator("#job-status")).to_have_text("QUEUED")
    # The page polls: the cycle's admission shows without a reload.
    now = timezone.now()
    cycle(now)
    cycle(now)
    expect(page.locator("#job-status")).to_have_text(re.compile("ADMITTED|RUNNING"),
                                                     timeout=10_000)
    # The confirmation: dismissed, nothing happens; accepted, the job is cancelled.
    asked: list[str] = []

    def answer(accept: bool) -> Any:
        def on_dialog(dialog: Any) -> None:
            asked.append(dialog.message)
            dialog.accept() if accept else dialog.dismiss()
        return on_dialog

    page.once("dialog", answer(False))
    page.get_by_role("button", name="Cancel job").click()
    page.wait_for_timeout(300)
    job.refresh_from_db()
    assert job.status != JobState.CANCELLED
    page.once("dialog", answer(True))
    page.get_by_role("button", name="Cancel job").click()
    expect(page.locator("#job-status")).to_have_text("CANCELLED")
    assert asked == [f"Cancel job #{job.pk}?"] * 2
    assert page.evaluate("window.__csp") == []
    assert said == [], said
