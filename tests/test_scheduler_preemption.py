"""Preemption through the scheduler cycle and its service (rules R2, R3, R5-R8), on the
simulated cluster (2 × 8 h100, 2 × 8 a100 in the test settings)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from queueing.backends.simulated import SimulatedCluster
from queueing.composition import get_backend
from queueing.models import Job, JobEvent, Quota, UsageRecord
from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.states import JobState
from queueing.selectors.preemption import preemption_settings
from queueing.selectors.snapshot import build_snapshot
from queueing.services.preemption import preemptions_apply
from queueing.services.scheduler import scheduler_cycle

from .conftest import World, job_body

# R9 off: these tests submit at the wall clock and run cycles at chosen instants (no_r9).
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_r9")]


def submit(world: World, user: Any = None, **body: Any) -> int:
    r = world.client(user or world.member).post("/api/v1/jobs/", job_body(**body),
                                                 format="json")
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


def job(job_id: int) -> Job:
    return Job.objects.get(pk=job_id)


def fill_h100(world: World, t0: datetime, *, tier: str = "low", n: int = 2) -> list[int]:
    """Vision fills both h100 nodes with `n` jobs of 16 / n GPUs, all running."""
    ids = [submit(world, name=f"fill-{i}", tier=tier, gpus=16 // n,
                  env={"FAIRQ_SIM_SECONDS": "5000"}) for i in range(n)]
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert all(job(i).status == JobState.RUNNING for i in ids)
    return ids


class SlowStopCluster(SimulatedCluster):
    """A cluster whose workloads take time to go after a stop, like Kubernetes pods:
    they keep their GPUs and stay listed until `finish_stops()`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stopping: list[str] = []

    def stop(self, name: str, *, now: datetime) -> None:
        if name not in self.stopping:
            self.stopping.append(name)

    def finish_stops(self, now: datetime) -> None:
        for name in self.stopping:
            super().stop(name, now=now)
        self.stopping.clear()



def test_rule_r6_a_victim_requeues_with_its_age_attempt_plus_one_and_is_charged(
    world: World,
) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    victim, other = fill_h100(world, t0)
    created = job(victim).created_at
    hi = submit(world, world.outsider, team="nlp", tier="high", gpus=8)
    r = scheduler_cycle(now=t0 + timedelta(seconds=100))
    assert len(r.preempted) == 1
    v = job(r.preempted[0])
    assert v.status == JobState.QUEUED and v.attempt == 2 and v.created_at == created
    assert v.placement == [] and v.started_at is None and v.submitted_to_backend_at is None
    usage = UsageRecord.objects.get(job=v, attempt=1)
    assert usage.gpu_seconds == 8 * 100 and usage.billing_weight == 2.0  # started at t0
    assert job(hi).status == JobState.QUEUED
    # R4: same tier, same start: the lower id goes.
    assert (v.pk, job(other).status) == (victim, JobState.RUNNING)


def test_rule_r7_events_on_both_jobs_name_the_rule_and_the_other_job(world: World) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    fill_h100(world, t0)
    hi = submit(world, world.outsider, team="nlp", tier="high", gpus=8)
    (victim,) = scheduler_cycle(now=t0 + timedelta(seconds=5)).preempted
    ev = JobEvent.objects.get(job_id=victim, kind=JobEvent.Kind.PREEMPTED)
    assert ev.data["rule"] == "R1-priority" and ev.data["preemptor"] == hi
    assert ev.data["preemptor_team"] == "nlp" and ev.attempt == 1
    # nlp's 8 are within its nominal: the claim was owed (rule R11), and both events say so.
    assert ev.data["owed"] is True and ev.reason.endswith("nominal GPUs (rule R11)")
    moved = list(JobEvent.objects.filter(job_id=victim, kind=JobEvent.Kind.TRANSITION)
                 .values_list("from_status", "to_status", "attempt"))
    assert moved[-2:] == [("RUNNING", "PREEMPTED", 1), ("PREEMPTED", "QUEUED", 2)]
    pe = JobEvent.objects.get(job_id=hi, kind=JobEvent.Kind.PREEMPTING)
    assert pe.data["victims"] == [victim] and pe.data["rules"] == {str(victim): "R1-priority"}
    assert pe.reason.startswith("preempted 1 job(s) to fit") and pe.data["owed"] is True


