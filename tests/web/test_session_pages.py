"""Notebook sessions on the web (docs/dashboard.md, "Notebook sessions"): the "Start a
notebook" form (fractions first, refusals on their fields), "My sessions" on the
dashboard with Open and Stop, the session page with its idle banner; the token never
in a page."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.composition import reset_backends
from queueing.models import Job, NotebookSession
from queueing.services.scheduler import scheduler_cycle
from queueing.services.sessions import notebook_token
from tests.conftest import World
from tests.factories import GpuTypeFactory
from tests.web.test_pages import login

pytestmark = pytest.mark.django_db


@pytest.fixture
def shared(world: World, settings: Any) -> None:
    settings.FAIRQ_SIM_NODES = "2x8xh100,2x8xa100,1x7xmig-1g-10gb,2x4xt4-shared"
    reset_backends()
    GpuTypeFactory(slug="t4-shared", resource_name="nvidia.com/gpu.shared",
                   sharing="time-sliced", slices_per_gpu=4)
    world.vision.allowed_pvcs = ["home"]
    world.vision.save()


def form(**over: Any) -> dict[str, Any]:
    body = {"team": "vision", "gpu": "t4-shared:f1/4", "pvc": "home", "hours": "2",
            "idle_minutes": "45", "image": ""}
    body.update(over)
    return body


def test_the_form_offers_fractions_first_and_says_no_memory_isolation(world: World,
                                                                     shared: None) -> None:
    page = login(world.member).get("/sessions/new/").content.decode()
    first = page.index('value="t4-shared:f1/4"')
    assert first < page.index('value="a100:g1"')
    assert "1/4 of one t4-shared GPU (time-sliced, no memory isolation)" in page
    assert '<option value="home">home</option>' in page
    # the simulated cluster of the tests runs no notebook servers, and says so
    assert "FAIRQ_SIM_NOTEBOOKS is off" in page


def test_starting_from_the_form_and_the_session_page(world: World, shared: None) -> None:
    r = login(world.member).post("/sessions/new/", form())
    assert r.status_code == 302, r.content.decode()[:2000]
    s = NotebookSession.objects.get()
    assert r["Location"] == f"/sessions/{s.job_id}/"
    job = Job.objects.get(pk=s.job_id)
    assert (job.gpu_slices, job.max_runtime_seconds, s.idle_limit_minutes) == (1, 7200, 45)
    page = login(world.member).get(f"/sessions/{job.pk}/").content.decode()
    assert "Opens once it runs." in page and "1/4 t4-shared" in page
    assert "on PVC home (kept after the session)" in page
    now = timezone.now()
    scheduler_cycle(now=now)
    scheduler_cycle(now=now + timedelta(seconds=1))
    page = login(world.member).get(f"/sessions/{job.pk}/").content.decode()
    assert f'href="/sessions/{job.pk}/lab/"' in page and "Open JupyterLab" in page
    assert notebook_token(job_id=job.pk, attempt=job.attempt) not in page
    # a team admin sees it, may stop it, may not open it
    admin = login(world.admin).get(f"/sessions/{job.pk}/").content.decode()
    assert "Only its owner (and staff) may open it." in admin
    assert login(world.outsider).get(f"/sessions/{job.pk}/").status_code == 404


def test_refusals_land_on_their_fields(world: World, shared: None) -> None:
    r = login(world.member).post("/sessions/new/", form(gpu="a100:g1", hours="30"))
    assert r.status_code == 200
    page = r.content.decode()
    assert "Between 60 seconds and 86400" in page
    assert not NotebookSession.objects.exists()


def test_my_sessions_on_the_dashboard_with_open_stop_and_the_banner(world: World,
                                                                    shared: None) -> None:
    login(world.member).post("/sessions/new/", form())
    s = NotebookSession.objects.get()
    now = timezone.now()
    scheduler_cycle(now=now)
    scheduler_cycle(now=now + timedelta(seconds=1))
    NotebookSession.objects.filter(pk=s.pk).update(idle_since=now - timedelta(minutes=36),
                                                   warned_at=now)
    page = login(world.member).get("/").content.decode()
    assert "My sessions" in page and "Start a notebook" in page
    assert f'href="/sessions/{s.job_id}/lab/"' in page and ">Open</a>" in page
    assert "Idle 36 min: stops at" in page and "unless you use it (rule N2)" in page
    assert "36/45 min" in page
    detail = login(world.member).get(f"/sessions/{s.job_id}/").content.decode()
    assert 'id="idle-banner"' in detail and "Idle for 36 minutes." in detail
    # the admin's dashboard lists their own sessions only
    assert f'href="/sessions/{s.job_id}/"' not in login(world.admin).get("/").content.decode()
    r = login(world.member).post(f"/sessions/{s.job_id}/stop/", {"back": "dashboard"})
    assert r.status_code == 302 and r["Location"] == "/"
    assert Job.objects.get(pk=s.job_id).status == "CANCELLED"
    page = login(world.member).get("/").content.decode()
    assert ">Open</a>" not in page and "cancelled" in page
