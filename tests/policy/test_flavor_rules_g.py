"""Rules G1-G5: a job accepting several GPU types, in the policy (docs/scheduling.md,
"Several GPU types"). Table tests on small snapshots, without Django."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.explain import explain_queue
from queueing.policy.fairshare import FairShareState
from queueing.policy.snapshot import (
    FlavorFallback,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    Snapshot,
)
from queueing.policy.start_estimate import Holding, Waiting, estimate_starts

from . import clusters_world as cw
from . import test_clusters_properties, test_plan_properties
from .test_admission import NOW, admitted, ago, nodes, q, run, snap


def two(job_id: int, types: tuple[str, ...] = ("h100", "a100"), **kw: Any) -> QueuedJob:
    """A queued job accepting `types` in that order (its `gpu_type` the first)."""
    return replace(q(job_id, gpu_type=types[0], **kw), gpu_types=types)


def landed(plan: Any) -> dict[int, str]:
    return {a.job_id: a.gpu_type for a in plan.admissions}


# --- G1: the types in order of preference --------------------------------------------------

@pytest.mark.parametrize(
    ("h100_free", "a100_free", "gpus", "lands"),
    [
        (8, 8, 4, "h100"),  # room on the preferred type
        (0, 8, 4, "a100"),  # h100 full: the next type
        (2, 8, 4, "a100"),  # h100 has GPUs, not enough on one node
        (0, 0, 4, None),  # neither
        (8, 8, 16, None),  # no node of either holds it
    ],
)
def test_rule_g1_a_job_lands_on_the_first_type_in_its_order_with_room(
    h100_free: int, a100_free: int, gpus: int, lands: str | None,
) -> None:
    s = snap(nodes=nodes(("h100", 8, h100_free), ("a100", 8, a100_free)),
             queued=(two(1, gpus=gpus),))
    assert landed(plan_admissions(s)) == ({1: lands} if lands else {})


def test_rule_g1_the_order_is_the_jobs_not_the_alphabets() -> None:
    s = snap(nodes=nodes(("h100", 8), ("a100", 8)), queued=(two(1, ("a100", "h100")),))
    assert landed(plan_admissions(s)) == {1: "a100"}


def test_rule_g1_a_job_listing_only_its_own_type_plans_as_one_that_lists_none() -> None:
    queued = (q(1, gpus=8), q(2, gpus=4, team="b"), q(3, gpus=2), q(4, gpus=8, team="b"))
    base = snap(nodes=nodes(("h100", 8, 6), ("h100", 8, 2)), queued=queued)
    listed = replace(base, queued=tuple(replace(j, gpu_types=(j.gpu_type,)) for j in queued))
    a, b = plan_admissions(base), plan_admissions(listed)
    assert a.admissions == b.admissions and a.order == b.order
    assert dict(a.waits) == dict(b.waits)


def test_rule_g1_jobs_behind_see_the_gpus_a_fallback_took() -> None:
    s = snap(nodes=nodes(("h100", 8, 0), ("a100", 8)),
             queued=(two(1, gpus=8, age=10), q(2, gpus=1, gpu_type="a100")))
    plan = plan_admissions(s)
    assert landed(plan) == {1: "a100"}
    assert plan.waits[2].reason is WaitReason.CAPACITY


# --- G2: nominal, then borrowing; the fallback setting ---------------------------------

def _borrow_world(fallback: FlavorFallback, **kw: Any) -> Snapshot:
    """Team a: no nominal on h100 (it would borrow), 8 nominal on a100; both empty."""
    return snap(nodes=nodes(("h100", 8), ("a100", 8)), queued=(two(1, gpus=4),),
                quotas={("a", "h100"): QuotaLimit(0, None), ("a", "a100"): QuotaLimit(8, 0)},
                **kw, flavor_fallback_default=fallback)


@pytest.mark.parametrize(
    ("fallback", "lands"),
    [(FlavorFallback.BORROW, "h100"), (FlavorFallback.NEXT_TYPE, "a100")],
)
def test_rule_g2_borrow_in_the_preferred_type_or_take_the_next_types_nominal(
    fallback: FlavorFallback, lands: str,
) -> None:
    assert landed(plan_admissions(_borrow_world(fallback))) == {1: lands}


def test_rule_g2_next_type_still_borrows_when_no_type_has_nominal_room() -> None:
    s = replace(_borrow_world(FlavorFallback.NEXT_TYPE), nodes=nodes(("h100", 8), ("a100", 8, 0)))
    assert landed(plan_admissions(s)) == {1: "h100"}


def test_rule_g2_the_setting_is_per_team_and_tier() -> None:
    s = replace(_borrow_world(FlavorFallback.BORROW),
                flavor_fallback={("a", 100): FlavorFallback.NEXT_TYPE})
    assert landed(plan_admissions(s)) == {1: "a100"}
    s = replace(s, flavor_fallback={("a", 200): FlavorFallback.NEXT_TYPE})
    assert landed(plan_admissions(s)) == {1: "h100"}


def test_rule_g2_a_type_over_the_teams_ceiling_is_passed_over() -> None:
    s = snap(nodes=nodes(("h100", 8), ("a100", 8)), queued=(two(1, gpus=4),),
             quotas={("a", "h100"): QuotaLimit(2, 0)})
    assert landed(plan_admissions(s)) == {1: "a100"}


# --- G3: preemption only after no type fits ------------------------------------------------

def _preempt_world(a100_free: int) -> Snapshot:
    return snap(nodes=nodes(("h100", 8, 0), ("a100", 8, a100_free)),
                queued=(two(1, gpus=8, tier=200),),
                running=(run(50, gpus=8, tier=0, on=("h100-0",), team="b"),
                         run(51, gpus=8, tier=0, on=("a100-0",), team="b", gpu_type="a100")),
                preemption=PreemptionSettings(enabled=True, lost_per_wait=None))


def test_rule_g3_no_preemption_while_another_type_fits() -> None:
    plan = plan_admissions(_preempt_world(a100_free=8))
    assert landed(plan) == {1: "a100"} and plan.preemptions == ()


def test_rule_g3_when_no_type_fits_it_preempts_on_the_preferred_type() -> None:
    plan = plan_admissions(_preempt_world(a100_free=0))
    (found,) = plan.preemptions
    assert (found.gpu_type, [v.job_id for v in found.victims]) == ("h100", [50])
    assert plan.waits[1].reason is WaitReason.PREEMPTING


def test_rule_g3_a_type_with_no_victim_passes_to_the_next() -> None:
    s = _preempt_world(a100_free=0)
    s = replace(s, running=(run(50, gpus=8, tier=300, on=("h100-0",), team="b"),
                            *s.running[1:]))
    (found,) = plan_admissions(s).preemptions
    assert (found.gpu_type, [v.job_id for v in found.victims]) == ("a100", [51])


# --- G4: charged with the type it ran on ---------------------------------------------------

def test_rule_g4_quota_and_fair_share_are_charged_on_the_type_it_lands_on() -> None:
    state = FairShareState({"a": 0.0, "b": 0.0}, {"a": 0.5, "b": 0.5})
    common: dict[str, Any] = {"fair_share_state": state, "interval_seconds": 300.0,
                              "billing_weights": {"h100": 4.0, "a100": 1.0}}
    multi = snap(nodes=nodes(("h100", 8, 0), ("a100", 8)),
                 queued=(two(1, gpus=8, age=10), q(2, gpus=8, gpu_type="a100")),
                 quotas={("a", "a100"): QuotaLimit(8, 0)}, **common)
    plan = plan_admissions(multi)
    assert landed(plan) == {1: "a100"}
    assert plan.waits[2].reason is WaitReason.QUOTA  # team a's a100 quota is taken
    alone = snap(nodes=nodes(("a100", 8)), queued=(q(1, gpus=8, gpu_type="a100"),), **common)
    assert plan.fair_share_after == plan_admissions(alone).fair_share_after


# --- G5: why it waits, per type ----------------------------------------------------------

def test_rule_g5_the_wait_names_each_types_blocker_in_order() -> None:
    s = snap(nodes=nodes(("h100", 8), ("a100", 8, 3), ("a100", 8, 2)),
             queued=(two(1, gpus=4),), running=(run(50, gpus=8, team="a", on=("h100-1",)),),
             quotas={("a", "h100"): QuotaLimit(8, 0)})
    w = plan_admissions(s).waits[1]
    assert w.reason is WaitReason.QUOTA
    assert w.message.startswith("none of the GPU types it accepts (h100, a100) has room: "
                                "h100: quota (team a holds 8 h100 GPUs; 4 more would pass its "
                                "limit of 8); a100: capacity (waiting for 1 × 4 free a100 GPUs")
    assert "largest free block: 3 GPUs on a100-0" in w.message
    assert w.message.endswith("(rule G5)")


def test_rule_g5_jobs_ahead_count_those_wanting_any_accepted_type() -> None:
    ordered = [q(1, gpu_type="h100"), q(2, gpu_type="a100"), q(3, gpu_type="l4"),
               two(4), q(5, gpu_type="a100"), two(6, ("l4", "a100"))]
    out = explain_queue(ordered, waits={}, admitted=())
    assert out[4].ahead_same_gpu_type == 2  # jobs 1 and 2
    assert out[5].ahead_same_gpu_type == 2  # jobs 2 and 4
    assert out[6].ahead_same_gpu_type == 4  # jobs 2, 3, 4 and 5
    assert "for l4 or a100 GPUs" in out[6].reasons[0].message


def test_rule_g5_the_estimated_start_is_the_earliest_over_its_types() -> None:
    hour = timedelta(hours=1)
    running = [Holding("h100", 8, NOW + 3 * hour), Holding("a100", 8, NOW + hour)]
    queued = [Waiting(1, "h100", 8, 3600, ("h100", "a100")),
              Waiting(2, "a100", 8, None), Waiting(3, "h100", 8, None)]
    starts = estimate_starts(now=NOW, free={}, running=running, queued=queued)
    # Job 1 takes the a100s at +1 h (earlier than h100's +3 h); job 2 waits for it.
    assert starts == {1: NOW + hour, 2: NOW + 2 * hour, 3: NOW + 3 * hour}
    never = estimate_starts(now=NOW, free={}, running=[Holding("h100", 8, None)],
                            queued=[Waiting(1, "h100", 8, None, ("h100", "a100")),
                                    Waiting(2, "a100", 1, None)])
    assert never == {1: None, 2: None}  # job 2 waits behind job 1 on a100 too


# --- the rules it meets: A9, K1-K4, A8, D1 with two types ------------------------------

def test_rule_g5_the_reservation_is_on_the_type_where_it_comes_first() -> None:
    hour = 3600
    s = snap(nodes=nodes(("h100", 8, 0), ("a100", 8, 0)), queued=(two(1, gpus=8),),
             running=(replace(run(50, gpus=8, on=("h100-0",)), max_runtime_seconds=3 * hour),
                      replace(run(51, gpus=8, on=("a100-0",), gpu_type="a100"),
                              max_runtime_seconds=2 * hour)))
    plan = plan_admissions(s)
    assert plan.reservations == {"a100": (1, ago(hour) + timedelta(seconds=2 * hour))}


@pytest.mark.parametrize(
    ("clusters", "lands"),
    [(None, ("a100", "west")), ({"east"}, None), ({"west"}, ("a100", "west"))],
)
def test_rule_g1_pools_of_every_type_in_type_order_then_k2(
    clusters: set[str] | None, lands: tuple[str, str] | None,
) -> None:
    world = [*cw.pool("east", "h100", 1, free=0), *cw.pool("west", "h100", 1, free=0),
             *cw.pool("west", "a100", 1), *cw.pool("east", "l4", 1)]
    j = replace(cw.job(1, gpus=8, clusters=clusters), gpu_types=("h100", "a100"))
    plan = plan_admissions(cw.snap(world, [j]))
    got = [(a.gpu_type, a.cluster) for a in plan.admissions]
    assert got == ([lands] if lands else [])
    if lands is None:  # its cluster has no a100 node: each type says its own blocker
        w = plan.waits[1]
        assert w.reason is WaitReason.CAPACITY
        assert "h100: capacity (waiting for 1 × 8 free h100 GPUs" in w.message
        assert "a100: cluster (no node of its cluster east can hold" in w.message


@pytest.mark.parametrize(("spot_ok", "lands"), [(True, ("a100", True)), (False, None)])
def test_rule_g1_spot_nodes_of_a_later_type_only_for_a_job_that_may_use_them(
    spot_ok: bool, lands: tuple[str, bool] | None,
) -> None:
    world = [*cw.pool("", "h100", 1, free=0), *cw.pool("", "a100", 1, spot=True)]
    j = replace(cw.job(1, gpus=8, spot_ok=spot_ok), gpu_types=("h100", "a100"))
    plan = plan_admissions(cw.snap(world, [j]))
    assert [(a.gpu_type, a.spot) for a in plan.admissions] == ([lands] if lands else [])


def test_rule_g1_array_limits_and_dependencies_hold_whatever_the_type() -> None:
    s = snap(nodes=nodes(("h100", 8, 0), ("a100", 8)),
             queued=(replace(two(1, age=10), array_id=7), replace(two(2), array_id=7)),
             array_limits={7: 1})
    plan = plan_admissions(s)
    assert admitted(plan) == [1] and plan.waits[2].reason is WaitReason.ARRAY_LIMIT


def test_rule_g1_a_nominated_preemptor_takes_the_type_of_its_planned_placement() -> None:
    s = snap(nodes=nodes(("h100", 8), ("a100", 8)), queued=(two(1, gpus=8),),
             nominated={1: 0}, nominated_placement={1: ("a100-0",)})
    assert landed(plan_admissions(s)) == {1: "a100"}


def test_rule_g1_every_admission_is_on_a_type_the_job_accepts() -> None:
    queued = tuple(two(k, ("h100", "a100") if k % 2 else ("a100", "l4"), gpus=1 + k % 8,
                       team="ab"[k % 2]) for k in range(1, 40))
    s = snap(nodes=nodes(*[("h100", 8)] * 3, *[("a100", 8)] * 2, ("l4", 8)), queued=queued)
    plan = plan_admissions(s)
    by_id = {j.id: j for j in queued}
    assert plan.admissions
    for a in plan.admissions:
        assert a.gpu_type in by_id[a.job_id].accepted_types
    used: dict[str, int] = {}
    for a in plan.admissions:
        used[a.gpu_type] = used.get(a.gpu_type, 0) + by_id[a.job_id].total_gpus
    assert used.get("h100", 0) <= 24 and used.get("a100", 0) <= 16 and used.get("l4", 0) <= 8


# --- properties over random snapshots ------------------------------------------------------

@st.composite
def several_types(draw: st.DrawFn) -> Snapshot:
    """A snapshot of the property tests where some queued jobs accept a second (or
    third) type of those the nodes have, with either fallback setting."""
    s = draw(test_plan_properties.snapshots())
    rnd = draw(st.randoms(use_true_random=False))
    types = sorted({n.gpu_type for n in s.nodes} | {"l4"})
    queued = []
    for j in s.queued:
        if rnd.random() < 0.5:
            others = [t for t in types if t != j.gpu_type]
            k = min(len(others), rnd.choice((1, 2)))
            j = replace(j, gpu_types=(j.gpu_type, *rnd.sample(others, k)))
        queued.append(j)
    return replace(s, queued=tuple(queued), flavor_fallback_default=rnd.choice(
        tuple(FlavorFallback)))


@settings(max_examples=200, deadline=None)
@given(test_plan_properties.snapshots())
def test_rule_g1_listing_only_its_own_type_changes_no_plan(s: Snapshot) -> None:
    listed = replace(s, queued=tuple(replace(j, gpu_types=(j.gpu_type,)) for j in s.queued))
    a, b = plan_admissions(s), plan_admissions(listed)
    assert a == b and dict(a.waits) == dict(b.waits)


@settings(max_examples=300, deadline=None)
@given(several_types())
def test_rule_g1_plans_of_several_types_keep_capacity_quota_and_gangs(s: Snapshot) -> None:
    test_plan_properties.test_a_plan_never_exceeds_node_capacity.hypothesis.inner_test(s)
    quota_check = test_plan_properties.test_a_plan_never_passes_a_quota_ceiling_or_a_lending_limit
    quota_check.hypothesis.inner_test(s)
    plan = plan_admissions(s)
    queued = {j.id: j for j in s.queued}
    node_type = {n.name: n.gpu_type for n in s.nodes}
    placed = [(a.job_id, a.gpu_type, a.placement) for a in plan.admissions]
    placed += [(p.preemptor_id, p.gpu_type, p.placement) for p in plan.preemptions]
    for job_id, gt, placement in placed:
        assert gt in queued[job_id].accepted_types
        assert len(placement) == queued[job_id].replicas
        assert {node_type[n] for n in placement} == {gt}
    decided = [a.job_id for a in plan.admissions] + list(plan.waits)
    assert sorted(decided) == sorted(queued)
    assert plan == plan_admissions(s) and dict(plan.waits) == dict(plan_admissions(s).waits)
    for job_id, w in plan.waits.items():
        if len(queued[job_id].gpu_types) > 1 and w.reason.value in ("quota", "capacity"):
            assert w.message.startswith("none of the GPU types it accepts") or \
                "rule R9" in w.message


@settings(max_examples=150, deadline=None)
@given(test_clusters_properties.snapshots(), st.randoms(use_true_random=False))
def test_rule_g1_several_types_over_clusters_and_spot_keep_k1_k3_k4_k7(
    s: Snapshot, rnd: Any,
) -> None:
    types = sorted({n.gpu_type for n in s.nodes} | {"l4"})
    s = replace(s, queued=tuple(
        replace(j, gpu_types=(j.gpu_type, *rnd.sample([t for t in types if t != j.gpu_type], 1)))
        if rnd.random() < 0.5 else j for j in s.queued))
    plan = plan_admissions(s)
    node = {n.name: n for n in s.nodes}
    queued = {j.id: j for j in s.queued}
    running = {r.id: r for r in s.running}
    used: dict[str, int] = {}
    for a in plan.admissions:
        j = queued[a.job_id]
        assert {node[n].cluster for n in a.placement} == {a.cluster}  # rule K1
        assert len({node[n].spot for n in a.placement}) == 1
        assert j.spot_ok or not any(node[n].spot for n in a.placement)  # rule K4
        assert j.clusters is None or a.cluster in j.clusters  # rule K3
        assert {node[n].gpu_type for n in a.placement} == {a.gpu_type}
        assert a.gpu_type in j.accepted_types
        for n in a.placement:
            used[n] = used.get(n, 0) + j.gpus_per_replica
    for p in plan.preemptions:
        assert {running[v.job_id].cluster for v in p.victims} == {p.cluster}  # rule K7
        assert {running[v.job_id].gpu_type for v in p.victims} == {p.gpu_type}
    assert all(gpus <= node[n].free for n, gpus in used.items())
    assert plan_admissions(s) == plan
