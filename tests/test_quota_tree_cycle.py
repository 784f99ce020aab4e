"""Quotas in a tree through the live cycle (docs/scheduling.md, rules Q3-Q7): departments
and teams with `Team.parent` and `Quota` rows on PostgreSQL, the real scheduler cycle
on the simulated cluster (2 × 8 h100 in the test settings). A team within its and its
department's guarantee takes back what a team of another department borrows; its wait
and the events name the rule."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from queueing.composition import get_backend
from queueing.models import Job, JobEvent, Quota
from queueing.policy.admission import WaitReason
from queueing.policy.states import JobState
from queueing.selectors.snapshot import build_snapshot
from queueing.services.scheduler import scheduler_cycle

from .conftest import World, job_body
from .factories import TeamFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("no_r9")]


def submit(world: World, user: Any, **body: Any) -> int:
    r = world.client(user).post("/api/v1/jobs/", job_body(**body), format="json")
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


def departments(world: World) -> None:
    """research (h100 nominal 8) over vision (4) and nlp (4); audio (8) over speech (8,
    no borrowing limit): the fleet's 16 h100 carved in two departments."""
    research = TeamFactory(slug="research")
    audio = TeamFactory(slug="audio")
    for team, parent in ((world.vision, research), (world.nlp, research),
                         (world.speech, audio)):
        team.parent = parent
        team.save(update_fields=["parent"])
    h100 = world.h100
    Quota.objects.filter(gpu_type=h100).delete()
    for team, nominal, borrowing in ((research, 8, None), (world.vision, 4, None),
                                     (world.nlp, 4, None), (audio, 8, None),
                                     (world.speech, 8, None)):
        Quota.objects.create(team=team, gpu_type=h100, nominal=nominal,
                             borrowing_limit=borrowing)


def test_the_snapshot_reads_team_parent_for_the_quota_tree(world: World) -> None:
    departments(world)
    s = build_snapshot(backend=get_backend(), now=timezone.now())
    assert s.team_parent["vision"] == "research" and s.team_parent["speech"] == "audio"
    assert s.team_parent["research"] is None
    assert s.quotas[("research", "h100")].nominal == 8


def test_rule_q6_a_team_within_its_guarantee_reclaims_from_another_department(
    world: World,
) -> None:
    departments(world)
    t0 = timezone.now() + timedelta(seconds=1)
    # speech (audio) borrows research's idle 8: it runs on all 16 GPUs.
    fills = [submit(world, world.staff, team="speech", name=f"fill-{i}", tier="normal",
                    gpus=8, env={"FAIRQ_SIM_SECONDS": "5000"}) for i in range(2)]
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    assert all(Job.objects.get(pk=i).status == JobState.RUNNING for i in fills)
    # nlp asks its nominal 4: nlp and research within their guarantee (rule Q7: owed).
    claim = submit(world, world.outsider, team="nlp", tier="normal", gpus=4)
    r = scheduler_cycle(now=t0 + timedelta(seconds=5))
    assert len(r.preempted) == 1 and r.preempted[0] in fills
    ev = JobEvent.objects.get(job_id=r.preempted[0], kind=JobEvent.Kind.PREEMPTED)
    assert ev.data["rule"] == "Q6-reclaim" and ev.data["preemptor"] == claim
    assert ev.data["owed"] is True and "rule Q6-reclaim" in ev.reason
    assert r.plan is not None
    wait = r.plan.waits[claim]
    assert wait.reason == WaitReason.PREEMPTING and "Q6-reclaim" in wait.message
    pe = JobEvent.objects.get(job_id=claim, kind=JobEvent.Kind.PREEMPTING)
    assert pe.data["rules"] == {str(r.preempted[0]): "Q6-reclaim"}
    # The victim's GPUs are free: the next cycle admits the claim.
    r = scheduler_cycle(now=t0 + timedelta(seconds=6))
    assert r.admitted == [claim]


def test_rule_q4_the_wait_names_the_departments_limit(world: World) -> None:
    """research may borrow at most 2 beyond its 8. vision holds 8 (4 of them nlp's lent
    share): vision's third job of 4 waits, its why-pending naming the department; nlp's
    job of 4, within its guarantee, takes its share back from vision (rule Q6)."""
    departments(world)
    Quota.objects.filter(team__slug="research").update(borrowing_limit=2)
    now = timezone.now() + timedelta(seconds=1)
    held = [submit(world, world.member, name=f"v-{i}", gpus=4) for i in range(2)]
    scheduler_cycle(now=now)
    assert all(Job.objects.get(pk=i).status == JobState.ADMITTED for i in held)
    third = submit(world, world.member, name="v-2", gpus=4)
    nlp = submit(world, world.outsider, team="nlp", gpus=4)
    r = scheduler_cycle(now=now + timedelta(seconds=1))
    assert r.admitted == [] and len(r.preempted) == 1 and r.preempted[0] in held
    ev = JobEvent.objects.get(job_id=r.preempted[0], kind=JobEvent.Kind.PREEMPTED)
    assert ev.data["rule"] == "Q6-reclaim" and ev.data["preemptor"] == nlp
    got = world.client(world.member).get(f"/api/v1/jobs/{third}/").json()
    reasons = got["queue"]["reasons"]
    assert reasons[0]["code"] == "quota"
    assert reasons[0]["message"].startswith(
        "department research (above team vision) may hold at most 10 h100 GPUs "
        "(nominal 8 + borrowing limit 2) and holds")
