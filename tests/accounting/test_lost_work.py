"""The work preemptions lost, per team (docs/api.md, "Checkpoints and graceful stop"):
`lost_gpu_hours` of GET /api/v1/costs/ and the reports page's roll-up, counted on the
preemption's day from each victim's newest checkpoint, and lowered when a checkpoint
arrives during the victim's grace (after the roll-up too)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from queueing.models import Job, UsageDay, UsageRecord
from queueing.selectors.reports import report_buckets
from queueing.services.checkpoints import checkpoint_claim, checkpoint_report, checkpoint_token
from queueing.services.reports import usage_days_roll_up
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World, job_body

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_r9")]


def submit(world: World, user: object = None, **body: object) -> int:
    r = world.client(user or world.member).post("/api/v1/jobs/", job_body(**body), format="json")
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


def preempt_after_an_hour(world: World, *, checkpoint_before_s: int | None) -> Job:
    """A vision job of 8 h100 runs an hour (a checkpoint `checkpoint_before_s` before
    the end, or none) and is preempted by nlp's high job."""
    t0 = timezone.now() - timedelta(hours=3)
    stopped = t0 + timedelta(hours=1)
    victim = submit(world, name="victim", gpus=8, tier="low", env={"FAIRQ_SIM_SECONDS": "9000"})
    submit(world, name="other", gpus=8, tier="low", env={"FAIRQ_SIM_SECONDS": "9000"})
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0)
    if checkpoint_before_s is not None:
        checkpoint_report(claim=checkpoint_claim(checkpoint_token(job_id=victim, attempt=1)),
                          job_id=victim, now=stopped - timedelta(seconds=checkpoint_before_s))
    submit(world, world.outsider, team="nlp", tier="high", gpus=8)
    assert scheduler_cycle(now=stopped).preempted == [victim]
    return Job.objects.get(pk=victim)


def costs_lost(world: World) -> float:
    today = timezone.now().date()
    rows = world.client(world.member).get("/api/v1/costs/", {
        "from": (today - timedelta(days=2)).isoformat() + "T00:00:00Z",
        "to": (today + timedelta(days=1)).isoformat() + "T00:00:00Z",
        "period": "day", "team": "vision"}).json()["rows"]
    return float(sum(r["lost_gpu_hours"] for r in rows))


def report_lost(world: World) -> float:
    today = timezone.now().date()
    report = report_buckets(teams=[world.vision], start=today - timedelta(days=2),
                            end=today + timedelta(days=1), period="day", now=timezone.now())
    return sum(b.lost_gpu_hours for b in report.buckets)


def test_a_teams_costs_count_the_work_its_preemptions_lost(world: World) -> None:
    preempt_after_an_hour(world, checkpoint_before_s=15 * 60)
    assert costs_lost(world) == pytest.approx(8 * 0.25)  # 15 min since its checkpoint
    assert report_lost(world) == pytest.approx(2.0)  # before the roll-up: the live part
    usage_days_roll_up(now=timezone.now())
    assert sum(UsageDay.objects.values_list("lost_gpu_hours", flat=True)) == pytest.approx(2.0)
    assert report_lost(world) == pytest.approx(2.0)  # from the roll-up


def test_a_checkpoint_in_the_grace_after_the_roll_up_lowers_the_days_loss(world: World) -> None:
    victim = preempt_after_an_hour(world, checkpoint_before_s=None)
    usage_days_roll_up(now=timezone.now())
    assert report_lost(world) == pytest.approx(8.0)
    stopped = UsageRecord.objects.get(job=victim, attempt=1).end
    checkpoint_report(claim=checkpoint_claim(checkpoint_token(job_id=victim.pk, attempt=1)),
                      job_id=victim.pk, now=stopped + timedelta(seconds=2))
    assert report_lost(world) == pytest.approx(0.0)
    assert costs_lost(world) == pytest.approx(0.0)
    assert UsageDay.objects.get(day=stopped.date(), team=world.vision).lost_gpu_hours == \
        pytest.approx(0.0)


def test_a_preemption_right_after_a_checkpoint_loses_only_those_seconds(world: World) -> None:
    victim = preempt_after_an_hour(world, checkpoint_before_s=4)
    first = world.client(world.member).get(f"/api/v1/jobs/{victim.pk}/").json()["attempts"][0]
    assert first["lost_gpu_hours"] == pytest.approx(8 * 4 / 3600)
    assert first["lost_note"] == "preempted, 0.01 GPU-h lost since the checkpoint 4 s before"
