"""The submit form's "Storage, secrets and metadata" section in a real browser:
closed until asked for, a hostile volume refused inline while typing (the service's
rule, on the volumes field), the job queued with its volumes, secrets, labels and
topology and shown on its page, and nothing wider than a phone."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from queueing.models import Job
from tests.conftest import World

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_member_fills_the_storage_section_and_the_job_page_shows_it(
        page: Any, world: World, shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    world.vision.allowed_pvcs = ["imagenet"]
    world.vision.allowed_secrets = ["hf-token"]
    world.vision.save()
    world.h100.topology_levels = [{"name": "rack", "node_label": "topology.kubernetes.io/rack"}]
    world.h100.save()
    login(page, "dave")
    page.goto("/jobs/new/")
    volumes = page.locator("textarea[name=volumes]")
    expect(volumes).to_be_hidden()  # the simple form stays simple
    page.get_by_text("Storage, secrets and metadata").click()
    expect(volumes).to_be_visible()
    expect(page.locator("#volumes-help")).to_contain_text("vision: imagenet")

    page.get_by_label("Name").fill("rn50-web")
    page.get_by_label("Container image").fill("ghcr.io/acme/train:1.4")
    page.get_by_label("GPU type").select_option("h100")
    page.get_by_label("GPUs per replica").fill("4")
    page.get_by_label("Container image").click()
    expect(page.locator("#preview")).to_contain_text("If submitted now")
    expect(volumes).to_be_visible()  # the live check's new form keeps the section open
    volumes.fill("- {name: root, hostPath: {path: /}, mount_path: /host}")
    page.get_by_label("Working directory").click()
    expect(page.locator("#volumes-errors")).to_contain_text("volumes[0].hostPath: Unknown field")
    expect(volumes).to_have_attribute("aria-invalid", "true")
    expect(page.locator("details#advanced")).to_have_attribute("open", "")

    volumes.fill("- {name: data, pvc: imagenet, mount_path: /data, read_only: true}")
    page.locator("textarea[name=secrets]").fill("- {secret: hf-token, key: token, env: HF_TOKEN}")
    page.locator("textarea[name=labels]").fill("experiment=rn50")
    page.get_by_label("Keep replicas within one").select_option("rack")
    page.get_by_label("Working directory").fill("/workspace")
    page.get_by_label("Replicas (gang size)").click()
    expect(page.locator("#preview")).to_contain_text("If submitted now")
    expect(page.locator("#volumes-errors")).to_be_empty()
    shoot(page, "submit-form-storage")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/\d+/$"))
    job = Job.objects.get(name="rn50-web")
    assert job.volumes[0]["pvc"] == "imagenet" and job.labels == {"experiment": "rn50"}
    expect(page.locator("#job-volumes")).to_contain_text("/data ← PVC imagenet")
    expect(page.locator("#job-secrets")).to_contain_text("HF_TOKEN ← key token of hf-token")
    expect(page.locator("#job-topology")).to_contain_text("one rack (required)")
    shoot(page, "job-detail-storage")

    page.set_viewport_size({"width": 390, "height": 844})
    for url in (f"/jobs/{job.pk}/", "/teams/vision/", f"/jobs/new/?from={job.pk}"):
        page.goto(url)
        overflow = page.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert overflow <= 0, f"{url} is {overflow}px wider than a phone"
    # "Edit and resubmit": the section open, filled with the job's own values.
    expect(page.locator("textarea[name=volumes]")).to_have_value(
        "- {name: data, pvc: imagenet, mount_path: /data, read_only: true}")
    shoot(page, "submit-form-storage-phone")
