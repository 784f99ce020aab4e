"""Rule E4 end to end: a rate-limited job's reason carries `until` (ISO 8601) — when its
team's oldest preemption of the window leaves it — in the list and the detail, from the
`preempted` events the selector reads."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from queueing.models import JobEvent, Quota
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World, job_body
from tests.factories import JobFactory


def _submit(world: World, user: Any, **overrides: Any) -> int:
    r = world.client(user).post("/api/v1/jobs/", job_body(**overrides), format="json")
    assert r.status_code == 201, r.content
    return int(r.json()["id"])


def test_rule_e4_a_rate_limited_job_says_until_when_in_the_list_and_the_detail(
        world: World, settings: Any) -> None:
    settings.FAIRQ_PREEMPTION_MAX_PER_TEAM = 1
    settings.FAIRQ_PREEMPTION_WINDOW_SECONDS = 600
    settings.FAIRQ_PREEMPTION_LOST_PER_WAIT = -1  # rule R9 aside
    # vision's claim beyond its nominal: an owed one is not rate-limited (rule R11).
    Quota.objects.filter(team=world.vision, gpu_type=world.h100).update(nominal=0)
    now = timezone.now()
    # nlp fills both h100 nodes with low-tier jobs.
    for i in range(2):
        _submit(world, world.outsider, team="nlp", gpus=8, tier="low", name=f"low-{i}")
    scheduler_cycle(now=now)
    # vision preempted once 100 s ago: its one preemption of the window is used.
    victim = JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.low)
    made = now - timedelta(seconds=100)
    JobEvent.objects.create(job=victim, at=made, kind=JobEvent.Kind.PREEMPTED,
                            attempt=1, actor_label="scheduler", reason="preempted",
                            data={"rule": "R1", "preemptor": 0, "preemptor_team": "vision"})
    job_id = _submit(world, world.member, gpus=8, tier="high", name="wants-room")
    client = world.client(world.member)
    reason = client.get(f"/api/v1/jobs/{job_id}/").json()["queue"]["reason"]
    assert reason["code"] == "preemption_rate_limited", reason
    until = datetime.fromisoformat(reason["until"])
    assert until == made + timedelta(seconds=600)
    assert f"until {until.isoformat(timespec='seconds')} (in " in reason["message"]
    listed = {j["id"]: j for j in client.get("/api/v1/jobs/?status=QUEUED").json()["results"]}
    assert listed[job_id]["reason"] == reason
