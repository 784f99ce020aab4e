"""The web: the job page shows its array (a link to the array's members), its
dependencies with whether each is met, and its attempts; the submit form takes
dependencies in Slurm's syntax."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from queueing.models import Job
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World, job_body

pytestmark = pytest.mark.django_db


def login(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


def form_body(**overrides: Any) -> dict[str, Any]:
    body = {
        "team": "vision",
        "name": "train",
        "image": "ghcr.io/acme/train:1.4",
        "command": "python train.py",
        "gpu_type": "h100",
        "gpus": "1",
        "replicas": "1",
        "tier": "normal",
    }
    body.update(overrides)
    return body


def test_the_submit_form_takes_dependencies_in_slurm_syntax(world: World) -> None:
    api = world.client(world.member)
    first = api.post("/api/v1/jobs/", job_body(name="first"), format="json").json()["id"]
    array = api.post("/api/v1/jobs/bulk/", {**job_body(name="shard"), "count": 2}, format="json").json()[
        "array_id"
    ]
    c = login(world.member)
    r = c.post("/jobs/new/", form_body(dependencies=f"afterok:{first},afterany:a{array}"))
    assert r.status_code == 302, r.content.decode()[:2000]
    job = Job.objects.get(name="train")
    assert job.dependencies == [{"type": "after_ok", "job": first}, {"type": "after_any", "array": array}]
    r = c.post("/jobs/new/", form_body(name="other", dependencies="afterok:999999"))
    assert r.status_code == 400
    assert "Unknown job 999999, or not of team vision." in r.content.decode()
    r = c.post("/jobs/new/", form_body(name="other", dependencies="after:1"))
    assert r.status_code == 400 and "afterok, afterany, afternotok" in r.content.decode()
    assert not Job.objects.filter(name="other").exists()


def test_the_job_page_shows_array_dependencies_and_attempts(world: World) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    api = world.client(world.member)
    out = api.post(
        "/api/v1/jobs/bulk/",
        {**job_body(name="shard", env={"FAIRQ_SIM_SECONDS": "5"}), "count": 3, "max_running": 2},
        format="json",
    ).json()
    merge = api.post(
        "/api/v1/jobs/",
        job_body(name="merge", dependencies=[{"type": "after_ok", "array": out["array_id"]}]),
        format="json",
    ).json()["id"]
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    scheduler_cycle(now=t0 + timedelta(seconds=6))
    c = login(world.member)
    html = c.get(f"/jobs/{out['ids'][0]}/").content.decode()
    assert f'href="/jobs/?array={out["array_id"]}"' in html
    assert "member 0 of 0..2, at most 2 running at once" in html
    assert 'id="attempts-table"' in html and "succeeded" in html
    html = c.get(f"/jobs/{merge}/").content.decode()
    assert 'id="job-dependencies"' in html and "after_ok" in html and "waiting" in html
    assert 'id="attempts-table"' not in html  # never admitted: no attempts
    listed = c.get(f"/jobs/?array={out['array_id']}").content.decode()
    assert "shard-0" in listed and "merge" not in listed
