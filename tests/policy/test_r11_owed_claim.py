"""Rule R11, owed claims preempt at once (docs/scheduling.md): a job whose team's GPUs of
a type held at its tier or above, plus its own, fit in the team's nominal quota is owed
them; it preempts in the first pass whatever its wait so far - rule R9 (and R9's
remembered refusal), R5's rate limit, R3's minimum runtime and per-job limit and the
pass's search budget do not stop it - unless its tier is one whose owed claims wait.
Which jobs are victims stays rules R1, R2 and Q2. Table tests, then a property over
random snapshots."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.preemption import PreemptionRule, find_victims, owed_claim
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)
from queueing.policy.workspace import Workspace

from .test_admission import NOW, nodes, q, run
from .test_admission import snap as _snap
from .test_preemption import victims

LOW, NORMAL, HIGH = 0, 100, 200
FULL = nodes(("h100", 8, 0), ("h100", 8, 0))
# The product's defaults: rule R9 at 0.4, R5 at 20 per window, R3's limit of 3.
DEFAULTS = PreemptionSettings()


def snap(**kw: Any) -> Snapshot:
    kw.setdefault("preemption", DEFAULTS)
    kw.setdefault("nodes", FULL)
    return _snap(**kw)


def two_low_jobs(team: str = "vision", **kw: Any) -> tuple[RunningJob, RunningJob]:
    """Two 8-GPU low-tier jobs of `team`, running for an hour, one per node."""
    return (run(1, team, gpus=8, on=("h100-0",), tier=LOW, **kw),
            run(2, team, gpus=8, on=("h100-1",), tier=LOW, **kw))


VISION_16 = {("vision", "h100"): QuotaLimit(16)}


def control_plane(**pre: Any) -> Snapshot:
    """The control plane's case: team vision, nominal 16 h100, runs two 8-GPU low jobs
    for an hour; its high 8-GPU job has just been submitted."""
    return snap(running=two_low_jobs(), quotas=VISION_16,
                queued=(q(100, "vision", gpus=8, tier=HIGH),),
                preemption=replace(DEFAULTS, **pre))


def preempted_for(plan: Any, job_id: int) -> bool:
    return any(p.preemptor_id == job_id for p in plan.preemptions)


# --- the definition --------------------------------------------------------------------

@pytest.mark.parametrize(
    ("running", "nominal", "asks", "owed"),
    [
        ((), 16, 8, True),
        ((run(1, "vision", gpus=8, tier=LOW),), 8, 8, True),  # a lower tier does not count
        ((run(1, "vision", gpus=8, tier=HIGH),), 16, 8, True),  # 8 + 8 = 16
        ((run(1, "vision", gpus=8, tier=HIGH),), 8, 8, False),  # beyond its nominal
        ((run(1, "vision", gpus=4, tier=NORMAL),), 8, 8, False),  # a higher tier counts
        ((run(1, "other", gpus=8, tier=HIGH),), 8, 8, True),  # another team's does not
        ((run(1, "vision", gpus=8, tier=LOW, gpu_type="a100"),), 8, 8, True),  # other type
        ((), 0, 1, False),  # no nominal, nothing owed
    ])
def test_rule_r11_owed_is_held_at_its_tier_or_above_plus_its_own_within_nominal(
    running: tuple[RunningJob, ...], nominal: int, asks: int, owed: bool,
) -> None:
    s = snap(running=running, quotas={("vision", "h100"): QuotaLimit(nominal)})
    assert owed_claim(s, q(100, "vision", gpus=asks, tier=NORMAL), "h100") is owed


# --- the control plane's case ----------------------------------------------------------

@pytest.mark.parametrize(
    ("case", "pre"),
    [
        ("defaults", {}),
        ("R9 at any ratio", {"lost_per_wait": 0.0}),
        ("the tier's own R9 ratio", {"lost_per_wait_by_tier": {HIGH: 0.0}}),
        ("R5: no preemption left in the window", {"max_per_team": 2, "used": {"vision": 2}}),
        ("R4: no search left in the pass", {"max_searches": 0}),
        ("R3: victims preempted too often", {"max_preemptions_per_job": 0}),
    ])
def test_rule_r11_a_high_job_within_nominal_preempts_its_teams_low_job_in_the_first_pass(
    case: str, pre: dict[str, Any],
) -> None:
    plan = plan_admissions(control_plane(**pre))
    assert len(victims(plan, 100)) == 1, case
    (p,) = plan.preemptions
    assert p.owed and p.victims[0].rule is PreemptionRule.PRIORITY
    wait = plan.waits[100]
    assert wait.reason is WaitReason.PREEMPTING
    assert wait.message.startswith(
        "owed 8 of team vision's 16 nominal h100 GPUs (rule R11): preempting 1 job(s)")


def test_rule_r11_the_victims_minimum_runtime_does_not_protect_them() -> None:
    s = snap(running=two_low_jobs(min_runtime=7200), quotas=VISION_16,
             queued=(q(100, "vision", gpus=8, tier=HIGH),))
    assert len(victims(plan_admissions(s), 100)) == 1


def test_rule_r11_the_wait_names_the_victims_termination_grace() -> None:
    running = tuple(replace(r, grace_seconds=g) for r, g in zip(two_low_jobs(), (30, 30),
                                                                 strict=True))
    plan = plan_admissions(snap(running=running, quotas=VISION_16,
                                queued=(q(100, "vision", gpus=8, tier=HIGH),)))
    assert plan.waits[100].message.endswith(
        "admitted once their GPUs are free, within their termination grace (30 s)")


def test_rule_r11_a_tier_whose_owed_claims_wait_is_judged_by_rule_r9() -> None:
    plan = plan_admissions(control_plane(owed_waits_tiers=frozenset({HIGH})))
    assert plan.preemptions == ()
    wait = plan.waits[100]
    assert wait.reason is WaitReason.CAPACITY
    assert "preempting now would lose 8.00 GPU-hours" in wait.message
    assert "(rule R9)" in wait.message and "R11" not in wait.message


def test_rule_r11_a_tier_without_r9_preempts_even_beyond_its_nominal() -> None:
    # Rule R9's ratio per tier: None = no check for the tier.
    s = snap(running=two_low_jobs(), quotas={("vision", "h100"): QuotaLimit(0)},
             queued=(q(100, "vision", gpus=8, tier=HIGH),),
             preemption=replace(DEFAULTS, lost_per_wait_by_tier={HIGH: None}))
    plan = plan_admissions(s)
    assert len(victims(plan, 100)) == 1 and not plan.preemptions[0].owed


# --- beyond the nominal: the ordinary rules --------------------------------------------

def test_rule_r11_a_job_beyond_its_nominal_still_waits_by_rule_r9() -> None:
    # vision's nominal is 8 and its high job already holds it: the next high job borrows,
    # and R9 refuses to throw away an hour of a low job for a job that just arrived.
    running = (run(1, "vision", gpus=8, on=("h100-0",), tier=HIGH),
               run(2, "vision", gpus=8, on=("h100-1",), tier=LOW))
    s = snap(running=running, quotas={("vision", "h100"): QuotaLimit(8)},
             queued=(q(100, "vision", gpus=8, tier=HIGH),))
    plan = plan_admissions(s)
    assert plan.preemptions == ()
    assert plan.waits[100].reason is WaitReason.CAPACITY
    assert "(rule R9)" in plan.waits[100].message
    assert dict(plan.wait_causes())[100] == "capacity:not_worth_it"
    # Once it has waited long enough (0.4 × 8 GPUs × 2.5 h = 8 GPU-hours), it preempts.
    later = replace(s, queued=(q(100, "vision", gpus=8, tier=HIGH, age=2.5 * 3600),))
    assert len(victims(plan_admissions(later), 100)) == 1


def test_rule_r11_two_jobs_are_not_owed_the_same_nominal_gpus() -> None:
    # Nominal 8: the first high job is owed and preempts; the second would pass the
    # nominal with the first (counted in the same pass) and waits by rule R9.
    s = snap(running=two_low_jobs(), quotas={("vision", "h100"): QuotaLimit(8)},
             queued=(q(100, "vision", gpus=8, tier=HIGH, age=60),
                     q(101, "vision", gpus=8, tier=HIGH)))
    plan = plan_admissions(s)
    assert [p.preemptor_id for p in plan.preemptions] == [100]
    assert "(rule R9)" in plan.waits[101].message


def test_rule_r11_r5_still_counts_an_owed_claims_preemptions_for_other_claims() -> None:
    # One preemption per window: the owed job takes it; vision's next job (beyond its
    # nominal, its tier without R9) is refused by rule R5.
    s = snap(running=two_low_jobs(), quotas={("vision", "h100"): QuotaLimit(8)},
             queued=(q(100, "vision", gpus=8, tier=HIGH, age=60),
                     q(101, "vision", gpus=8, tier=HIGH)),
             preemption=replace(DEFAULTS, max_per_team=1, lost_per_wait_by_tier={HIGH: None}))
    plan = plan_admissions(s)
    assert [p.preemptor_id for p in plan.preemptions] == [100]
    assert plan.waits[101].reason is WaitReason.RATE_LIMITED


# --- rule R2: borrowers reclaimed at once ---------------------------------------------

@pytest.mark.parametrize(
    ("borrower_tier", "preemptible", "rule"),
    [
        (NORMAL, True, PreemptionRule.RECLAIM),  # the same tier: rule R2
        (LOW, True, PreemptionRule.PRIORITY),  # a lower tier: rule R1 allows it too
        (HIGH, False, PreemptionRule.RECLAIM),  # rule Q2: non-preemptible, any tier
    ])
def test_rule_r11_a_borrower_of_another_team_is_reclaimed_at_once(
    borrower_tier: int, preemptible: bool, rule: PreemptionRule,
) -> None:
    # Team a (nominal 8, holds nothing) submits a normal 8-GPU job; team b (nominal 0)
    # borrows both nodes with jobs that ran an hour. R9 alone would keep a waiting for
    # 2.5 hours.
    running = (run(1, "b", gpus=8, on=("h100-0",), tier=borrower_tier, preemptible=preemptible),
               run(2, "b", gpus=8, on=("h100-1",), tier=borrower_tier, preemptible=preemptible))
    s = snap(running=running, quotas={("a", "h100"): QuotaLimit(8), ("b", "h100"): QuotaLimit(0)},
             queued=(q(100, "a", gpus=8, tier=NORMAL),))
    plan = plan_admissions(s)
    assert len(victims(plan, 100)) == 1
    assert plan.preemptions[0].owed and plan.preemptions[0].victims[0].rule is rule


def test_rule_r11_a_team_within_its_nominal_is_not_a_source_of_victims() -> None:
    # b holds exactly its nominal: nothing is borrowed, so nothing is reclaimed (Q2), and
    # a's owed job waits, saying so.
    running = (run(1, "b", gpus=8, on=("h100-0",), tier=LOW),
               run(2, "b", gpus=8, on=("h100-1",), tier=LOW))
    s = snap(running=running, quotas={("a", "h100"): QuotaLimit(8), ("b", "h100"): QuotaLimit(16)},
             queued=(q(100, "a", gpus=8, tier=LOW),))
    plan = plan_admissions(s)
    assert plan.preemptions == ()
    assert plan.waits[100].reason is WaitReason.CAPACITY
    assert ("it is owed 8 of team a's 8 nominal h100 GPUs (rule R11), but the jobs it may "
            "preempt (rules R1, R2) cannot make room for it") in plan.waits[100].message
    assert dict(plan.wait_causes())[100] == "capacity:no_victim"


def test_rule_r11_a_nominated_owed_job_waiting_for_its_victims_says_so() -> None:
    s = snap(nodes=nodes(("h100", 8, 0), ("h100", 8, 0)), running=two_low_jobs(),
             quotas=VISION_16, queued=(q(100, "vision", gpus=8, tier=HIGH),),
             nominated={100: 1})
    plan = plan_admissions(s)
    assert plan.preemptions == ()
    assert plan.waits[100].reason is WaitReason.PREEMPTING
    assert plan.waits[100].message == (
        "owed 8 of team vision's 16 nominal h100 GPUs (rule R11): waiting for 1 preempted "
        "job(s) to release their h100 GPUs")


# --- several GPU types (rules G1-G5): owed per type tried ------------------------------

def _two_types(order: tuple[str, ...]) -> Snapshot:
    # Both types full with team b's low jobs that ran an hour; team a is owed a100 (its
    # nominal 8) but not h100 (nominal 0), where b borrows nothing either.
    running = (run(1, "b", gpus=8, on=("h100-0",), tier=LOW),
               run(2, "b", gpus=8, on=("a100-0",), tier=LOW, gpu_type="a100"))
    job = replace(q(100, "a", gpus=8, tier=HIGH, gpu_type=order[0]), gpu_types=order)
    return snap(nodes=nodes(("h100", 8, 0), ("a100", 8, 0)), running=running,
                quotas={("a", "a100"): QuotaLimit(8), ("b", "h100"): QuotaLimit(8)},
                queued=(job,))


@pytest.mark.parametrize("order", [("h100", "a100"), ("a100", "h100")])
def test_rule_r11_a_job_of_several_types_is_owed_per_type_tried(order: tuple[str, ...]) -> None:
    plan = plan_admissions(_two_types(order))
    (p,) = plan.preemptions
    assert p.gpu_type == "a100" and p.owed and [v.job_id for v in p.victims] == [2]
    assert "owed 8 of team a's 8 nominal a100 GPUs (rule R11)" in plan.waits[100].message


# --- the property: an owed job with victims enough never waits for R3/R5/R9/budget -----

TEAMS = ("a", "b", "c")
TIERS = (LOW, NORMAL, HIGH)


@st.composite
def owed_worlds(draw: st.DrawFn) -> tuple[Snapshot, QueuedJob]:
    """A busy cluster of one or two GPU types, running jobs of every tier with random
    starts, checkpoints, minimum runtimes, preemption counts; random quotas and
    preemption settings (rate limits spent, no search budget, R9 ratios per tier); one
    queued job of the highest queued tier (first in rule P2's order) and a few lower-tier
    jobs behind it."""
    rnd = random.Random(draw(st.integers(0, 2**32)))
    types = ("h100", "a100")[: rnd.choice((1, 2))]
    node_list: list[NodeState] = []
    free: dict[str, int] = {}
    for gt in types:
        for i in range(rnd.randrange(1, 4)):
            cap = rnd.choice((4, 8))
            node_list.append(NodeState(f"{gt}-{i}", gt, cap, cap))
            free[f"{gt}-{i}"] = cap
    running: list[RunningJob] = []
    for job_id in range(1, rnd.randrange(0, 14) + 1):
        gt = rnd.choice(types)
        g, reps = rnd.choice((1, 2, 4, 8)), rnd.choice((1, 1, 2))
        placed = []
        for _ in range(reps):
            room = [n.name for n in node_list if n.gpu_type == gt and free[n.name] >= g]
            if not room:
                break
            placed.append(rnd.choice(room))
            free[placed[-1]] -= g
        if len(placed) < reps:
            for n in placed:
                free[n] += g
            continue
        started = rnd.choice((None, 30, 600, 7200))
        ckpt = rnd.choice((None, None, 5, 300))
        running.append(RunningJob(
            id=job_id, team=rnd.choice(TEAMS), gpu_type=gt, gpus_per_replica=g, replicas=reps,
            tier_rank=rnd.choice(TIERS), preemptible=rnd.random() < 0.85,
            started_at=None if started is None else NOW - timedelta(seconds=started),
            checkpointed_at=None if started is None or ckpt is None or ckpt > started
            else NOW - timedelta(seconds=ckpt),
            min_runtime_seconds=rnd.choice((0, 0, 300, 86400)),
            preemptions=rnd.choice((0, 0, 1, 3, 5)), nodes=tuple(placed),
            grace_seconds=rnd.choice((None, 30))))
    quotas = {(t, gt): QuotaLimit(rnd.choice((0, 4, 8, 16)),
                                  borrowing_limit=rnd.choice((None, None, 0, 8)),
                                  lending_limit=rnd.choice((None, None, 0)))
              for t in TEAMS for gt in types if rnd.random() < 0.8}
    tier = rnd.choice(TIERS)
    target = QueuedJob(100, rnd.choice(TEAMS), rnd.choice(types), rnd.choice((1, 2, 4, 8)),
                       rnd.choice((1, 1, 2)), tier,
                       NOW - timedelta(seconds=rnd.choice((0, 5, 600))))
    if len(types) > 1 and rnd.random() < 0.4:  # rules G1-G5: both types, in either order
        order = (target.gpu_type, *(gt for gt in types if gt != target.gpu_type))
        target = replace(target, gpu_types=order)
    behind = tuple(
        QueuedJob(101 + k, rnd.choice(TEAMS), rnd.choice(types), rnd.choice((1, 4, 8)), 1,
                  rnd.choice([t for t in TIERS if t < tier]), NOW - timedelta(hours=5))
        for k in range(rnd.randrange(0, 4) if tier > LOW else 0))
    pre = PreemptionSettings(
        max_per_team=rnd.choice((None, 0, 1, 3)), used={t: rnd.randrange(3) for t in TEAMS},
        max_searches=rnd.choice((0, 1, 32)),
        max_preemptions_per_job=rnd.choice((None, 0, 1, 3)),
        lost_per_wait=rnd.choice((None, 0.0, 0.4)),
        lost_per_wait_by_tier=rnd.choice(({}, {HIGH: 0.0}, {LOW: None})),
        owed_waits_tiers=rnd.choice((frozenset(), frozenset({t for t in TIERS if t != tier}))))
    s = Snapshot(now=NOW, nodes=tuple(replace(n, free=free[n.name]) for n in node_list),
                 queued=(target, *behind), running=tuple(running), quotas=quotas,
                 preemption=pre, reservation=rnd.random() < 0.5)
    return s, target


def _fits_without_own_lower_tiers(s: Snapshot, job: QueuedJob) -> bool:
    """An independent test of "victims enough": the job fits (nodes and quota) once every
    preemptible job of its team, its type and a lower tier is gone - rule R1 allows
    each of them."""
    ws = Workspace(s)
    ws.simulate_removal([r for r in s.running if r.team == job.team and r.preemptible
                         and r.gpu_type == job.gpu_type and r.tier_rank < job.tier_rank])
    return ws.fits(job.team, job.gpu_type, job.gpus_per_replica, job.replicas)


def _owed_with_victims_enough(s: Snapshot, job: QueuedJob) -> list[str]:
    """The GPU types the job accepts on which it is owed (rule R11) and victims enough
    exist: the independent test above, or the victim search run with rule R3 off."""
    out = []
    for gt in job.accepted_types:
        view = replace(job, gpu_type=gt)
        if owed_claim(s, view, gt) and (_fits_without_own_lower_tiers(s, view) or find_victims(
                Workspace(s), view, now=s.now, factor=lambda _t: 1.0, protect=False)):
            out.append(gt)
    return out


@settings(max_examples=600, deadline=None)
@given(owed_worlds())
def test_rule_r11_an_owed_job_with_victims_enough_is_admitted_or_preempts_in_the_first_plan(
    world: tuple[Snapshot, QueuedJob],
) -> None:
    s, job = world
    owed_on = _owed_with_victims_enough(s, job)
    plan = plan_admissions(s)
    admitted = job.id in {a.job_id for a in plan.admissions}
    if owed_on:
        assert admitted or preempted_for(plan, job.id), plan.waits.get(job.id)
    for p in plan.preemptions:
        if p.preemptor_id == job.id and owed_claim(s, replace(job, gpu_type=p.gpu_type),
                                                   p.gpu_type):
            assert p.owed  # never judged by R9, R5 or R3
