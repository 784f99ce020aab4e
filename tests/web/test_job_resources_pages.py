"""Resources and /dev/shm on the web: the submit form takes them (the API's
rules, inline), the preview shows what each replica gets, the job page shows them,
resubmit keeps them, and team admins set the team's defaults and maxima on the team page."""

from __future__ import annotations

import re
from typing import Any

import pytest

from accounts.models import AuditEntry, Team
from queueing.models import Job
from tests.conftest import World
from tests.web.test_pages import form_body, login

pytestmark = pytest.mark.django_db

GI = 2**30


def test_the_form_queues_a_job_with_its_resources(world: World) -> None:
    r = login(world.member).post("/jobs/new/", form_body(
        cpu="8", memory="64Gi", ephemeral_storage="100Gi", shm_size="16Gi"))
    assert r.status_code == 302, r.content.decode()
    job = Job.objects.get()
    assert job.resources == {"cpu": "8", "memory": "64Gi", "ephemeral_storage": "100Gi"}
    assert job.shm_size == "16Gi"
    assert (job.cpu_millicores, job.memory_bytes, job.shm_size_bytes) == (8000, 64 * GI, 16 * GI)
    html = login(world.member).get(f"/jobs/{job.pk}/").content.decode()
    assert "Per replica" in html and "memory 64Gi" in html and "/dev/shm 16Gi" in html
    assert "ephemeral storage 100Gi" in html  # in words, as the form names it


@pytest.mark.parametrize(("field", "value", "message"), [
    ("cpu", "-2", "Must be positive"),
    ("memory", "lots", "Not a Kubernetes quantity"),
    ("ephemeral_storage", "2Ei", "At most 1Ei"),
    ("shm_size", "0", "at least 1 byte"),
])
def test_bad_quantities_are_reported_inline_on_their_field(
        world: World, field: str, value: str, message: str) -> None:
    r = login(world.member).post("/jobs/new/check/", form_body(**{field: value}))
    html = r.content.decode()
    assert message in html, html
    assert f'id="{field}-errors"' in html and 'aria-invalid="true"' in html
    r = login(world.member).post("/jobs/new/", form_body(**{field: value}))
    assert r.status_code == 400 and not Job.objects.exists()


def test_above_the_teams_maximum_is_reported_on_the_field(world: World) -> None:
    world.vision.max_memory_bytes = 32 * GI
    world.vision.save()
    r = login(world.member).post("/jobs/new/", form_body(memory="64Gi"))
    assert r.status_code == 400 and b"team vision&#x27;s maximum" in r.content
    assert not Job.objects.exists()


def test_the_preview_shows_what_each_replica_gets_with_the_teams_defaults(
        world: World) -> None:
    world.vision.default_shm_size_bytes = 4 * GI
    world.vision.save()
    html = login(world.member).post("/jobs/new/check/", form_body(cpu="2")).content.decode()
    assert "If submitted now" in html
    # Memory: the platform's default per GPU (every pod has a memory limit).
    assert re.search(r"Each replica gets cpu 2, memory \d+Gi, /dev/shm 4Gi", html), html


def test_resubmit_and_submit_again_keep_the_resources(world: World) -> None:
    c = login(world.member)
    c.post("/jobs/new/", form_body(cpu="500m", shm_size="1Gi"))
    job = Job.objects.get()
    html = c.get(f"/jobs/new/?from={job.pk}").content.decode()
    assert 'value="500m"' in html and 'value="1Gi"' in html
    c.post(f"/jobs/{job.pk}/resubmit/")
    copy = Job.objects.exclude(pk=job.pk).get()
    # With the memory every job gets (the platform's default, stored on the job).
    assert job.resources == {"cpu": "500m", "memory": "64Gi"}
    assert copy.resources == job.resources and copy.shm_size_bytes == GI


def _resources_form(**values: str) -> dict[str, Any]:
    keys = ("default_cpu", "max_cpu", "default_memory", "max_memory",
            "default_ephemeral_storage", "max_ephemeral_storage", "default_shm_size",
            "max_shm_size")
    return {k: values.get(k, "") for k in keys}


def test_a_team_admin_sets_the_teams_resources_on_the_team_page_audited(world: World) -> None:
    c = login(world.admin)
    assert "Save resources" in c.get("/teams/vision/").content.decode()
    r = c.post("/teams/vision/resources/", _resources_form(default_cpu="2", max_memory="1Ti"))
    assert r.status_code == 302
    team = Team.objects.get(slug="vision")
    assert team.default_cpu_millicores == 2000 and team.max_memory_bytes == 2**40
    assert AuditEntry.objects.filter(object_type="accounts.Team", action="update").exists()
    html = c.get("/teams/vision/").content.decode()
    assert 'value="1Ti"' in html


def test_the_team_page_refuses_a_bad_quantity_on_its_field(world: World) -> None:
    r = login(world.admin).post("/teams/vision/resources/",
                                _resources_form(default_cpu="8", max_cpu="4"))
    assert r.status_code == 400 and b"above the maximum" in r.content
    assert Team.objects.get(slug="vision").max_cpu_millicores is None


def test_members_see_the_teams_resources_but_cannot_set_them(world: World) -> None:
    c = login(world.member)
    html = c.get("/teams/vision/").content.decode()
    assert "Resources per replica" in html and "Save resources" not in html
    assert c.post("/teams/vision/resources/", _resources_form(max_cpu="1")).status_code == 403
    assert Team.objects.get(slug="vision").max_cpu_millicores is None


def test_a_refusal_without_a_field_is_shown_on_the_team_page(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page shows a service's refusal whole, field or not (the shared _form_errors)."""
    from queueing.errors import DomainError
    from queueing.web import views

    def refuse(**_: object) -> None:
        raise DomainError("The team's policy is being changed by someone else.")

    monkeypatch.setattr(views, "team_resources_set", refuse)
    r = login(world.admin).post("/teams/vision/resources/", _resources_form(default_cpu="2"))
    assert r.status_code == 400 and b"being changed by someone else" in r.content
