"""Rule P3: GET /api/v1/jobs/{id}/ shows the priority per factor and, for a queued job,
its queue position and why it waits."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from django.utils import timezone

from queueing.models import Job
from queueing.policy.explain import explain_queued
from queueing.policy.snapshot import QueuedJob
from queueing.services.scheduler import scheduler_cycle

from .conftest import World, job_body


def submit(world: World, user: Any = None, **overrides: Any) -> int:
    r = world.client(user or world.member).post("/api/v1/jobs/", job_body(**overrides),
                                                 format="json")
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


def detail(world: World, job_id: int, user: Any = None) -> dict[str, Any]:
    r = world.client(user or world.member).get(f"/api/v1/jobs/{job_id}/")
    assert r.status_code == 200, r.content
    return dict(r.json())


def test_the_priority_breakdown_is_per_factor_and_sums_to_the_total(world: World) -> None:
    job_id = submit(world)
    body = detail(world, job_id)
    p = body["priority"]
    factors = p["factors"]
    assert set(factors) >= {"fair_share", "age", "size"}
    for f in factors.values():
        assert 0.0 <= f["factor"] <= 1.0
        assert f["value"] == pytest.approx(f["weight"] * f["factor"])
    assert p["total"] == pytest.approx(sum(f["value"] for f in factors.values()))
    assert factors["fair_share"]["factor"] == 1.0  # vision used nothing yet
    assert factors["fair_share"]["weight"] == 10_000.0


def test_a_queued_job_says_its_position_and_why_it_waits(world: World) -> None:
    now = timezone.now()
    # Fill both h100 nodes (2 x 8): two 8-GPU jobs of nlp, admitted.
    a = submit(world, world.outsider, team="nlp", gpus=8, name="big-a")
    b = submit(world, world.outsider, team="nlp", gpus=8, name="big-b")
    scheduler_cycle(now=now)
    assert Job.objects.get(pk=a).status == "ADMITTED" and Job.objects.get(pk=b).status == "ADMITTED"
    first = submit(world, gpus=4, name="waits-first")
    second = submit(world, gpus=2, name="waits-second")
    q1 = detail(world, first)["queue"]
    q2 = detail(world, second)["queue"]
    assert q1["position"] == 1 and q1["ahead"] == 0
    assert q2["position"] == 2 and q2["ahead"] == 1 and q2["ahead_same_gpu_type"] == 1
    codes1 = [r["code"] for r in q1["reasons"]]
    codes2 = [r["code"] for r in q2["reasons"]]
    assert codes1[0] in {"capacity", "quota", "preempting"}
    assert "jobs_ahead" not in codes1
    assert "jobs_ahead" in codes2
    assert any("1 job ahead" in r["message"] for r in q2["reasons"])


def test_a_job_that_fits_says_the_next_cycle_admits_it(world: World) -> None:
    job_id = submit(world, gpus=1)
    q = detail(world, job_id)["queue"]
    assert q["position"] == 1
    assert [r["code"] for r in q["reasons"]] == ["next_cycle"]


def test_a_job_above_its_quota_says_quota(world: World) -> None:
    # vision may hold at most 16 h100 GPUs (nominal 8 + borrowing 8).
    submit(world, gpus=8, name="a")
    submit(world, gpus=8, name="b")
    scheduler_cycle(now=timezone.now())
    job_id = submit(world, gpus=1, name="c")
    q = detail(world, job_id)["queue"]
    assert q["reasons"][0]["code"] == "quota"
    assert "16" in q["reasons"][0]["message"]


def test_a_gang_no_node_can_hold_says_so() -> None:
    # The serializer refuses such jobs at submit; the explanation still names it.
    t = datetime(2026, 1, 1, tzinfo=timezone.get_current_timezone())
    ordered = [QueuedJob(1, "a", "h100", 8, 1, 100, t), QueuedJob(2, "b", "h100", 16, 1, 100, t)]
    e = explain_queued(2, ordered, wait_code="gang_does_not_fit",
                       wait_message="no h100 node has 16 GPUs for one replica",
                       admitted_next=False)
    assert e is not None and e.position == 2
    assert [r.code for r in e.reasons] == ["gang_does_not_fit", "jobs_ahead"]
    assert explain_queued(3, ordered, wait_code=None, wait_message=None,
                          admitted_next=False) is None


def test_a_running_or_finished_job_has_a_priority_but_no_queue(world: World) -> None:
    job_id = submit(world, gpus=1)
    scheduler_cycle(now=timezone.now())
    body = detail(world, job_id)
    assert body["status"] == "ADMITTED"
    assert body["queue"] is None
    assert "total" in body["priority"]


def test_an_outsider_cannot_see_the_explanation(world: World) -> None:
    job_id = submit(world)
    r = world.client(world.outsider).get(f"/api/v1/jobs/{job_id}/")
    assert r.status_code == 404


def test_an_unreachable_cluster_gives_a_reason_not_an_error(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from queueing.composition import get_backend

    job_id = submit(world)

    def down() -> None:
        raise ConnectionError("connection refused")

    monkeypatch.setattr(get_backend(), "nodes", down)
    body = detail(world, job_id)
    assert body["queue"]["reasons"][0]["code"] == "cluster_unreachable"
    assert "connection refused" in body["queue"]["reasons"][0]["message"]
    assert body["priority"]["factors"]["fair_share"]["factor"] == 1.0


def test_the_queue_part_can_be_skipped(world: World) -> None:
    from django.utils import timezone

    from queueing.api.serializers import JobDetailSerializer
    from queueing.selectors.queue_plan import job_explain

    job = Job.objects.get(pk=submit(world))
    explain = job_explain(job=job, now=timezone.now(), with_queue=False)
    data = JobDetailSerializer(job, context={"explain": {job.pk: explain}}).data
    assert data["queue"] is None and data["priority"]["total"] > 0
