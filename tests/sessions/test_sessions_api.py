"""`/api/v1/sessions/` (docs/api.md, "Notebook sessions"): start with validation, the
per-user limits, list and detail, stop; the token never in an answer or event."""

from __future__ import annotations

from typing import Any

import pytest

from queueing.composition import reset_backends
from queueing.models import GpuType, Job, JobEvent, NotebookSession, Tier
from queueing.policy.states import JobState
from queueing.services.sessions import notebook_token
from tests.conftest import World
from tests.factories import GpuTypeFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def shared(world: World, settings: Any) -> GpuType:
    """A time-sliced type of 4 slices per GPU, on two simulated nodes of 4 GPUs."""
    settings.FAIRQ_SIM_NODES = "2x8xh100,2x8xa100,1x7xmig-1g-10gb,2x4xt4-shared"
    reset_backends()
    return GpuTypeFactory(slug="t4-shared", resource_name="nvidia.com/gpu.shared",
                          sharing="time-sliced", slices_per_gpu=4)


def start(world: World, user: Any = None, **body: Any) -> Any:
    return world.client(user or world.member).post("/api/v1/sessions/", body, format="json")


def test_it_starts_a_session_as_a_job_of_the_interactive_tier(world: World) -> None:
    world.vision.allowed_pvcs = ["home"]
    world.vision.save()
    r = start(world, team="vision", gpu_type="a100", gpus=1, pvc="home", idle_minutes=30,
              max_runtime_seconds=7200)
    assert r.status_code == 201, r.json()
    body = r.json()
    job = Job.objects.get(pk=body["id"])
    assert job.tier.slug == "interactive" and not job.tier.preemptible
    assert job.status == JobState.QUEUED and job.max_runtime_seconds == 7200
    assert job.image == "quay.io/jupyter/pytorch-notebook:latest"
    assert job.command == ["jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser",
                           f"--ServerApp.base_url=/sessions/{job.pk}/lab/",
                           "--ServerApp.root_dir=/home/jovyan/work"]
    assert job.volumes == [{"name": "work", "pvc": "home", "mount_path": "/home/jovyan/work",
                            "read_only": False}]
    s = NotebookSession.objects.get(job=job)
    assert s.owner == world.member and s.idle_limit_minutes == 30 and s.warn_lead_minutes == 10
    assert body["state"] == "QUEUED" and body["url"] is None and body["gpu"] == "1 a100"
    assert body["page"] == f"/sessions/{job.pk}/" and body["volumes"] == ["home"]
    events = JobEvent.objects.filter(job=job)
    assert [e.kind for e in events] == ["transition", "session"]
    token = notebook_token(job_id=job.pk, attempt=1)
    assert token not in r.content.decode()
    assert all(token not in str(e.reason) + str(e.data) for e in events)
    assert token not in str(job.env) + str(job.command)


def test_it_starts_on_a_fraction_by_default_when_a_type_shares_slices(world: World,
                                                                       shared: GpuType) -> None:
    r = start(world, team="vision")
    assert r.status_code == 201, r.json()
    body = r.json()
    assert body["gpu_type"] == "t4-shared" and body["gpu_slices"] == 1
    assert body["gpu"] == "1/4 t4-shared" and body["gpu_share"] == 0.25
    assert body["gpus"] == 0.25  # as a job's `gpus` says a fraction
    assert body["memory_isolated"] is False
    r = start(world, team="vision", gpu_type="t4-shared", gpu_fraction="1/2")
    assert r.status_code == 201 and r.json()["gpu_slices"] == 2
    assert Job.objects.get(pk=r.json()["id"]).gpu_share == 0.5


@pytest.mark.parametrize(("body", "field", "words"), [
    ({"gpu_type": "t4-shared", "gpu_fraction": "0.3"}, "gpu_fraction", "1/4, 2/4, 3/4"),
    ({"gpu_type": "t4-shared", "gpu_fraction": "1"}, "gpu_fraction", "1/4, 2/4, 3/4"),
    ({"gpu_type": "t4-shared", "gpu_fraction": "abc"}, "gpu_fraction", "such as 0.25"),
    ({"gpu_type": "a100", "gpu_fraction": "0.5"}, "gpu_fraction", "whole devices only"),
    ({"gpu_type": "t4-shared", "gpus": 1, "gpu_fraction": "0.5"}, "gpu_fraction", "not both"),
    ({"gpu_type": "nope"}, "gpu_type", "Unknown GPU type"),
    ({"gpu_type": "a100", "idle_minutes": 100000}, "idle_minutes", "a week"),
    ({"gpu_type": "a100", "max_runtime_seconds": 200000}, "max_runtime_seconds", "24 h"),
    ({"gpu_type": "a100", "pvc": "not-allowed"}, "volumes", "not-allowed"),
    ({"gpu_type": "a100", "privileged": True}, "privileged", "Unknown field"),
    ({"gpu_type": "a100", "team": "nlp"}, "team", "not in it"),
])
def test_it_refuses_bad_input_with_field_messages(world: World, shared: GpuType,
                                                  body: dict[str, Any], field: str,
                                                  words: str) -> None:
    r = start(world, **{"team": "vision", **body})
    assert r.status_code == 400, r.json()
    fields = r.json()["error"]["fields"]
    hit = [m for k, msgs in fields.items() if k.startswith(field) for m in msgs]
    assert any(words in m for m in hit), fields
    assert not NotebookSession.objects.exists()