def test_rule_r2_a_team_within_nominal_reclaims_borrowed_gpus(world: World) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    # Vision borrows 8 beyond its nominal of 8 at tier normal; nlp asks 8 (its nominal).
    ids = fill_h100(world, t0, tier="normal")
    hi = submit(world, world.outsider, team="nlp", tier="normal", gpus=8)
    r = scheduler_cycle(now=t0 + timedelta(seconds=5))
    assert len(r.preempted) == 1 and r.preempted[0] in ids
    assert JobEvent.objects.get(job_id=r.preempted[0], kind=JobEvent.Kind.PREEMPTED).data["rule"] == \
        "R2-reclaim"
    assert r.plan is not None and r.plan.waits[hi].reason == WaitReason.PREEMPTING
    r = scheduler_cycle(now=t0 + timedelta(seconds=6))
    assert r.admitted == [hi]


def test_rule_r2_no_reclaim_from_a_team_within_its_nominal(world: World) -> None:
    Quota.objects.filter(team=world.vision, gpu_type=world.h100).update(nominal=16)
    t0 = timezone.now() + timedelta(seconds=1)
    fill_h100(world, t0, tier="normal")
    hi = submit(world, world.outsider, team="nlp", tier="normal", gpus=8)
    r = scheduler_cycle(now=t0 + timedelta(seconds=5))
    assert r.preempted == [] and r.plan is not None
    assert r.plan.waits[hi].reason == WaitReason.CAPACITY


def test_rule_r3_a_non_preemptible_tier_and_a_young_job_are_never_victims(
    world: World,
) -> None:
    world.low.min_runtime_seconds = 600
    world.low.save()
    # A claim beyond nlp's nominal: an owed one is not held back by R3 (rule R11).
    Quota.objects.filter(team=world.nlp, gpu_type=world.h100).update(nominal=0)
    t0 = timezone.now() + timedelta(seconds=1)
    fill_h100(world, t0)
    hi = submit(world, world.outsider, team="nlp", tier="critical", gpus=8)
    r = scheduler_cycle(now=t0 + timedelta(seconds=60))
    assert r.preempted == [] and job(hi).status == JobState.QUEUED
    r = scheduler_cycle(now=t0 + timedelta(seconds=601))
    assert len(r.preempted) == 1  # old enough now


@override_settings(FAIRQ_PREEMPTION_MAX_PER_TEAM=1, FAIRQ_PREEMPTION_WINDOW_SECONDS=600)
def test_rule_r5_the_rate_limit_counts_preempted_events_in_the_window(world: World) -> None:
    # Vision is guaranteed nothing: all its h100 jobs borrow (rule Q2 lets them go).
    Quota.objects.filter(team=world.vision, gpu_type=world.h100).update(
        nominal=0, borrowing_limit=None)
    t0 = timezone.now() + timedelta(seconds=1)
    fill_h100(world, t0)
    a = submit(world, world.outsider, team="nlp", tier="high", gpus=8, name="a",
               env={"FAIRQ_SIM_SECONDS": "5000"})
    b = submit(world, world.outsider, team="nlp", tier="high", gpus=8, name="b")
    r = scheduler_cycle(now=t0 + timedelta(seconds=10))
    assert len(r.preempted) == 1
    assert r.plan is not None and r.plan.waits[b].reason == WaitReason.RATE_LIMITED
    assert preemption_settings(now=t0 + timedelta(seconds=10)).used == {"nlp": 1}
    r = scheduler_cycle(now=t0 + timedelta(seconds=11))
    assert r.admitted == [a] and r.preempted == []
    # Once the first preemption left the window, nlp may preempt again.
    r = scheduler_cycle(now=t0 + timedelta(seconds=611))
    assert len(r.preempted) == 1 and r.plan is not None
    assert r.plan.waits[b].reason == WaitReason.PREEMPTING


