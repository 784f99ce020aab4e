"""Dependencies through the API and the real cycle on the simulated cluster (rules D1-D3):
a met dependency admits the job, one never met fails it with its reason, unknown,
other teams' and cyclic dependencies are refused with a field message."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.models import Job, JobEvent
from queueing.policy.states import JobState
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World, job_body

pytestmark = pytest.mark.django_db


def submit(world: World, user: Any = None, **overrides: Any) -> int:
    r = world.client(user or world.member).post("/api/v1/jobs/", job_body(**overrides), format="json")
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


def status(job_id: int) -> str:
    return Job.objects.get(pk=job_id).status


def cycles(t0: datetime, *seconds: float) -> None:
    for s in seconds:
        scheduler_cycle(now=t0 + timedelta(seconds=s))


def test_rule_D1_after_ok_waits_with_its_reason_then_is_admitted_once_met(world: World) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    pre = submit(world, name="preprocess", env={"FAIRQ_SIM_SECONDS": "30"})
    train = submit(world, name="train", dependencies=[{"type": "after_ok", "job": pre}])
    body = world.client(world.member).get(f"/api/v1/jobs/{train}/").json()
    assert body["dependencies"] == [{"type": "after_ok", "job": pre}]
    cycles(t0, 0, 1)
    assert status(pre) == JobState.RUNNING and status(train) == JobState.QUEUED
    body = world.client(world.member).get(f"/api/v1/jobs/{train}/").json()
    reason = body["queue"]["reasons"][0]
    assert reason == {"code": "dependency", "message": f"waiting for job {pre} (after_ok)"}
    # The list answers it too, compactly: the dependencies, no attempts yet.
    listed = world.client(world.member).get("/api/v1/jobs/").json()["results"]
    row = next(j for j in listed if j["id"] == train)
    assert row["dependencies"] == [{"type": "after_ok", "job": pre}] and row["attempts"] == []
    cycles(t0, 31)  # preprocess succeeds at t0+30 ...
    assert status(pre) == JobState.SUCCEEDED
    cycles(t0, 32)  # ... and the next cycle admits train
    assert status(train) in (JobState.ADMITTED, JobState.RUNNING)


def test_rule_D1_after_any_and_after_not_ok_on_a_failed_job(world: World) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    bad = submit(world, name="flaky", env={"FAIRQ_SIM_SECONDS": "5", "FAIRQ_SIM_EXIT_CODE": "3"})
    cleanup = submit(world, name="cleanup", dependencies=[{"type": "after_any", "job": bad}])
    alert = submit(world, name="alert", dependencies=[{"type": "after_not_ok", "job": bad}])
    cycles(t0, 0, 1, 6)
    assert status(bad) == JobState.FAILED
    cycles(t0, 7)
    assert status(cleanup) != JobState.QUEUED and status(alert) != JobState.QUEUED
    assert status(alert) != JobState.FAILED


@pytest.mark.parametrize(
    ("kind", "env", "ends"),
    [
        ("after_ok", {"FAIRQ_SIM_SECONDS": "5", "FAIRQ_SIM_EXIT_CODE": "1"}, JobState.FAILED),
        ("after_not_ok", {"FAIRQ_SIM_SECONDS": "5"}, JobState.SUCCEEDED),
    ],
)
def test_rule_D2_a_dependency_never_met_fails_the_job_with_its_reason(
    world: World, kind: str, env: dict[str, str], ends: str
) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    first = submit(world, name="first", env=env)
    second = submit(world, name="second", dependencies=[{"type": kind, "job": first}])
    cycles(t0, 0, 1, 6)
    assert status(first) == ends
    cycles(t0, 7)
    job = Job.objects.get(pk=second)
    assert job.status == JobState.FAILED and job.message == "dependency_never_met"
    assert job.admitted_at is None
    event = job.events.get(to_status=JobState.FAILED)
    assert event.from_status == JobState.QUEUED and event.data == {
        "code": "dependency_never_met",
        "rule": "D2",
    }
    assert f"on job {first} can never be met" in event.reason
    # A chain fails down the line: a job waiting for `second` fails next.
    third = submit(world, name="third", dependencies=[{"type": "after_ok", "job": second}])
    cycles(t0, 8)
    assert Job.objects.get(pk=third).message == "dependency_never_met"


def test_rule_D2_cancelled_dependency_never_met(world: World) -> None:
    first = submit(world, name="first")
    second = submit(world, name="second", dependencies=[{"type": "after_ok", "job": first}])
    assert world.client(world.member).post(f"/api/v1/jobs/{first}/cancel/").status_code == 200
    scheduler_cycle(now=timezone.now())
    assert Job.objects.get(pk=second).message == "dependency_never_met"


def test_rule_D3_unknown_and_other_teams_jobs_are_refused_alike(world: World) -> None:
    theirs = submit(world, world.outsider, team="nlp", name="theirs")
    client = world.client(world.member)
    for target in (theirs, 999_999):
        r = client.post(
            "/api/v1/jobs/", job_body(dependencies=[{"type": "after_ok", "job": target}]), format="json"
        )
        assert r.status_code == 400
        assert r.json()["error"]["fields"]["dependencies"] == [
            f"Unknown job {target}, or not of team vision."
        ]
    r = client.post("/api/v1/jobs/", job_body(dependencies=[{"type": "afterok", "job": 1}]), format="json")
    assert r.status_code == 400
    assert r.json()["error"]["fields"] == {"dependencies[0].type": ['"afterok" is not a valid choice.']}
    assert Job.objects.filter(team=world.vision).count() == 0


def test_rule_D3_a_cycle_is_refused_and_a_change_writes_an_event(world: World) -> None:
    client = world.client(world.member)
    a = submit(world, name="a")
    b = submit(world, name="b", dependencies=[{"type": "after_ok", "job": a}])
    c = submit(world, name="c", dependencies=[{"type": "after_any", "job": b}])
    r = client.patch(f"/api/v1/jobs/{a}/", {"dependencies": [{"type": "after_ok", "job": c}]}, format="json")
    assert r.status_code == 400
    assert r.json()["error"]["fields"]["dependencies"] == [
        f"These dependencies would make a cycle: job {a} -> job {c} -> job {b} -> job {a} (rule D3)."
    ]
    r = client.patch(f"/api/v1/jobs/{a}/", {"dependencies": [{"type": "after_ok", "job": a}]}, format="json")
    assert (
        r.status_code == 400 and "cannot depend on itself" in r.json()["error"]["fields"]["dependencies"][0]
    )
    assert Job.objects.get(pk=a).dependencies == []
    # No cycle: allowed, with an event.
    d = submit(world, name="d")
    r = client.patch(f"/api/v1/jobs/{c}/", {"dependencies": [{"type": "after_ok", "job": d}]}, format="json")
    assert r.status_code == 200, r.json()
    assert r.json()["dependencies"] == [{"type": "after_ok", "job": d}]
    event = JobEvent.objects.get(job_id=c, kind=JobEvent.Kind.DEPENDENCIES)
    assert event.data["to"] == [{"type": "after_ok", "job": d}]
    # Another team's member cannot see it: 404.
    r = world.client(world.outsider).patch(f"/api/v1/jobs/{c}/", {"dependencies": []}, format="json")
    assert r.status_code == 404


def test_rule_D3_a_member_depending_on_its_own_array_is_a_cycle(world: World) -> None:
    client = world.client(world.member)
    r = client.post("/api/v1/jobs/bulk/", {**job_body(name="sweep"), "count": 3}, format="json")
    array, ids = r.json()["array_id"], r.json()["ids"]
    r = client.patch(
        f"/api/v1/jobs/{ids[0]}/", {"dependencies": [{"type": "after_any", "array": array}]}, format="json"
    )
    assert r.status_code == 400 and "would make a cycle" in r.json()["error"]["fields"]["dependencies"][0]


def test_rule_D1_on_a_whole_array(world: World) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    client = world.client(world.member)
    r = client.post(
        "/api/v1/jobs/bulk/",
        {**job_body(name="shard", gpus=1, env={"FAIRQ_SIM_SECONDS": "10"}), "count": 3},
        format="json",
    )
    array = r.json()["array_id"]
    merge = submit(world, name="merge", dependencies=[{"type": "after_ok", "array": array}])
    cycles(t0, 0, 1)
    body = client.get(f"/api/v1/jobs/{merge}/").json()
    assert body["queue"]["reasons"][0]["message"] == f"waiting for array {array} (after_ok)"
    cycles(t0, 11)
    assert client.get(f"/api/v1/arrays/{array}/").json()["done"] is True
    cycles(t0, 12)
    assert status(merge) in (JobState.ADMITTED, JobState.RUNNING)
