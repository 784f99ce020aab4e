"""Rules R1-R5, R8, R9 and Q2: the victim search on a snapshot, without Django."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.preemption import PreemptionRule, is_protected
from queueing.policy.snapshot import PreemptionSettings, QuotaLimit, Snapshot

from .test_admission import NOW, nodes, q, run
from .test_admission import snap as _snap


def pre(**kw: Any) -> PreemptionSettings:
    """Preemption on, without rule R9's check unless a test asks for it: the other rules'
    tests preempt for jobs that have just been submitted."""
    kw.setdefault("lost_per_wait", None)
    return PreemptionSettings(**kw)


ON = pre(enabled=True)


def snap(**kw: Any) -> Snapshot:
    kw.setdefault("preemption", ON)
    return _snap(**kw)


def victims(plan: Any, preemptor: int) -> list[int]:
    (p,) = [p for p in plan.preemptions if p.preemptor_id == preemptor]
    return [v.job_id for v in p.victims]


FULL = nodes(("h100", 8, 0), ("h100", 8, 0))


# --- R1: priority ------------------------------------------------------------------------

def test_rule_r1_a_higher_tier_job_preempts_a_lower_tier_one() -> None:
    plan = plan_admissions(snap(
        nodes=FULL, queued=(q(100, "b", gpus=8, tier=200),),
        running=(run(1, gpus=8, on=("h100-0",)), run(2, gpus=8, on=("h100-1",), started=10)),
    ))
    assert victims(plan, 100) == [2]  # the most recently started of the two
    assert plan.preemptions[0].victims[0].rule is PreemptionRule.PRIORITY
    assert plan.waits[100].reason is WaitReason.PREEMPTING
    assert plan.admissions == ()  # rule R8: admitted by a later cycle


@pytest.mark.parametrize("victim_tier", [200, 300])
def test_rule_r1_never_the_same_or_a_higher_tier(victim_tier: int) -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0)), queued=(q(100, "a", gpus=8, tier=200),),
                                running=(run(1, "a", gpus=8, tier=victim_tier),)))
    assert plan.preemptions == () and plan.waits[100].reason is WaitReason.CAPACITY


def test_rule_r1_only_when_it_is_the_only_way_to_fit() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0), ("h100", 8)),
                                queued=(q(100, gpus=8, tier=200),),
                                running=(run(1, gpus=8, on=("h100-0",)),)))
    assert [a.job_id for a in plan.admissions] == [100] and plan.preemptions == ()


def test_rule_r1_at_its_own_ceiling_a_job_preempts_only_its_own_lower_tier_jobs() -> None:
    """Team a is at its ceiling of 8 with low-tier work; its high-tier job preempts a's
    own low job, never b's (which would not make room under a's ceiling)."""
    running = (run(1, "a", gpus=8, on=("h100-0",), started=100),
               run(2, "b", gpus=8, on=("h100-1",), started=10))
    quotas = {("a", "h100"): QuotaLimit(8, 0)}
    plan = plan_admissions(snap(nodes=FULL, running=running, quotas=quotas,
                                queued=(q(100, "a", gpus=8, tier=200),)))
    assert victims(plan, 100) == [1]


def test_rule_r1_at_its_own_ceiling_without_own_lower_jobs_it_waits_for_quota() -> None:
    running = (run(1, "a", gpus=8, on=("h100-0",), tier=200),
               run(2, "b", gpus=8, on=("h100-1",)))
    plan = plan_admissions(snap(nodes=FULL, running=running,
                                quotas={("a", "h100"): QuotaLimit(8, 0)},
                                queued=(q(100, "a", gpus=8, tier=200),)))
    assert plan.preemptions == () and plan.waits[100].reason is WaitReason.QUOTA


# --- R2: reclaim --------------------------------------------------------------------------

def _reclaim_world(b_nominal: int = 8) -> dict[str, Any]:
    # 16 GPUs; team b holds all 16 (nominal 8: it borrows 8); team a (nominal 8) asks 8.
    return {
        "nodes": FULL,
        "running": (run(1, "b", gpus=8, on=("h100-0",), tier=100, started=100),
                 run(2, "b", gpus=4, on=("h100-1",), tier=100, started=50),
                 run(3, "b", gpus=4, on=("h100-1",), tier=100, started=40)),
        "quotas": {("a", "h100"): QuotaLimit(8, 8), ("b", "h100"): QuotaLimit(b_nominal, 8)},
    }


def test_rule_r2_a_team_within_nominal_reclaims_from_a_borrowing_team() -> None:
    plan = plan_admissions(snap(queued=(q(100, "a", gpus=8, tier=100),), **_reclaim_world()))
    # Rule R4: the two 4-GPU jobs lose 4 × 40 s + 4 × 50 s, the one 8-GPU job 8 × 100 s.
    assert victims(plan, 100) == [3, 2]
    assert {v.rule for v in plan.preemptions[0].victims} == {PreemptionRule.RECLAIM}


def test_rule_r2_no_reclaim_from_a_team_within_its_nominal() -> None:
    plan = plan_admissions(snap(queued=(q(100, "a", gpus=8, tier=100),),
                                **_reclaim_world(b_nominal=16)))
    assert plan.preemptions == ()


def test_rule_r2_no_reclaim_beyond_the_asking_teams_nominal() -> None:
    world = _reclaim_world()
    world["quotas"] = {("a", "h100"): QuotaLimit(4, 8), ("b", "h100"): QuotaLimit(8, 8)}
    plan = plan_admissions(snap(queued=(q(100, "a", gpus=8, tier=100),), **world))
    assert plan.preemptions == ()


def test_rule_r2_never_a_higher_tier_job() -> None:
    plan = plan_admissions(snap(queued=(q(100, "a", gpus=8, tier=50),), **_reclaim_world()))
    assert plan.preemptions == ()


def test_rule_r2_the_team_furthest_over_its_fair_share_first() -> None:
    running = (run(1, "b", gpus=8, on=("h100-0",), tier=100),
               run(2, "c", gpus=8, on=("h100-1",), tier=100))
    quotas = {("a", "h100"): QuotaLimit(8, 0), ("b", "h100"): QuotaLimit(0, 16),
              ("c", "h100"): QuotaLimit(0, 16)}
    for factors, expected in (({"b": 0.1, "c": 0.4}, [1]), ({"b": 0.4, "c": 0.1}, [2])):
        plan = plan_admissions(snap(nodes=FULL, running=running, quotas=quotas,
                                    queued=(q(100, "a", gpus=8, tier=100),),
                                    fair_share=factors))
        assert victims(plan, 100) == expected


# --- R3: protection ----------------------------------------------------------------------

@pytest.mark.parametrize(
    ("preemptible", "min_runtime", "ran", "protected"),
    [(False, 0, 9999, True), (True, 600, 599, True), (True, 600, 600, False),
     (True, 0, 0, False)],
)
def test_rule_r3_protection(preemptible: bool, min_runtime: int, ran: float,
                            protected: bool) -> None:
    job = run(1, gpus=8, started=ran, preemptible=preemptible, min_runtime=min_runtime)
    assert is_protected(job, NOW) is protected
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0)), queued=(q(100, gpus=8, tier=200),),
                                running=(job,)))
    assert (plan.preemptions == ()) is protected


def test_rule_r3_an_admitted_job_that_has_not_started_has_run_zero_seconds() -> None:
    job = run(1, gpus=8, min_runtime=60)
    job = type(job)(**{**{f: getattr(job, f) for f in job.__slots__}, "started_at": None})
    assert is_protected(job, NOW)


@pytest.mark.parametrize(("preempted", "limit", "protected"),
                         [(2, 3, False), (3, 3, True), (7, None, False), (0, 0, True)])
def test_rule_r3_a_job_preempted_max_times_is_no_longer_a_victim(
        preempted: int, limit: int | None, protected: bool) -> None:
    job = replace(run(1, gpus=8), preemptions=preempted)
    assert is_protected(job, NOW, limit) is protected
    plan = plan_admissions(snap(
        nodes=nodes(("h100", 8, 0)), queued=(q(100, gpus=8, tier=200),), running=(job,),
        preemption=pre(max_preemptions_per_job=limit)))
    assert (plan.preemptions == ()) is protected


def test_rule_r3_the_per_job_limit_moves_the_search_to_other_victims() -> None:
    """The most recently started job has been preempted 3 times: the one that ran longer
    goes instead (no thrash on the same job)."""
    running = (replace(run(1, gpus=8, on=("h100-0",), started=10), preemptions=3),
               run(2, gpus=8, on=("h100-1",), started=600))
    plan = plan_admissions(snap(nodes=FULL, queued=(q(100, gpus=8, tier=200),),
                                running=running,
                                preemption=pre(max_preemptions_per_job=3)))
    assert victims(plan, 100) == [2]


# --- R4: lowest tier, then least work lost ------------------------------------------------

def test_rule_r4_less_work_lost_beats_fewer_victims() -> None:
    """Four 2-GPU jobs that ran seconds lose less than one 8-GPU job that ran 5000 s."""
    small = (run(10 + i, gpus=2, on=("h100-1",), started=10 + i) for i in range(4))
    running = (run(1, gpus=8, on=("h100-0",), started=5000), *small)
    plan = plan_admissions(snap(nodes=FULL, queued=(q(100, gpus=8, tier=200),),
                                running=running))
    assert victims(plan, 100) == [10, 11, 12, 13]


def test_rule_r4_the_issues_example_two_low_jobs_not_one_burstable_gang() -> None:
    """On the openb replay a non-preemptible 2-GPU job needed room; an 8-GPU job of the middle
    tier that had run 3.4 h (26.9 GPU-h) was taken where two 1-GPU jobs of the lowest
    tier (0.02 GPU-h) would do. By tier first, the two low jobs go."""
    running = (run(1, gpus=8, on=("h100-0",), tier=50, started=3.4 * 3600),
               run(2, gpus=1, on=("h100-1",), tier=0, started=36),
               run(3, gpus=1, on=("h100-1",), tier=0, started=36),
               run(4, gpus=6, on=("h100-1",), tier=300, preemptible=False))
    plan = plan_admissions(snap(nodes=FULL, queued=(q(100, gpus=2, tier=200),),
                                running=running))
    assert victims(plan, 100) == [2, 3]


def test_rule_r4_on_a_tie_of_tier_and_work_lost_fewer_victims() -> None:
    small = (run(10 + i, gpus=2, on=("h100-1",), started=100) for i in range(4))
    running = (run(1, gpus=8, on=("h100-0",), started=100), *small)
    plan = plan_admissions(snap(nodes=FULL, queued=(q(100, gpus=8, tier=200),),
                                running=running))
    assert victims(plan, 100) == [1]


def test_rule_r4_lowest_tier_first_then_least_work_lost_then_id() -> None:
    running = (run(1, gpus=2, tier=50, started=10), run(2, gpus=2, tier=0, started=5000),
               run(3, gpus=2, tier=0, started=100), run(4, gpus=2, tier=0, started=100))
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0)), queued=(q(100, gpus=4, tier=200),),
                                running=running))
    assert victims(plan, 100) == [3, 4]


def test_rule_r4_never_more_than_needed() -> None:
    running = tuple(run(i, gpus=1, started=i) for i in range(1, 9))
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0)), queued=(q(100, gpus=3, tier=200),),
                                running=running))
    assert victims(plan, 100) == [1, 2, 3]


def test_rule_r4_a_gang_victim_frees_all_its_nodes() -> None:
    running = (run(1, gpus=8, on=("h100-0", "h100-1"), started=10),
               run(2, gpus=8, on=("h100-2",), started=5))
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0), ("h100", 8, 0), ("h100", 8, 0)),
                                queued=(q(100, gpus=8, replicas=2, tier=200),),
                                running=running))
    assert victims(plan, 100) == [1]


def test_rule_r4_no_victims_when_even_all_would_not_do() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0)), queued=(q(100, gpus=8, tier=200),),
                                running=(run(1, gpus=4), run(2, gpus=4, tier=300))))
    assert plan.preemptions == () and plan.waits[100].reason is WaitReason.CAPACITY


def test_rule_r4_gpus_freed_for_a_preemptor_are_not_given_to_others_in_the_pass() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0)),
                                queued=(q(100, gpus=8, tier=200), q(101, gpus=1, tier=100)),
                                running=(run(1, gpus=8),)))
    assert victims(plan, 100) == [1] and plan.admissions == ()


def test_two_preemptors_never_share_a_victim() -> None:
    running = (run(1, gpus=8, on=("h100-0",)), run(2, gpus=8, on=("h100-1",)))
    plan = plan_admissions(snap(nodes=FULL, running=running,
                                queued=(q(100, gpus=8, tier=200), q(101, gpus=8, tier=200))))
    assert sorted(victims(plan, 100) + victims(plan, 101)) == [1, 2]


# --- R5: rate limit ----------------------------------------------------------------------

@pytest.mark.parametrize(("limit", "used", "preempts"), [
    (None, 0, True), (2, 0, True), (2, 1, True), (2, 2, False), (0, 0, False)])
def test_rule_r5_at_most_n_preemptions_per_team_per_window(limit: int | None, used: int,
                                                           preempts: bool) -> None:
    settings = pre(max_per_team=limit, used={"b": used})
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0)), running=(run(1, gpus=8),),
                                queued=(q(100, "b", gpus=8, tier=200),), preemption=settings))
    assert bool(plan.preemptions) is preempts
    if not preempts:
        assert plan.waits[100].reason is WaitReason.RATE_LIMITED


def test_rule_r5_counts_victims_not_preemptors() -> None:
    settings = pre(max_per_team=1)
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0)),
                                running=(run(1, gpus=4), run(2, gpus=4)),
                                queued=(q(100, "b", gpus=8, tier=200),), preemption=settings))
    assert plan.preemptions == () and plan.waits[100].reason is WaitReason.RATE_LIMITED


def test_rule_r5_a_team_with_no_preemption_left_does_not_search() -> None:
    """b has used its window: its job waits rate-limited without a search, so the one
    search of the pass is left for c's job behind it."""
    settings = pre(max_per_team=2, used={"b": 2}, max_searches=1)
    plan = plan_admissions(snap(
        nodes=FULL, running=(run(1, gpus=8, on=("h100-0",)), run(2, gpus=8, on=("h100-1",))),
        queued=(q(101, "b", gpus=8, tier=200), q(100, "c", gpus=8, tier=200)),
        preemption=settings))
    assert plan.order[:2] == (101, 100)
    assert plan.waits[101].reason is WaitReason.RATE_LIMITED
    assert [p.preemptor_id for p in plan.preemptions] == [100]


