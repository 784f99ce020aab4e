"""Rule E6 (docs/scheduling.md): a job that cannot run as the quotas stand is accepted
(staff may raise a quota) and flagged at once: its first plan, which a new job always
gets, says `never_fits` (more GPUs than its team may ever hold), in the list and the
detail alike. One that no cluster could hold even empty is refused at submit
(tests/api/test_submit_impossible.py); one already queued when the nodes shrank says
`gang_does_not_fit` (more replicas than the empty nodes hold)."""

from __future__ import annotations

from typing import Any

from django.utils import timezone

from queueing.models import Job, Quota
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World, job_body
from tests.factories import JobFactory


def _submit(world: World, **overrides: Any) -> int:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(**overrides), format="json")
    assert r.status_code == 201, r.content
    return int(r.json()["id"])


def _reason(world: World, job_id: int) -> dict[str, Any]:
    client = world.client(world.member)
    listed = {j["id"]: j for j in client.get("/api/v1/jobs/?status=QUEUED").json()["results"]}
    detail = client.get(f"/api/v1/jobs/{job_id}/").json()["queue"]
    assert listed[job_id]["reason"] == detail["reason"]
    return dict(detail["reason"])


def test_rule_e6_more_gpus_than_the_teams_ceiling_is_flagged_never_fits_at_once(
        world: World, settings: Any) -> None:
    # vision: h100 nominal 8 + borrowing limit 8 = 16 (conftest); nothing runs. 32 h100
    # GPUs, so the cluster could hold the job: only the quota stands in its way.
    settings.FAIRQ_SIM_NODES = "4x8xh100,2x8xa100,1x7xmig-1g-10gb"
    job_id = _submit(world, gpus=8, replicas=3)
    reason = _reason(world, job_id)  # no cycle ran: the job's first plan says it
    assert reason == {"code": "never_fits", "message": (
        "team vision may hold at most 16 h100 GPUs (its quota's nominal + borrowing limit); "
        "this job asks 24: it can never run unless the quota is raised")}


def test_rule_e6_the_ceiling_itself_is_not_never_fits(world: World) -> None:
    job_id = _submit(world, gpus=8, replicas=2)  # exactly 16
    assert _reason(world, job_id)["code"] == "next_cycle"


def test_rule_e6_a_gang_the_empty_nodes_cannot_hold_is_flagged_at_once(world: World) -> None:
    # a100 (no ceiling for vision): 2 nodes of 8 hold at most 4 replicas of 4 GPUs. Submit
    # refuses such a job; this one was queued when the cluster was larger (a row of
    # before every job had memory: the nodes' GPUs alone say it cannot fit).
    job_id = JobFactory(team=world.vision, submitter=world.member, gpu_type=world.a100,
                        tier=world.normal, gpus_per_replica=4, replicas=5).pk
    assert _reason(world, job_id) == {"code": "gang_does_not_fit", "message": (
        "even empty, the a100 nodes hold at most 4 replicas of 4 GPUs; this gang needs 5")}


def test_rule_e6_a_quota_lowered_after_the_submit_flags_the_job_never_fits(
        world: World) -> None:
    job_id = _submit(world, gpus=8, replicas=2)
    Quota.objects.filter(team=world.vision, gpu_type=world.h100).update(borrowing_limit=4)
    scheduler_cycle(now=timezone.now())
    assert Job.objects.get(pk=job_id).status == "QUEUED"
    reason = _reason(world, job_id)
    assert reason["code"] == "never_fits"
    assert "may hold at most 12 h100 GPUs" in reason["message"]
