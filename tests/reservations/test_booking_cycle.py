"""A weekly booking through the real scheduler cycle on PostgreSQL and the simulated
cluster (docs/reservations.md; rules W1-W4 in docs/scheduling.md, "Booked GPUs"), booked
by the API as a team admin does:

- before its start a job whose max runtime would cross it is not started on the GPUs it
  needs, while a short one is backfilled on them (W1);
- at its start a job with no estimate holding GPUs it needs is preempted, gracefully,
  and the booked GPUs hold no other team's job within one cycle plus the victim's stop
  time (W2);
- the team's job runs in it (W3);
- with the team's jobs done early, another team's preemptible job runs on the lent GPUs
  and is taken back when the team submits again (W4).

The cluster: 3 nodes of 8 h100 (24). nlp runs two jobs with no estimate before the
booking exists (nodes A and B); vision books 16 h100 from T = t0 + 2 h for 1 h, weekly.

Two things the test steers around, each said where it does: the preempted job with no
estimate is cancelled by its team after W2 (requeued, it would preempt the lent job by
rule R1 to be placed, then be held by W1 for next week's window: a preemption for
nothing), and the lent job is a 2 x 8 gang so that vision's 8 GPUs taken back leave no
room to lend it again (an 8-GPU lent job freed before its grace ends was lent again
ahead of vision's waiting job, cycle after cycle).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.composition import reset_backends
from queueing.models import Job, JobEvent, Reservation
from queueing.policy.states import JobState
from queueing.services.scheduler import scheduler_cycle
from tests.conftest import World, job_body

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_r9")]

STOP_SECONDS = 20  # the simulated program's save-and-exit after its stop signal
GRACE = STOP_SECONDS  # the victims use all their grace to save


def submit(world: World, user: Any, **body: Any) -> Job:
    r = world.client(user).post("/api/v1/jobs/", job_body(**body), format="json")
    assert r.status_code == 201, r.json()
    return Job.objects.get(pk=r.json()["id"])


def fresh(job: Job) -> Job:
    return Job.objects.get(pk=job.pk)


def nodes_of(*jobs: Job) -> set[str]:
    return {n for j in jobs for n in fresh(j).placement}


def test_rule_w2_a_weekly_booking_through_the_cycle_w1_to_w4(world: World, settings: Any) -> None:
    settings.FAIRQ_SIM_NODES = "3x8xh100,2x8xa100"
    settings.FAIRQ_SIM_STOP_SECONDS = STOP_SECONDS
    reset_backends()
    world.nlp.quotas.filter(gpu_type=world.h100).update(borrowing_limit=None)
    t0 = timezone.now() + timedelta(seconds=1)
    nlp = world.outsider  # team admin of nlp
    forever = {"max_runtime_seconds": None, "env": {"FAIRQ_SIM_SECONDS": "100000"},
               "termination_grace_seconds": GRACE}
    x1 = submit(world, nlp, team="nlp", name="x1", gpus=8, **forever)
    x2 = submit(world, nlp, team="nlp", name="x2", gpus=8, **forever)
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert fresh(x1).status == fresh(x2).status == JobState.RUNNING
    held_by_x = nodes_of(x1, x2)
    assert len(held_by_x) == 2

    # vision books 16 h100, weekly, from T for 1 h (the API, as its team admin).
    T = (t0 + timedelta(hours=2)).replace(microsecond=0)
    r = world.client(world.admin).post("/api/v1/reservations/", {
        "team": "vision", "gpu_type": "h100", "gpus": 16, "starts_at": T.isoformat(),
        "duration": "1h", "recurrence": "FREQ=WEEKLY;COUNT=4", "name": "weekly eval"},
        format="json")
    assert r.status_code == 201, r.json()
    booking = Reservation.objects.get(pk=r.json()["id"])

    # W1: before T the third node is free; a job that would run into T is not started
    # there, a short one is.
    t1 = t0 + timedelta(seconds=60)
    long = submit(world, nlp, team="nlp", name="long", gpus=8, max_runtime_seconds=3 * 3600,
                  env={"FAIRQ_SIM_SECONDS": "10000"})
    short = submit(world, nlp, team="nlp", name="short", gpus=8, max_runtime_seconds=1800,
                   env={"FAIRQ_SIM_SECONDS": "1200"})
    c = scheduler_cycle(now=t1)
    scheduler_cycle(now=t1 + timedelta(seconds=1))
    assert fresh(short).status == JobState.RUNNING
    assert fresh(long).status == JobState.QUEUED
    assert c.plan is not None and "rule W1" in c.plan.waits[long.pk].message
    third = nodes_of(short)
    assert len(third) == 1 and not third & held_by_x
    world.client(nlp).post(f"/api/v1/jobs/{long.pk}/cancel/")  # out of the way
    scheduler_cycle(now=t1 + timedelta(seconds=1300))
    assert fresh(short).status == JobState.SUCCEEDED

    # W2: vision's 2 x 8 job waits for T; at T a job with no estimate goes, gracefully.
    v = submit(world, world.admin, team="vision", name="eval", gpus=8, replicas=2,
               max_runtime_seconds=3000, env={"FAIRQ_SIM_SECONDS": "600"})
    scheduler_cycle(now=T - timedelta(seconds=30))
    assert fresh(v).status == JobState.QUEUED
    at_t = scheduler_cycle(now=T)
    assert len(at_t.preempted) == 1
    victim = fresh(Job(pk=at_t.preempted[0]))
    assert victim.pk in (x1.pk, x2.pk)
    ev = JobEvent.objects.get(job_id=victim.pk, kind=JobEvent.Kind.PREEMPTED)
    assert "rule W2" in ev.reason and ev.data["booking"] == booking.pk
    assert ev.data["grace_seconds"] == GRACE
    # While the victim saves and exits it keeps its GPUs: vision waits.
    scheduler_cycle(now=T + timedelta(seconds=5))
    assert fresh(v).status == JobState.QUEUED
    # One cycle after its stop time the booked GPUs hold no other team's job.
    freed_at = T + timedelta(seconds=STOP_SECONDS + 1)
    scheduler_cycle(now=freed_at)
    scheduler_cycle(now=freed_at + timedelta(seconds=1))
    v = fresh(v)
    assert v.status == JobState.RUNNING, v.status
    assert v.started_at is not None and v.started_at - T <= timedelta(seconds=STOP_SECONDS + 2)
    booked_nodes = nodes_of(v)
    assert len(booked_nodes) == 2
    others = Job.objects.filter(team=world.nlp, status__in=[JobState.RUNNING, JobState.ADMITTED])
    assert not booked_nodes & {n for j in others for n in j.placement}

    # The requeued victim (no estimate) is cancelled by its team: it would only wait
    # (rule W1: it would run into next week's window).
    assert world.client(nlp).post(f"/api/v1/jobs/{victim.pk}/cancel/").status_code == 200

    # W4: vision's job ends early; nlp's preemptible job runs on the lent GPUs...
    scheduler_cycle(now=T + timedelta(seconds=700))
    assert fresh(v).status == JobState.SUCCEEDED
    lent = submit(world, nlp, team="nlp", name="lent", gpus=8, replicas=2, tier="low",
                  max_runtime_seconds=1800, env={"FAIRQ_SIM_SECONDS": "1700"},
                  termination_grace_seconds=GRACE)
    for k in (710, 711, 712):
        scheduler_cycle(now=T + timedelta(seconds=k))
    assert fresh(lent).status == JobState.RUNNING
    assert nodes_of(lent) == booked_nodes
    # ... and is taken back when vision submits again.
    again = submit(world, world.admin, team="vision", name="eval-2", gpus=8,
                   max_runtime_seconds=1200, env={"FAIRQ_SIM_SECONDS": "600"})
    taken = T + timedelta(seconds=720)
    back = scheduler_cycle(now=taken)
    assert back.preempted == [lent.pk]
    ev = JobEvent.objects.get(job_id=lent.pk, kind=JobEvent.Kind.PREEMPTED)
    assert "rule W4" in ev.reason and ev.data["booking"] == booking.pk
    # The lent job saves and exits (its stop time); then vision has its GPUs back.
    scheduler_cycle(now=taken + timedelta(seconds=5))
    assert fresh(again).status == JobState.QUEUED
    scheduler_cycle(now=taken + timedelta(seconds=STOP_SECONDS + 1))
    scheduler_cycle(now=taken + timedelta(seconds=STOP_SECONDS + 2))
    again = fresh(again)
    assert again.status == JobState.RUNNING
    assert again.started_at is not None
    assert again.started_at - taken <= timedelta(seconds=STOP_SECONDS + 2)
    assert nodes_of(again) < booked_nodes
    assert fresh(lent).status == JobState.QUEUED  # requeued: 2 x 8 no longer fit



@pytest.mark.xfail(strict=True, reason=(
    "known: a lent job taken back by rule W4 that stops before its grace is over is "
    "lent the same GPUs again ahead of the booking team's waiting job (rule W2 still "
    "counts the victim's GPUs as stopping until its grace ends), cycle after cycle"))
def test_rule_w4_a_job_taken_back_is_not_lent_again_ahead_of_the_team(
        world: World, settings: Any) -> None:
    settings.FAIRQ_SIM_NODES = "2x8xh100,2x8xa100"
    settings.FAIRQ_SIM_STOP_SECONDS = STOP_SECONDS
    reset_backends()
    t0 = timezone.now() + timedelta(seconds=1)
    T = (t0 + timedelta(minutes=10)).replace(microsecond=0)
    r = world.client(world.admin).post("/api/v1/reservations/", {
        "team": "vision", "gpu_type": "h100", "gpus": 16, "starts_at": T.isoformat(),
        "duration": "1h"}, format="json")
    assert r.status_code == 201, r.json()
    scheduler_cycle(now=T)
    lent = submit(world, world.outsider, team="nlp", name="lent", gpus=8, tier="low",
                  max_runtime_seconds=1800, env={"FAIRQ_SIM_SECONDS": "1700"},
                  termination_grace_seconds=STOP_SECONDS + 10)  # stops before its grace
    scheduler_cycle(now=T + timedelta(seconds=10))
    scheduler_cycle(now=T + timedelta(seconds=11))
    assert fresh(lent).status == JobState.RUNNING
    team = submit(world, world.admin, team="vision", name="gang", gpus=8, replicas=2,
                  max_runtime_seconds=1200, env={"FAIRQ_SIM_SECONDS": "600"})
    taken = T + timedelta(seconds=20)
    assert scheduler_cycle(now=taken).preempted == [lent.pk]
    for k in range(1, 61, 5):  # a minute of 5 s cycles: the grace and more
        scheduler_cycle(now=taken + timedelta(seconds=k))
    assert fresh(team).status == JobState.RUNNING
