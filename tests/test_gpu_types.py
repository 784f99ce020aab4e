"""Jobs that accept several GPU types, outside the planner (docs/api.md, "Several GPU
types"): what submit accepts and refuses, what the snapshot gives the policy
(`QueuedJob.gpu_types`, `Snapshot.flavor_fallback`), and what applying an admission on a
type other than the first records: the job's type, the ADMITTED event, the workload's
node selector, the node and the usage charged. The simulated cluster of the tests:
2x8xh100, 2x8xa100, 1x7xmig-1g-10gb."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from queueing.composition import get_backend
from queueing.models import Job, JobEvent, Tier, UsageRecord
from queueing.policy.admission import Admission, Plan
from queueing.policy.snapshot import FlavorFallback
from queueing.selectors.snapshot import build_snapshot
from queueing.services.jobs import job_cancel
from queueing.services.scheduler import apply_plan, launch_spec, scheduler_cycle

from .conftest import World, job_body

pytestmark = pytest.mark.django_db


def post(world: World, **fields: Any) -> Any:
    body = {k: v for k, v in job_body(**fields).items() if v is not None}
    return world.client(world.member).post("/api/v1/jobs/", body, format="json")


# --- submit -----------------------------------------------------------------------------

def test_a_job_lists_the_types_it_accepts_and_gpu_type_is_the_first(world: World) -> None:
    r = post(world, gpu_type=None, gpu_types=["h100", "a100"])
    assert r.status_code == 201, r.json()
    body = r.json()
    assert (body["gpu_type"], body["gpu_types"]) == ("h100", ["h100", "a100"])
    job = Job.objects.get(pk=body["id"])
    assert (job.gpu_type.slug, job.gpu_types) == ("h100", ["h100", "a100"])
    # gpu_type given too, the same as the first: the same job.
    r = post(world, gpu_type="a100", gpu_types=["a100", "h100"])
    assert r.status_code == 201, r.json()
    assert (r.json()["gpu_type"], r.json()["gpu_types"]) == ("a100", ["a100", "h100"])


def test_one_type_stays_the_common_case_and_shows_as_a_list_of_one(world: World) -> None:
    for fields in ({}, {"gpu_type": None, "gpu_types": ["a100"]}):
        r = post(world, **fields)
        assert r.status_code == 201, r.json()
        job = Job.objects.get(pk=r.json()["id"])
        assert job.gpu_types == []  # stored as a job of one type
        assert r.json()["gpu_types"] == [job.gpu_type.slug]


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"gpu_type": None, "gpu_types": []}, "gpu_types", "at least one"),
    ({"gpu_type": None, "gpu_types": ["h100", "h100"]}, "gpu_types", "more than once: h100"),
    ({"gpu_type": None, "gpu_types": ["h100", "tpu-v5"]}, "gpu_types", "'tpu-v5'; known:"),
    ({"gpu_type": "a100", "gpu_types": ["h100", "a100"]}, "gpu_types", "'a100' here, 'h100'"),
    ({"gpu_type": None, "gpu_types": "h100,a100"}, "gpu_types", ""),
    ({"gpu_type": None, "gpu_types": ["h100", "mig-1g-10gb"], "gpus": 8}, "gpu_types",
     "No mig-1g-10gb node holds 8 GPUs (the largest has 7)"),
    ({"gpu_type": None, "gpu_types": ["h100", "a100"], "gpus": 9}, "gpus",
     "No a100 node holds 9 GPUs"),
    ({"gpu_type": None}, "gpu_type", "required"),
])
def test_bad_accepted_types_are_refused_with_field_messages_and_nothing_is_written(
    world: World, fields: dict[str, Any], field: str, words: str,
) -> None:
    r = post(world, **fields)
    assert r.status_code == 400, r.json()
    messages = r.json()["error"]["fields"][field]
    assert any(words in m for m in messages), messages
    assert Job.objects.count() == 0


def test_every_accepted_type_must_have_the_topology_level(world: World) -> None:
    world.h100.topology_levels = [{"name": "rack", "node_label": "topology.kubernetes.io/rack"}]
    world.h100.save()
    r = post(world, gpu_type=None, gpu_types=["h100", "a100"],
             topology={"level": "rack", "mode": "preferred"})
    assert r.status_code == 400
    [message] = r.json()["error"]["fields"]["topology.level"]
    assert "a100 has no topology level 'rack'" in message and "Every GPU type" in message


def test_an_array_of_several_types_gives_every_member_the_types(world: World) -> None:
    body = {k: v for k, v in job_body().items() if k != "gpu_type"}
    r = world.client(world.member).post(
        "/api/v1/jobs/bulk/", {**body, "gpu_types": ["a100", "h100"], "count": 3}, format="json")
    assert r.status_code == 201, r.json()
    members = Job.objects.filter(array__isnull=False)
    assert members.count() >= 1
    assert {(j.gpu_type.slug, tuple(j.gpu_types)) for j in members} == {
        ("a100", ("a100", "h100"))}


# --- the snapshot -----------------------------------------------------------------------

def test_the_snapshot_gives_the_policy_the_types_and_the_fallback_team_over_tier(
    world: World,
) -> None:
    several = post(world, gpu_type=None, gpu_types=["h100", "a100"], tier="normal").json()["id"]
    one = post(world, gpu_type="a100", tier="normal").json()["id"]
    other = post(world, gpu_type=None, gpu_types=["a100", "h100"], tier="high").json()["id"]
    Tier.objects.filter(slug="normal").update(flavor_fallback="next_type")
    snap = build_snapshot(backend=get_backend(), now=timezone.now())
    queued = {q.id: q for q in snap.queued}
    assert (queued[several].gpu_type, queued[several].gpu_types) == ("h100", ("h100", "a100"))
    assert (queued[one].gpu_type, queued[one].gpu_types) == ("a100", ())
    assert queued[other].accepted_types == ("a100", "h100")
    assert snap.fallback("vision", world.normal.rank) == FlavorFallback.NEXT_TYPE
    assert snap.fallback("vision", world.high.rank) == FlavorFallback.BORROW
    # The team's own setting wins over its tiers'.
    world.vision.flavor_fallback = "borrow"
    world.vision.save()
    world.high.flavor_fallback = "next_type"
    world.high.save()
    snap = build_snapshot(backend=get_backend(), now=timezone.now())
    assert snap.fallback("vision", world.normal.rank) == FlavorFallback.BORROW
    world.vision.flavor_fallback = "next_type"
    world.vision.save()
    world.high.flavor_fallback = "borrow"
    world.high.save()
    snap = build_snapshot(backend=get_backend(), now=timezone.now())
    assert snap.fallback("vision", world.high.rank) == FlavorFallback.NEXT_TYPE


def test_a_requeued_job_is_planned_again_from_its_first_type(world: World) -> None:
    pk = post(world, gpu_type=None, gpu_types=["h100", "a100"]).json()["id"]
    Job.objects.filter(pk=pk).update(gpu_type=world.a100, attempt=2)  # last ran on a100
    [q] = build_snapshot(backend=get_backend(), now=timezone.now()).queued
    assert (q.gpu_type, q.gpu_types) == ("h100", ("h100", "a100"))


# --- applying an admission on another type ----------------------------------------------

def test_an_admission_on_the_second_type_runs_there_and_is_charged_as_it(world: World) -> None:
    pk = post(world, gpu_type=None, gpu_types=["h100", "a100"], gpus=8).json()["id"]
    backend = get_backend()
    node = next(n.name for n in backend.nodes() if n.gpu_type == "a100")
    t0 = timezone.now()
    plan = Plan(admissions=(Admission(job_id=pk, team="vision", gpu_type="a100",
                                      placement=(node,)),), waits={})
    with transaction.atomic():
        assert apply_plan(plan=plan, now=t0) == [pk]
    job = Job.objects.select_related("team", "tier", "gpu_type").get(pk=pk)
    assert (job.status, job.gpu_type.slug, job.placement) == ("ADMITTED", "a100", [node])
    event = JobEvent.objects.get(job_id=pk, to_status="ADMITTED")
    assert event.data["gpu_type"] == "a100"
    assert event.reason == f"admitted on {node} as a100 (accepts h100, a100)"
    spec = launch_spec(job)
    assert (spec.gpu_type, spec.node_labels) == ("a100", dict(world.a100.node_labels))
    scheduler_cycle(now=t0 + timedelta(seconds=1))  # submitted to the cluster
    scheduler_cycle(now=t0 + timedelta(seconds=2))  # seen running
    assert Job.objects.get(pk=pk).status == "RUNNING"
    a100 = {n.name: n.allocated for n in backend.nodes() if n.gpu_type == "a100"}
    assert a100[node] == 8
    assert sum(n.allocated for n in backend.nodes() if n.gpu_type == "h100") == 0
    job_cancel(actor=None, job=Job.objects.get(pk=pk), now=t0 + timedelta(seconds=61))
    [usage] = UsageRecord.objects.filter(job_id=pk)
    assert (usage.gpu_type_id, usage.billing_weight) == (world.a100.pk, 1.0)
    # The job page's answer: the type it ran on, and every type it accepts.
    body = world.client(world.member).get(f"/api/v1/jobs/{pk}/").json()
    assert (body["gpu_type"], body["gpu_types"]) == ("a100", ["h100", "a100"])


def test_an_admission_on_a_type_the_job_does_not_accept_is_not_applied(world: World) -> None:
    pk = post(world, gpu_type=None, gpu_types=["h100", "a100"]).json()["id"]
    node = next(n.name for n in get_backend().nodes() if n.gpu_type == "mig-1g-10gb")
    plan = Plan(admissions=(Admission(job_id=pk, team="vision", gpu_type="mig-1g-10gb",
                                      placement=(node,)),), waits={})
    with transaction.atomic():
        assert apply_plan(plan=plan, now=timezone.now()) == []
    assert Job.objects.get(pk=pk).status == "QUEUED"


# --- the fallback settings ----------------------------------------------------------------

def test_a_team_admin_sets_the_teams_fallback_and_tiers_show_theirs(world: World) -> None:
    url = "/api/v1/teams/vision/"
    r = world.client(world.admin).patch(url, {"flavor_fallback": "next_type"}, format="json")
    assert r.status_code == 200, r.json()
    assert r.json()["flavor_fallback"] == "next_type"
    world.vision.refresh_from_db()
    assert world.vision.flavor_fallback == "next_type"
    r = world.client(world.admin).patch(url, {"flavor_fallback": "sometimes"}, format="json")
    assert r.status_code == 400 and "flavor_fallback" in r.json()["error"]["fields"]
    r = world.client(world.member).patch(url, {"flavor_fallback": ""}, format="json")
    assert r.status_code == 403
    r = world.client(world.admin).patch(url, {"flavor_fallback": ""}, format="json")
    assert r.status_code == 200 and r.json()["flavor_fallback"] == ""  # the tiers' again
    tiers = world.client(world.member).get("/api/v1/tiers/").json()
    assert {t["flavor_fallback"] for t in tiers} == {"borrow"}


# --- the live cycle and the estimate, with the planner --------------------------------------

def test_rule_g1_the_cycle_lands_a_job_on_its_second_type_when_the_first_is_full(
    world: World,
) -> None:
    """No hand-made plan: the cycle plans, admits on a100 while h100 is full, and the
    next job accepting both goes to h100 once it has room."""
    t0 = timezone.now()
    full = [post(world, gpus=8).json()["id"] for _ in range(2)]
    scheduler_cycle(now=t0)
    assert set(Job.objects.filter(pk__in=full).values_list("gpu_type__slug", flat=True)) == \
        {"h100"}
    pk = post(world, gpu_type=None, gpu_types=["h100", "a100"], gpus=8).json()["id"]
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    job = Job.objects.select_related("gpu_type").get(pk=pk)
    assert (job.status, job.gpu_type.slug) == ("ADMITTED", "a100")
    for other in full:
        job_cancel(actor=None, job=Job.objects.get(pk=other), now=t0 + timedelta(seconds=2))
    scheduler_cycle(now=t0 + timedelta(seconds=3))
    again = post(world, gpu_type=None, gpu_types=["h100", "a100"], gpus=8).json()["id"]
    scheduler_cycle(now=t0 + timedelta(seconds=4))
    job = Job.objects.select_related("gpu_type").get(pk=again)
    assert (job.status, job.gpu_type.slug) == ("ADMITTED", "h100")


def test_rule_g5_a_waiting_job_of_two_types_is_estimated_on_the_first_to_free(
    world: World,
) -> None:
    from queueing.selectors.start_estimate import queue_start_estimates

    t0 = timezone.now()
    for _ in range(2):
        post(world, gpus=8, max_runtime_seconds=3600)
        post(world, gpu_type="a100", gpus=8, max_runtime_seconds=600)
    scheduler_cycle(now=t0)
    assert Job.objects.filter(status="ADMITTED").count() == 4
    h100_only = post(world, gpus=8, max_runtime_seconds=60).json()["id"]
    both = post(world, gpu_type=None, gpu_types=["h100", "a100"], gpus=8,
                max_runtime_seconds=60).json()["id"]
    starts, error = queue_start_estimates(now=t0 + timedelta(seconds=1),
                                          job_ids=[h100_only, both])
    assert error == ""
    h100_at, both_at = starts[h100_only].estimated_start, starts[both].estimated_start
    assert h100_at is not None and both_at is not None
    # The h100 jobs end in an hour; the a100 ones in ten minutes: the job of two types
    # starts when the first a100 frees, long before the h100-only job.
    assert both_at < t0 + timedelta(seconds=700) < t0 + timedelta(seconds=3500) < h100_at