def test_it_enforces_the_per_user_limits(world: World, shared: GpuType, settings: Any) -> None:
    settings.FAIRQ_SESSION_MAX_PER_USER = 2
    settings.FAIRQ_SESSION_MAX_GPUS_PER_USER = 1.0
    assert start(world, team="vision", gpu_type="t4-shared", gpu_fraction="3/4").status_code == 201
    r = start(world, team="vision", gpu_type="t4-shared", gpu_fraction="1/2")
    assert r.status_code == 400
    assert "would hold 1.25 GPU(s); at most 1" in r.json()["error"]["message"]
    assert start(world, team="vision", gpu_type="t4-shared", gpu_fraction="1/4").status_code == 201
    r = start(world, team="vision", gpu_type="t4-shared", gpu_fraction="1/4")
    assert r.status_code == 400 and "at most 2 per user" in r.json()["error"]["message"]
    # another user is counted apart
    assert start(world, world.admin, team="vision").status_code == 201
    # a stopped session no longer counts
    first = NotebookSession.objects.filter(owner=world.member).order_by("job_id").first()
    assert first is not None
    assert world.client(world.member).delete(f"/api/v1/sessions/{first.job_id}/").status_code == 200
    assert start(world, team="vision", gpu_type="t4-shared", gpu_fraction="1/4").status_code == 201


def test_it_creates_the_interactive_tier_once_at_a_free_rank(world: World,
                                                             settings: Any) -> None:
    settings.FAIRQ_SESSION_TIER_RANK = 100  # the world's `normal` holds it
    assert start(world, team="vision", gpu_type="a100").status_code == 201
    assert start(world, world.admin, team="vision", gpu_type="a100").status_code == 201
    tier = Tier.objects.get(slug="interactive")
    assert tier.rank == 101 and tier.open_to_all_teams and tier.idle_action == "flag"


def test_list_detail_and_stop_are_scoped(world: World) -> None:
    sid = start(world, team="vision", gpu_type="a100").json()["id"]
    mine = world.client(world.member).get("/api/v1/sessions/").json()
    assert [s["id"] for s in mine] == [sid]
    # the team admin sees it with ?all, not in their own list; the outsider never
    assert world.client(world.admin).get("/api/v1/sessions/").json() == []
    assert [s["id"] for s in world.client(world.admin).get(
        "/api/v1/sessions/?all=true").json()] == [sid]
    assert world.client(world.outsider).get(f"/api/v1/sessions/{sid}/").status_code == 404
    assert world.client(world.outsider).delete(f"/api/v1/sessions/{sid}/").status_code == 404
    detail = world.client(world.member).get(f"/api/v1/sessions/{sid}/").json()
    assert detail["state"] == "QUEUED" and detail["idle_limit_minutes"] == 60
    # a plain job is no session
    job_id = world.client(world.member).post("/api/v1/jobs/", {
        "team": "vision", "name": "x", "image": "ghcr.io/acme/train:1.4", "gpu_type": "a100",
        "gpus": 1}, format="json").json()["id"]
    assert world.client(world.member).get(f"/api/v1/sessions/{job_id}/").status_code == 404
    # a team admin may stop a member's session
    r = world.client(world.admin).delete(f"/api/v1/sessions/{sid}/")
    assert r.status_code == 200 and r.json()["state"] == "CANCELLED"
    end = JobEvent.objects.get(job_id=sid, to_status="CANCELLED")
    assert "PVC and files are kept" in end.reason
    r = world.client(world.member).delete(f"/api/v1/sessions/{sid}/")
    assert r.status_code == 409, r.json()


def test_a_member_may_not_stop_anothers_session(world: World) -> None:
    sid = start(world, world.admin, team="vision", gpu_type="a100").json()["id"]
    r = world.client(world.member).delete(f"/api/v1/sessions/{sid}/")
    assert r.status_code == 403


def test_the_launch_spec_carries_path_and_token_whatever_the_tier(world: World) -> None:
    """Rule B3 may queue a session in its team's lowest tier: it still gets its token."""
    from queueing.services.scheduler import launch_spec

    sid = start(world, team="vision", gpu_type="a100").json()["id"]
    Job.objects.filter(pk=sid).update(tier=world.low)
    spec = launch_spec(Job.objects.select_related("tier", "team", "gpu_type").get(pk=sid))
    assert spec.notebook_prefix == f"/sessions/{sid}/lab/"
    assert spec.notebook_token == notebook_token(job_id=sid, attempt=1)
    plain = world.client(world.member).post("/api/v1/jobs/", {
        "team": "vision", "name": "x", "image": "ghcr.io/acme/train:1.4", "gpu_type": "a100",
        "gpus": 1, "command": ["jupyter", "lab"]}, format="json").json()["id"]
    spec = launch_spec(Job.objects.select_related("tier", "team", "gpu_type").get(pk=plain))
    assert (spec.notebook_prefix, spec.notebook_token) == ("", "")


def test_a_simulated_session_ends_at_its_time_limit(world: World) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from queueing.services.scheduler import scheduler_cycle

    sid = start(world, team="vision", gpu_type="a100", max_runtime_seconds=120).json()["id"]
    t0 = timezone.now()
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert Job.objects.get(pk=sid).status == JobState.RUNNING
    scheduler_cycle(now=t0 + timedelta(seconds=100))
    assert Job.objects.get(pk=sid).status == JobState.RUNNING  # not the default 60 s
    scheduler_cycle(now=t0 + timedelta(seconds=125))
    assert Job.objects.get(pk=sid).status == JobState.SUCCEEDED
