"""The submit form's "Or else" GPU types in a real browser: a type that does not exist
refused inline while typing (the service's rule, on that field), the job queued
accepting h100 then a100, its page saying it waits for one of them, and once admitted on
a100 the type chosen."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from queueing.models import Job
from tests.conftest import World

from .conftest import DB_LOCK, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _admit_on_a100(job: Job) -> None:
    """Admit `job` on an a100 node, as the planner of several types may choose."""
    from queueing.composition import get_backend
    from queueing.policy.admission import Admission, Plan
    from queueing.services.scheduler import apply_plan

    node = next(n.name for n in get_backend().nodes() if n.gpu_type == "a100")
    with DB_LOCK, transaction.atomic():
        apply_plan(plan=Plan(admissions=(Admission(job_id=job.pk, team="vision",
                                                   gpu_type="a100", placement=(node,)),),
                             waits={}), now=timezone.now())


def test_member_submits_a_job_of_two_gpu_types_and_its_page_names_the_chosen_one(
        page: Any, world: World, shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    login(page, "dave")
    page.goto("/jobs/new/")
    page.get_by_label("Name").fill("eval-any")
    page.get_by_label("Container image").fill("ghcr.io/acme/train:1.4")
    page.get_by_label("GPU type").select_option("h100")
    others = page.get_by_label("Or else")
    others.fill("a100, tpu-v5")
    page.get_by_label("GPUs per replica").fill("4")
    page.get_by_label("Container image").click()
    expect(page.locator("#gpu_types-errors")).to_contain_text("Unknown GPU type 'tpu-v5'")
    expect(others).to_have_attribute("aria-invalid", "true")
    shoot(page, "submit-form-gpu-types-refused")
    others.fill("a100")
    page.get_by_label("Container image").click()
    expect(page.locator("#preview")).to_contain_text("If submitted now")
    expect(page.locator("#gpu_types-errors")).to_be_empty()
    shoot(page, "submit-form-gpu-types")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = Job.objects.get(name="eval-any")
    assert (job.gpu_type.slug, job.gpu_types) == ("h100", ["h100", "a100"])
    expect(page.locator("#job-gpu-types")).to_contain_text(
        "h100, a100 (most preferred first): waits for one of them")
    shoot(page, "job-detail-gpu-types-queued")

    # Admitted on a100 (the plan's choice, as the planner of several types makes it).
    _admit_on_a100(job)
    page.reload()
    expect(page.locator("#job-gpu-types")).to_contain_text("runs on a100, chosen when admitted")
    expect(page.get_by_text("1 × 4 a100 (4 in all)")).to_be_visible()
    shoot(page, "job-detail-gpu-types-admitted")
    page.goto(f"/jobs/new/?from={job.pk}")  # edit and resubmit keeps the types
    expect(page.get_by_label("GPU type")).to_have_value("h100")
    expect(page.get_by_label("Or else")).to_have_value("a100")


def test_cluster_page_counts_a_job_of_two_types_as_any_of_then_where_it_runs(
        page: Any, world: World, shoot: Callable[[Any, str], Any]) -> None:
    """The capacity table of /cluster/: queued, a job accepting h100 or a100 shows under
    both types as "any of"; admitted on a100, it is held there and under h100 no more."""
    from playwright.sync_api import expect

    with DB_LOCK:
        r = world.client(world.member).post("/api/v1/jobs/", {
            "name": "eval-any", "team": "vision", "image": "ghcr.io/acme/train:1.4",
            "gpu_types": ["h100", "a100"], "gpus": 4}, format="json")
        assert r.status_code == 201, r.json()
    job = Job.objects.get(name="eval-any")
    login(page, "root")
    page.goto("/cluster/")
    table = page.locator("section[aria-labelledby=ccap-h] table").first
    expect(table).to_contain_text("Queued, any of several types")
    for gpu in ("h100", "a100"):
        expect(table.locator("tr", has_text=gpu).first).to_contain_text("4 any of")
    shoot(page, "cluster-capacity-any-of-queued")
    _admit_on_a100(job)
    page.reload()
    table = page.locator("section[aria-labelledby=ccap-h] table").first
    expect(table.locator("tbody")).not_to_contain_text("any of")
    shoot(page, "cluster-capacity-any-of-admitted")