def test_rule_r8_a_preemptor_waits_for_its_victims_and_picks_no_more(world: World) -> None:
    backend = SlowStopCluster([("sim-h100-000", "h100", 8), ("sim-h100-001", "h100", 8)])
    t0 = timezone.now() + timedelta(seconds=1)
    ids = [submit(world, name=f"fill-{i}", tier="low", gpus=4,
                  env={"FAIRQ_SIM_SECONDS": "5000"}) for i in range(4)]
    scheduler_cycle(now=t0, backend=backend)
    scheduler_cycle(now=t0 + timedelta(seconds=1), backend=backend)
    assert all(job(i).status == JobState.RUNNING for i in ids)
    hi = submit(world, world.outsider, team="nlp", tier="high", gpus=8)
    r = scheduler_cycle(now=t0 + timedelta(seconds=10), backend=backend)
    assert len(r.preempted) == 2 and backend.stopping
    # The victims' pods are still there: no admission, no new victims, for many cycles.
    for s in range(11, 100, 7):
        r = scheduler_cycle(now=t0 + timedelta(seconds=s), backend=backend)
        assert r.preempted == [] and r.admitted == []
        assert r.plan is not None and r.plan.waits[hi].reason == WaitReason.PREEMPTING
    backend.finish_stops(t0 + timedelta(seconds=100))
    r = scheduler_cycle(now=t0 + timedelta(seconds=101), backend=backend)
    assert r.admitted == [hi] and r.preempted == []


def test_a_preemption_whose_victim_moved_is_dropped_whole(world: World) -> None:
    t0 = timezone.now() + timedelta(seconds=1)
    ids = fill_h100(world, t0, n=4)
    hi = submit(world, world.outsider, team="nlp", tier="high", gpus=8)
    backend = get_backend()
    plan = plan_admissions(build_snapshot(backend=backend, now=t0 + timedelta(seconds=5)))
    (p,) = plan.preemptions
    assert len(p.victims) == 2
    # One victim finishes before the plan is applied: nothing of the preemption happens.
    Job.objects.filter(pk=p.victims[1].job_id).update(status=JobState.SUCCEEDED)
    applied = preemptions_apply(plan=plan, now=t0 + timedelta(seconds=5))
    assert applied.preempted == [] and applied.workloads == []
    assert job(p.victims[0].job_id).status == JobState.RUNNING
    assert not JobEvent.objects.filter(job_id=hi, kind=JobEvent.Kind.PREEMPTING).exists()
    assert not UsageRecord.objects.filter(job_id__in=ids).exists()


def test_a_stale_plan_applied_twice_preempts_once(world: World) -> None:
    """The compare-and-swap of rule S1 is the second line behind the cycle lock: a
    second worker applying the same plan finds the victims moved and does nothing."""
    from django.db import transaction

    t0 = timezone.now() + timedelta(seconds=1)
    fill_h100(world, t0)
    hi = submit(world, world.outsider, team="nlp", tier="high", gpus=8)
    plan = plan_admissions(build_snapshot(backend=get_backend(), now=t0 + timedelta(seconds=5)))
    with transaction.atomic():
        first = preemptions_apply(plan=plan, now=t0 + timedelta(seconds=5))
    with transaction.atomic():
        second = preemptions_apply(plan=plan, now=t0 + timedelta(seconds=6))
    assert len(first.preempted) == 1 and second.preempted == []
    (victim,) = first.preempted
    assert job(victim).attempt == 2
    assert JobEvent.objects.filter(job_id=victim, kind=JobEvent.Kind.PREEMPTED).count() == 1
    assert JobEvent.objects.filter(job_id=hi, kind=JobEvent.Kind.PREEMPTING).count() == 1
    assert UsageRecord.objects.filter(job_id=victim).count() == 1


def test_rule_r7_a_gang_preempting_many_small_jobs_is_recorded_within_the_reason_column(
    world: World,
) -> None:
    """16 one-GPU jobs fill both h100 nodes; a high-tier gang of 2 × 8 GPUs preempts all
    16. The preemptor's event names the victims that fit in the reason column and says
    how many more (the listing of 16 once overflowed it on PostgreSQL and every
    preemption of the cycle failed)."""
    from accounts.models import Team

    long_slug = "computer-vision-research-eu-west-1"  # a real team's kind of name
    Team.objects.filter(pk=world.vision.pk).update(slug=long_slug)
    # Vision is guaranteed nothing: all its h100 jobs borrow (rule Q2 lets them go).
    Quota.objects.filter(team=world.vision, gpu_type=world.h100).update(
        nominal=0, borrowing_limit=None)
    t0 = timezone.now() + timedelta(seconds=1)
    ids = [submit(world, team=long_slug, name=f"small-{i}", tier="low", gpus=1,
                  env={"FAIRQ_SIM_SECONDS": "5000"}) for i in range(16)]
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert all(job(i).status == JobState.RUNNING for i in ids)
    hi = submit(world, world.outsider, team="nlp", tier="high", gpus=8, replicas=2)
    r = scheduler_cycle(now=t0 + timedelta(seconds=10))
    assert sorted(r.preempted) == sorted(ids)
    event = JobEvent.objects.get(job_id=hi, kind=JobEvent.Kind.PREEMPTING)
    assert sorted(event.data["victims"]) == sorted(ids)
    assert len(event.reason) <= 500
    assert event.reason.startswith("preempted 16 job(s) to fit: #")
    assert " more; admitted once their GPUs are free" in event.reason