def test_rule_r5_a_search_refused_by_the_limit_is_remembered_in_the_pass() -> None:
    """b may preempt 1 job; its 8-GPU jobs need 2 victims each. The first search is
    refused, the second job of the same shape does not search again, and c's job gets
    the pass's second search."""
    running = (run(1, gpus=4, on=("h100-0",)), run(2, gpus=4, on=("h100-0",)),
               run(3, gpus=4, on=("h100-1",)), run(4, gpus=4, on=("h100-1",), started=10))
    settings = pre(max_per_team=1, max_searches=2)
    plan = plan_admissions(snap(
        nodes=FULL, running=running, preemption=settings,
        queued=(q(102, "b", gpus=8, tier=200), q(101, "b", gpus=8, tier=200),
                q(100, "c", gpus=4, tier=200))))
    assert plan.waits[102].reason is plan.waits[101].reason is WaitReason.RATE_LIMITED
    assert "needs 2" in plan.waits[101].message
    assert victims(plan, 100) == [4]


def test_preemption_can_be_switched_off() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0)), running=(run(1, gpus=8),),
                                queued=(q(100, gpus=8, tier=200),),
                                preemption=pre(enabled=False)))
    assert plan.preemptions == ()


# --- R8: one preemption at a time per preemptor -------------------------------------------

