"""Array jobs as a record (`JobArray`): members carry array_id and array_index, the
summary counts them, DELETE cancels the rest, and the concurrency limit (rule A8) holds
across real cycles on the simulated cluster. And attempts (docs/api.md, "Attempts")."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queueing.models import Job, JobArray, JobEvent, UsageRecord
from queueing.policy.states import HOLDING_STATES, JobState
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World, job_body

pytestmark = pytest.mark.django_db


def bulk(world: World, user: Any = None, **body: Any) -> dict[str, Any]:
    r = world.client(user or world.member).post(
        "/api/v1/jobs/bulk/", {**job_body(name="sweep", gpus=1), **body}, format="json"
    )
    assert r.status_code == 201, r.json()
    out: dict[str, Any] = r.json()
    return out


def test_an_array_is_a_record_and_every_member_carries_its_id_and_index(world: World) -> None:
    out = bulk(world, count=4, max_running=2)
    array = JobArray.objects.get(pk=out["array_id"])
    assert (array.team, array.count, array.max_running, array.created_by) == (
        world.vision,
        4,
        2,
        world.member,
    )
    members = list(Job.objects.filter(array=array).order_by("array_index"))
    assert [m.pk for m in members] == out["ids"]
    assert [(m.array_index, m.name, m.env["FAIRQ_ARRAY_INDEX"]) for m in members] == [
        (i, f"sweep-{i}", str(i)) for i in range(4)
    ]
    body = world.client(world.member).get(f"/api/v1/jobs/{out['ids'][2]}/").json()
    assert body["array_id"] == array.pk and body["array_index"] == 2
    summary = world.client(world.member).get(f"/api/v1/arrays/{array.pk}/").json()
    assert summary["count"] == 4 and summary["max_running"] == 2
    assert summary["counts"]["QUEUED"] == 4 and summary["counts"]["RUNNING"] == 0
    assert summary["done"] is False and summary["created_by"] == "dave"
    # The list filters on it: watching an array's members is one request.
    bulk(world, count=2)
    listed = world.client(world.member).get(f"/api/v1/jobs/?array={array.pk}").json()
    assert sorted(j["id"] for j in listed["results"]) == out["ids"]
    # Other teams see no such array; a limit below 1 is refused.
    assert world.client(world.outsider).get(f"/api/v1/arrays/{array.pk}/").status_code == 404
    r = world.client(world.member).post(
        "/api/v1/jobs/bulk/", {**job_body(), "count": 2, "max_running": 0}, format="json"
    )
    assert r.status_code == 400 and "max_running" in r.json()["error"]["fields"]


def test_delete_cancels_the_members_not_ended_in_one_go_with_events(world: World) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    out = bulk(world, count=5, max_running=2, env={"FAIRQ_SIM_SECONDS": "10"})
    ids = out["ids"]
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    scheduler_cycle(now=t0 + timedelta(seconds=11))  # the first two succeed, two more start
    scheduler_cycle(now=t0 + timedelta(seconds=12))
    states = dict(Job.objects.filter(pk__in=ids).values_list("pk", "status"))
    assert sorted(states.values()) == ["QUEUED", "RUNNING", "RUNNING", "SUCCEEDED", "SUCCEEDED"]
    assert world.client(world.outsider).delete(f"/api/v1/arrays/{out['array_id']}/").status_code == 404
    r = world.client(world.member).delete(f"/api/v1/arrays/{out['array_id']}/")
    assert r.status_code == 200
    not_ended = sorted(pk for pk, s in states.items() if s != "SUCCEEDED")
    assert r.json()["cancelled"] == not_ended
    assert r.json()["array"]["counts"]["CANCELLED"] == 3 and r.json()["array"]["done"] is True
    for pk in not_ended:
        event = JobEvent.objects.get(job_id=pk, to_status=JobState.CANCELLED)
        assert event.from_status == states[pk] and event.data == {"array": out["array_id"]}
        assert event.actor == world.member
    # The running ones were charged up to the cancel, and their workloads go.
    running = [pk for pk, s in states.items() if s == "RUNNING"]
    assert UsageRecord.objects.filter(job_id__in=running).count() == 2
    scheduler_cycle(now=t0 + timedelta(seconds=13))
    assert Job.objects.filter(pk__in=ids, status=JobState.SUCCEEDED).count() == 2


def test_rule_A8_the_concurrency_limit_holds_across_cycles(world: World) -> None:
    """Eight 1-GPU members, at most 3 at once, each running 10 s, on a cluster with room
    for all: every cycle holds at most 3, all finish, and the waiting ones say why."""
    t0 = timezone.now() + timedelta(seconds=1)
    out = bulk(world, count=8, max_running=3, env={"FAIRQ_SIM_SECONDS": "10"})
    ids = out["ids"]
    peak = 0
    for s in range(0, 60, 2):
        scheduler_cycle(now=t0 + timedelta(seconds=s))
        holding = Job.objects.filter(pk__in=ids, status__in=list(HOLDING_STATES)).count()
        peak = max(peak, holding)
        assert holding <= 3, f"{holding} members hold GPUs at t0+{s}s"
        if s == 2:
            queued = Job.objects.filter(pk__in=ids, status=JobState.QUEUED).first()
            assert queued is not None
            reason = (
                world.client(world.member).get(f"/api/v1/jobs/{queued.pk}/").json()["queue"]["reasons"][0]
            )
            assert reason["code"] == "array_limit"
            assert reason["message"].endswith("its limit of 3 at once (rule A8)")
    assert peak == 3
    assert Job.objects.filter(pk__in=ids, status=JobState.SUCCEEDED).count() == 8
    # Without a limit the same array runs all at once.
    out = bulk(world, count=8, env={"FAIRQ_SIM_SECONDS": "10"})
    scheduler_cycle(now=t0 + timedelta(seconds=100))
    assert Job.objects.filter(pk__in=out["ids"], status__in=list(HOLDING_STATES)).count() == 8


# R9 off: submitted at the wall clock, cycles at chosen instants; the preemption
# it needs does not wait on how long the submits took (conftest no_r9).
@pytest.mark.usefixtures("no_r9")
def test_attempts_after_a_preemption_show_preempted_by_and_gpu_hours(world: World) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    fill = [
        int(
            world.client(world.member)
            .post(
                "/api/v1/jobs/",
                job_body(name=f"fill-{i}", tier="low", gpus=8, env={"FAIRQ_SIM_SECONDS": "5000"}),
                format="json",
            )
            .json()["id"]
        )
        for i in range(2)
    ]
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    hi = int(
        world.client(world.outsider)
        .post("/api/v1/jobs/", job_body(team="nlp", name="urgent", tier="high", gpus=8), format="json")
        .json()["id"]
    )
    r = scheduler_cycle(now=t0 + timedelta(seconds=100))
    [victim] = r.preempted
    assert victim in fill
    scheduler_cycle(now=t0 + timedelta(seconds=101))
    body = world.client(world.member).get(f"/api/v1/jobs/{victim}/").json()
    assert body["attempt"] == 2 and body["status"] == "QUEUED"
    [first] = body["attempts"]
    assert first["attempt"] == 1 and first["ended_how"] == "preempted"
    assert first["preempted_by"] == {"job": hi, "team": "nlp", "tier": "high"}
    assert first["started_at"] == t0.isoformat()
    assert first["ended_at"] == (t0 + timedelta(seconds=100)).isoformat()
    assert first["gpu_hours"] == pytest.approx(8 * 100 / 3600) and first["charged"] is True
    # The other filler still runs: its attempt is "running", not charged yet (its GPU-hours
    # are counted to the request's wall clock, which this test's t0 lies ahead of: 0).
    other = next(i for i in fill if i != victim)
    [running] = world.client(world.member).get(f"/api/v1/jobs/{other}/").json()["attempts"]
    assert running["ended_how"] == "running" and running["charged"] is False
    assert running["started_at"] == t0.isoformat() and running["ended_at"] is None
    # The list carries the same attempts, in two queries for the whole page.
    client = world.client(world.staff)
    client.get("/api/v1/jobs/")  # warm up the token and caches
    with CaptureQueriesContext(connection) as few:
        listed = client.get("/api/v1/jobs/?team=vision").json()["results"]
    more = [
        world.client(world.member).post("/api/v1/jobs/", job_body(name=f"x-{i}"), format="json")
        for i in range(3)
    ]
    assert all(m.status_code == 201 for m in more)
    Job.objects.filter(pk__in=[m.json()["id"] for m in more]).update(
        admitted_at=t0, attempt=2
    )  # jobs that had attempts: their rows are read too
    client.get("/api/v1/jobs/?team=vision")  # jobs newer than the cached plan: a fresh one (E5)
    with CaptureQueriesContext(connection) as many:
        client.get("/api/v1/jobs/?team=vision")
    assert len(many) == len(few)
    row = next(j for j in listed if j["id"] == victim)
    assert row["attempts"] == body["attempts"]


def test_attempts_say_succeeded_failed_and_cancelled(world: World) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    client = world.client(world.member)
    ok = int(
        client.post(
            "/api/v1/jobs/", job_body(name="ok", env={"FAIRQ_SIM_SECONDS": "5"}), format="json"
        ).json()["id"]
    )
    bad = int(
        client.post(
            "/api/v1/jobs/",
            job_body(name="bad", env={"FAIRQ_SIM_SECONDS": "5", "FAIRQ_SIM_EXIT_CODE": "2"}),
            format="json",
        ).json()["id"]
    )
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    scheduler_cycle(now=t0 + timedelta(seconds=6))
    [a] = client.get(f"/api/v1/jobs/{ok}/").json()["attempts"]
    assert a["ended_how"] == "succeeded" and a["gpu_hours"] == pytest.approx(2 * 5 / 3600)
    [b] = client.get(f"/api/v1/jobs/{bad}/").json()["attempts"]
    assert b["ended_how"] == "failed" and b["preempted_by"] is None
    queued = int(client.post("/api/v1/jobs/", job_body(name="later"), format="json").json()["id"])
    client.post(f"/api/v1/jobs/{queued}/cancel/")
    assert client.get(f"/api/v1/jobs/{queued}/").json()["attempts"] == []