def test_rule_r3_the_snapshot_counts_each_holding_jobs_past_preemptions(world: World) -> None:
    """The cycle's snapshot tells the policy how often each job holding GPUs was
    preempted (its `preempted` events), for rule R3's per-job limit."""
    t0 = timezone.now() + timedelta(seconds=1)
    a, b = fill_h100(world, t0)
    Job.objects.filter(pk=a).update(attempt=4)
    for attempt in (1, 2, 3):
        JobEvent.objects.create(job_id=a, at=t0, kind=JobEvent.Kind.PREEMPTED,
                                attempt=attempt, actor_label="scheduler", reason="test",
                                data={"preemptor_team": "nlp"})
    snap = build_snapshot(backend=get_backend(), now=t0 + timedelta(seconds=2))
    counts = {r.id: r.preemptions for r in snap.running}
    assert counts == {a: 3, b: 0}


def test_rule_q2_a_team_reclaims_its_nominal_from_borrowed_non_preemptible_jobs(
    world: World,
) -> None:
    """The demo's case: vision runs non-preemptible `critical` jobs on all 16 h100 GPUs
    (its nominal is 8); nlp's normal-tier job within nlp's nominal takes 8 back."""
    t0 = timezone.now() + timedelta(seconds=1)
    ids = fill_h100(world, t0, tier="critical")
    mine = submit(world, world.outsider, team="nlp", tier="normal", gpus=8)
    r = scheduler_cycle(now=t0 + timedelta(seconds=5))
    assert len(r.preempted) == 1 and r.preempted[0] in ids
    ev = JobEvent.objects.get(job_id=r.preempted[0], kind=JobEvent.Kind.PREEMPTED)
    assert ev.data["rule"] == "R2-reclaim"
    assert scheduler_cycle(now=t0 + timedelta(seconds=6)).admitted == [mine]
    # Vision is back at its nominal: its other critical job is never a victim now.
    more = submit(world, world.outsider, team="nlp", tier="normal", gpus=8)
    r = scheduler_cycle(now=t0 + timedelta(seconds=7))
    assert r.preempted == [] and r.plan is not None
    assert r.plan.waits[more].reason != WaitReason.PREEMPTING


@override_settings(FAIRQ_PREEMPTION_LOST_PER_WAIT=2.0)
def test_rule_r9_the_cycle_preempts_only_once_the_wait_is_worth_the_loss(world: World) -> None:
    """The 8-GPU victims started at t0; an 8-GPU high job queued at t0 + 50 s may make
    its victim lose at most 2 × 8 × its wait in GPU-seconds: not at t0 + 60 s (480 to
    lose, 160 allowed), yes at t0 + 200 s (1,600 to lose, 2,400 allowed)."""
    # A claim beyond nlp's nominal: an owed one is not judged by R9 (rule R11).
    Quota.objects.filter(team=world.nlp, gpu_type=world.h100).update(nominal=0)
    t0 = timezone.now() + timedelta(seconds=1)
    fill_h100(world, t0)
    hi = submit(world, world.outsider, team="nlp", tier="high", gpus=8)
    Job.objects.filter(pk=hi).update(created_at=t0 + timedelta(seconds=50))
    r = scheduler_cycle(now=t0 + timedelta(seconds=60))
    assert r.preempted == [] and r.plan is not None
    assert "rule R9" in r.plan.waits[hi].message
    r = scheduler_cycle(now=t0 + timedelta(seconds=200))
    assert len(r.preempted) == 1
    ev = JobEvent.objects.get(job_id=r.preempted[0], kind=JobEvent.Kind.PREEMPTED)
    assert ev.data["owed"] is False and "R11" not in ev.reason