def test_rule_r8_a_preemptor_whose_victims_terminate_picks_no_new_victims() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0)), running=(run(1, gpus=8),),
                                queued=(q(100, gpus=8, tier=200),), nominated={100: 1}))
    assert plan.preemptions == () and plan.waits[100].reason is WaitReason.PREEMPTING


# --- R9: a preemption must be worth its loss ------------------------------------------------

@pytest.mark.parametrize(("waited", "ratio", "preempts"), [
    (0.0, 1.0, False), (3599.0, 1.0, False), (3600.0, 1.0, True), (360.0, 10.0, True),
    (0.0, None, True)])
def test_rule_r9_victims_lose_at_most_ratio_times_what_the_job_waited(
        waited: float, ratio: float | None, preempts: bool) -> None:
    """The victim (8 GPUs, ran 1 h: 8 GPU-h) is taken for an 8-GPU job only once the job
    has waited 8 GPU-h × 1/ratio, that is 1 h at ratio 1."""
    queued = replace(q(100, gpus=8, tier=200), submitted_at=NOW - timedelta(seconds=waited))
    plan = plan_admissions(snap(
        nodes=nodes(("h100", 8, 0)), queued=(queued,), running=(run(1, gpus=8, started=3600),),
        preemption=pre(lost_per_wait=ratio)))
    assert bool(plan.preemptions) is preempts
    if not preempts:
        assert plan.waits[100].reason is WaitReason.CAPACITY
        assert "rule R9" in plan.waits[100].message


def test_rule_r9_a_requeued_job_waits_from_its_return_to_the_queue() -> None:
    old = NOW - timedelta(days=1)
    queued = replace(q(100, gpus=8, tier=200), submitted_at=old,
                     queued_at=NOW - timedelta(seconds=60))
    plan = plan_admissions(snap(
        nodes=nodes(("h100", 8, 0)), queued=(queued,), running=(run(1, gpus=8, started=3600),),
        preemption=pre(lost_per_wait=1.0)))
    assert plan.preemptions == ()


# --- Q2: what a team was guaranteed can always be reclaimed --------------------------------

def _q2_world(b_nominal: int) -> dict[str, Any]:
    """b runs a non-preemptible (rank 300) job on each node; a (nominal 8) asks 8 GPUs
    with a normal-tier job."""
    return {
        "nodes": FULL,
        "running": (run(1, "b", gpus=8, on=("h100-0",), tier=300, preemptible=False),
                    run(2, "b", gpus=8, on=("h100-1",), tier=300, preemptible=False,
                        started=60)),
        "quotas": {("a", "h100"): QuotaLimit(8), ("b", "h100"): QuotaLimit(b_nominal)},
        "queued": (q(100, "a", gpus=8, tier=100),),
    }


def test_rule_q2_a_borrowing_non_preemptible_job_is_reclaimed_whatever_the_tiers() -> None:
    plan = plan_admissions(snap(**_q2_world(b_nominal=8)))
    assert victims(plan, 100) == [2]  # the one that lost less work (rule R4)
    assert plan.preemptions[0].victims[0].rule is PreemptionRule.RECLAIM


def test_rule_q2_a_non_preemptible_job_within_its_nominal_is_never_a_victim() -> None:
    plan = plan_admissions(snap(**_q2_world(b_nominal=16)))
    assert plan.preemptions == ()


def test_rule_q2_never_for_a_higher_tier_alone() -> None:
    """Rule R1 never takes a non-preemptible job, even for a higher tier (rank 400)
    when the asking team is beyond its own nominal."""
    world = _q2_world(b_nominal=8)
    world["quotas"] = {("a", "h100"): QuotaLimit(0), ("b", "h100"): QuotaLimit(8)}
    world["queued"] = (q(100, "a", gpus=8, tier=400),)
    plan = plan_admissions(snap(**world))
    assert plan.preemptions == ()
