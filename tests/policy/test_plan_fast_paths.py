"""The plan's shortcuts for a long queue give what their plain references give,
over random snapshots (hypothesis): rule E4's protected candidates read once per GPU type
(`protected_among`) against `protected_until`, which reads every running job; the
replay of waits once the pass searches no more against the whole pass for every job
(the same plan: admissions, preemptions, order, every wait's reason and message); a
victim search that stops at the lowest tier of the running jobs against one that reads
them all; rule O1's order sorted while no team is charged against the heap; owed claims (rule
R11) replayed and their hopeless searches skipped against the whole pass."""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from queueing.policy import admission, preemption
from queueing.policy.admission import Plan, plan_admissions
from queueing.policy.fairshare import FairShareState
from queueing.policy.preemption import find_victims
from queueing.policy.priority import PriorityWeights
from queueing.policy.snapshot import (
    FlavorFallback,
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)
from queueing.policy.stages import owed
from queueing.policy.stages.heads import Charges, QueueOrder
from queueing.policy.stages.preempt import (
    Protected,
    protected_among,
    protected_of_type,
    protected_until,
)
from queueing.policy.workspace import Workspace

from . import test_clusters_properties, test_plan_properties
from .clusters_world import NOW


def _with_min_runtimes(s: Snapshot, rnd: random.Random) -> Snapshot:
    """`s` with minimum runtimes on its running jobs, some still protecting them (rule R3),
    some not started yet, some with a checkpoint (rule R4 prices them from it) and some
    preempted often (rule R3's per-job limit; rule R11's owed claims pass both)."""
    running = tuple(
        RunningJob(r.id, r.team, r.gpu_type, r.gpus_per_replica, r.replicas, r.tier_rank,
                   preemptible=r.preemptible,
                   started_at=None if rnd.random() < 0.1 else r.started_at,
                   min_runtime_seconds=rnd.choice((0, 60, 600, 3600, 86400)), nodes=r.nodes,
                   cluster=r.cluster, preemptions=rnd.choice((0, 0, 1, 3)),
                   checkpointed_at=rnd.choice((None, s.now - timedelta(seconds=rnd.choice(
                       (0, 20, 500, 5000))))))
        for r in s.running)
    return Snapshot(now=s.now, nodes=s.nodes, queued=s.queued, running=running,
                    quotas=s.quotas, priority_weights=s.priority_weights,
                    preemption=s.preemption)


def _check_protected(s: Snapshot, rnd: random.Random) -> None:
    ws = Workspace(s)
    for r in s.running:  # victims of earlier searches of the pass
        if rnd.random() < 0.2:
            ws.removed.add(r.id)
    by_type: dict[str, Protected] = {}
    for job in s.queued:
        candidates = by_type.get(job.gpu_type)
        if candidates is None:
            candidates = by_type[job.gpu_type] = protected_of_type(ws, job.gpu_type, s.now)
        assert protected_among(ws, job, candidates) == protected_until(ws, job, s.now)


@settings(max_examples=200, deadline=None)
@given(test_plan_properties.snapshots(), st.randoms(use_true_random=False))
def test_protected_candidates_of_a_type_give_rule_e4s_answer(
    s: Snapshot, rnd: random.Random,
) -> None:
    _check_protected(_with_min_runtimes(s, rnd), rnd)


@settings(max_examples=150, deadline=None)
@given(test_clusters_properties.snapshots(), st.randoms(use_true_random=False))
def test_protected_candidates_follow_the_clusters_a_job_may_use(
    s: Snapshot, rnd: random.Random,
) -> None:
    s = _with_min_runtimes(s, rnd)
    s = Snapshot(now=s.now, nodes=s.nodes, running=s.running, quotas=s.quotas,
                 queued=tuple(QueuedJob(q.id, q.team, q.gpu_type, q.gpus_per_replica,
                                        q.replicas, q.tier_rank, q.submitted_at,
                                        clusters=q.clusters) for q in s.queued),
                 preemption=s.preemption)
    _check_protected(s, rnd)


def _without_replay(s: Snapshot) -> Plan:
    admission._REPLAY = False
    try:
        return plan_admissions(s)
    finally:
        admission._REPLAY = True


def _searches_spent(s: Snapshot, k: int) -> Snapshot:
    """`s` whose pass may search `k - 1` times (0: preemption off)."""
    pre = replace(s.preemption, enabled=k > 0, max_searches=max(1, k - 1))
    return replace(s, preemption=pre)


@settings(max_examples=300, deadline=None)
@given(test_plan_properties.snapshots(), st.integers(0, 3), st.booleans())
def test_replayed_waits_are_the_waits_the_whole_pass_gives(
    s: Snapshot, searches: int, reservation: bool,
) -> None:
    s = replace(_searches_spent(s, searches), reservation=reservation)
    assert plan_admissions(s) == _without_replay(s)


@settings(max_examples=150, deadline=None)
@given(test_clusters_properties.snapshots(), st.integers(0, 2))
def test_replayed_waits_follow_clusters_and_spot_nodes(s: Snapshot, searches: int) -> None:
    s = _searches_spent(s, searches)
    assert plan_admissions(s) == _without_replay(s)


@st.composite
def long_queues(draw: st.DrawFn) -> Snapshot:
    """A queue of many jobs of few shapes (what the replay is for), on one or two
    clusters with spot pools, GPUs partly taken, quotas with ceilings and lending limits:
    jobs of one team and shape wait before and after others are admitted."""
    rnd = random.Random(draw(st.integers(0, 2**32)))
    clusters = ("a", "b")[: rnd.choice((1, 2))]
    nodes: list[NodeState] = []
    for cluster in clusters:
        for gt in ("h100", "a100"):
            for spot in (False, True):
                for i in range(rnd.choice((0, 1, 2, 3) if spot else (1, 2, 3))):
                    cap = rnd.choice((4, 8))
                    nodes.append(NodeState(f"{cluster}/{'s' if spot else 'n'}-{gt}-{i}", gt,
                                           cap, rnd.randrange(cap + 1), cluster=cluster,
                                           spot=spot))
    queued = tuple(
        QueuedJob(id=100 + k, team=rnd.choice("xy"), gpu_type=rnd.choice(("h100", "a100")),
                  gpus_per_replica=rnd.choice((1, 2, 4, 8)), replicas=rnd.choice((1, 1, 2)),
                  tier_rank=rnd.choice((0, 100)),
                  submitted_at=NOW - timedelta(seconds=rnd.randrange(10_000)),
                  clusters=rnd.choice((None, None, frozenset("a"), frozenset("b"))),
                  spot_ok=rnd.random() < 0.5,
                  max_runtime_seconds=rnd.choice((None, 600, 86400)))
        for k in range(rnd.randrange(5, 60)))
    quotas = {(t, gt): QuotaLimit(nominal=rnd.choice((0, 4, 8)),
                                  borrowing_limit=rnd.choice((None, 4, 16)),
                                  lending_limit=rnd.choice((None, None, 0, 4)))
              for t in "xyz" for gt in ("h100", "a100")}
    state = FairShareState({t: rnd.random() * 10 for t in "xyz"}, dict.fromkeys("xyz", 1 / 3))
    return Snapshot(now=NOW, nodes=tuple(nodes), queued=queued, quotas=quotas,
                    fair_share_state=state, interval_seconds=rnd.choice((0.0, 3.0, 600.0)),
                    priority_weights=PriorityWeights(),
                    cluster_ranks={c: rnd.randrange(2) for c in clusters},
                    reservation=rnd.random() < 0.7,
                    preemption=PreemptionSettings(enabled=False))


@settings(max_examples=300, deadline=None)
@given(long_queues(), st.sampled_from((admission._LANE_TRIAL, 1, 3)))
def test_replayed_waits_in_long_queues_of_few_shapes(s: Snapshot, trial: int) -> None:
    kept, admission._LANE_TRIAL = admission._LANE_TRIAL, trial  # (a short trial stops it)
    try:
        plan = plan_admissions(s)
    finally:
        admission._LANE_TRIAL = kept
    assert plan == _without_replay(s)
    assert plan.waits.items() == _without_replay(s).waits.items()


def _without_floor(s: Snapshot) -> Plan:
    preemption._FLOOR = False
    try:
        return plan_admissions(s)
    finally:
        preemption._FLOOR = True


@settings(max_examples=300, deadline=None)
@given(test_plan_properties.snapshots(), st.randoms(use_true_random=False))
def test_a_search_beyond_nominal_with_no_lower_tier_finds_what_reading_all_finds(
    s: Snapshot, rnd: random.Random,
) -> None:
    s = _with_min_runtimes(s, rnd)
    assert plan_admissions(s) == _without_floor(s)
    ws, ref = Workspace(s), Workspace(s)
    for job in s.queued:
        protect = rnd.random() < 0.5  # False: an owed claim's search (rule R11)
        found = find_victims(ws, job, now=s.now, factor=lambda _t: 1.0, protect=protect)
        preemption._FLOOR = False
        try:
            want = find_victims(ref, job, now=s.now, factor=lambda _t: 1.0, protect=protect)
        finally:
            preemption._FLOOR = True
        assert (found and found[0]) == (want and want[0])
        for result in (found, want):
            if result is not None:
                result[1]()


def queue_order_ids(s: Snapshot, *, fast: bool,
                    charges: list[tuple[int, str, float]]) -> list[int]:
    """The queue order of `s`'s jobs (ids) when the consumer charges `(after the n-th
    job, team, GPU-hours)` as it goes; team "" is the team of the job just yielded."""
    assert s.fair_share_state is not None
    factors = Charges(s.fair_share_state.copy())
    order = QueueOrder(
        s.queued, factors=factors, weights=s.priority_weights or PriorityWeights(), now=s.now,
        cluster_gpus=sum(n.capacity for n in s.nodes), first=s.nominated,
        usage_total=sum(s.fair_share_state.usage(t) for t in {j.team for j in s.queued}))
    order.fast = fast
    by_position: dict[int, list[tuple[str, float]]] = {}
    for n, team, hours in charges:
        by_position.setdefault(n, []).append((team, hours))
    out = []
    for index in order:
        job = order.jobs[index]
        out.append(job.id)
        for team, hours in by_position.get(len(out), ()):
            factors.charge(team or job.team, hours)
    return out


@st.composite
def queues_and_charges(draw: st.DrawFn) -> tuple[Snapshot, list[tuple[int, str, float]]]:
    """A queue of 1-80 jobs of three teams and tiers, submitted at few instants (equal
    job parts), sometimes with a fair-share weight so large that distinct job parts
    round to one key; charges of any team (of sizes around rule O1's refresh) after
    some jobs, or none."""
    rnd = random.Random(draw(st.integers(0, 2**32)))
    n = rnd.randrange(1, 80)
    instants = [NOW - timedelta(seconds=rnd.randrange(100_000))
                for _ in range(rnd.choice((2, 5, 50)))]
    queued = tuple(
        QueuedJob(id=100 + k, team=rnd.choice("xyz"), gpu_type="h100",
                  gpus_per_replica=rnd.choice((1, 2, 8)), replicas=1,
                  tier_rank=rnd.choice((0, 100, 200)), submitted_at=rnd.choice(instants))
        for k in range(n))
    weights = rnd.choice((PriorityWeights(), PriorityWeights(size=300.0),
                          PriorityWeights(fair_share=1e17, size=300.0, favor_small=True),
                          PriorityWeights(fair_share=1e17), PriorityWeights(age=0.0, size=0.0)))
    state = FairShareState({t: rnd.choice((0.0, rnd.random() * 10)) for t in "xyz"},
                           dict.fromkeys("xyz", 1 / 3))
    s = Snapshot(now=NOW, nodes=(NodeState("n0", "h100", 8, 8),), queued=queued,
                 fair_share_state=state, priority_weights=weights,
                 nominated={100: 1} if rnd.random() < 0.2 else {})
    charges = [(rnd.randrange(1, n + 1), rnd.choice("xyz"),
                rnd.choice((1e-9, 0.01, 0.5, 5.0))) for _ in range(rnd.choice((0, 0, 1, 3, 10)))]
    return s, charges


@settings(max_examples=500, deadline=None)
@given(queues_and_charges())
def test_the_sorted_order_is_the_heaps_whatever_is_charged_when(
    case: tuple[Snapshot, list[tuple[int, str, float]]],
) -> None:
    s, charges = case
    assert queue_order_ids(s, fast=True, charges=charges) == \
        queue_order_ids(s, fast=False, charges=charges)


def _heap_only(s: Snapshot) -> Plan:
    QueueOrder.fast = False
    try:
        return plan_admissions(s)
    finally:
        QueueOrder.fast = True


@settings(max_examples=200, deadline=None)
@given(test_plan_properties.snapshots())
def test_a_plan_on_the_sorted_order_is_the_plan_on_the_heap(s: Snapshot) -> None:
    assert plan_admissions(s) == _heap_only(s)


@settings(max_examples=200, deadline=None)
@given(long_queues())
def test_a_long_queue_plans_the_same_on_the_sorted_order(s: Snapshot) -> None:
    assert plan_admissions(s) == _heap_only(s)


@settings(max_examples=300, deadline=None)
@given(long_queues(), st.integers(0, 2**32), st.sampled_from((admission._LANE_TRIAL, 1, 3)))
def test_replayed_waits_of_jobs_of_several_gpu_types(s: Snapshot, seed: int,
                                                     trial: int) -> None:
    """Rule G5's replay: jobs accepting two types (either order, either fallback
    setting of rule G2) wait as the whole pass says, message by message."""
    rnd = random.Random(seed)
    s = replace(s, queued=tuple(
        replace(j, gpu_types=rnd.choice((("h100", "a100"), ("a100", "h100"))))
        if rnd.random() < 0.5 else j for j in s.queued), flavor_fallback={
            (t, tier): rnd.choice(tuple(FlavorFallback)) for t in "xy" for tier in (0, 100)})
    s = replace(s, queued=tuple(replace(j, gpu_type=j.gpu_types[0]) if j.gpu_types else j
                                for j in s.queued))
    kept, admission._LANE_TRIAL = admission._LANE_TRIAL, trial
    try:
        plan = plan_admissions(s)
    finally:
        admission._LANE_TRIAL = kept
    reference = _without_replay(s)
    assert plan == reference
    assert plan.waits.items() == reference.waits.items()


@st.composite
def owed_long_queues(draw: st.DrawFn) -> Snapshot:
    """A long queue of few shapes on a busy cluster with preemption on and few searches:
    many of its jobs are owed claims (rule R11), which search whatever the budget, some
    finding victims (their team's lower tiers, other teams' borrowed GPUs), most not."""
    rnd = random.Random(draw(st.integers(0, 2**32)))
    nodes = [NodeState(f"{gt}-{i}", gt, 8, 8) for gt in ("h100", "a100")
             for i in range(rnd.randrange(1, 4))]
    free = {n.name: n.capacity for n in nodes}
    running: list[RunningJob] = []
    for k in range(rnd.randrange(0, 12)):
        n = rnd.choice(nodes)
        g = rnd.choice((1, 2, 4, 8))
        if free[n.name] < g:
            continue
        free[n.name] -= g
        running.append(RunningJob(
            k + 1, rnd.choice("xyz"), n.gpu_type, g, 1, rnd.choice((0, 100, 200)),
            preemptible=rnd.random() < 0.8, nodes=(n.name,),
            started_at=NOW - timedelta(seconds=rnd.choice((60, 3600))),
            checkpointed_at=rnd.choice((None, NOW - timedelta(seconds=30))),
            min_runtime_seconds=rnd.choice((0, 600)), preemptions=rnd.choice((0, 3))))
    queued = tuple(
        QueuedJob(id=100 + k, team=rnd.choice("xy"), gpu_type=rnd.choice(("h100", "a100")),
                  gpus_per_replica=rnd.choice((1, 4, 8)), replicas=1,
                  tier_rank=rnd.choice((0, 100, 200)),
                  submitted_at=NOW - timedelta(seconds=rnd.randrange(10_000)),
                  max_runtime_seconds=rnd.choice((None, 600)))
        for k in range(rnd.randrange(5, 60)))
    quotas = {(t, gt): QuotaLimit(nominal=rnd.choice((0, 4, 8, 16)),
                                  borrowing_limit=rnd.choice((None, 8)))
              for t in "xyz" for gt in ("h100", "a100")}
    return Snapshot(now=NOW, nodes=tuple(replace(n, free=free[n.name]) for n in nodes),
                    queued=queued, running=tuple(running), quotas=quotas,
                    priority_weights=PriorityWeights(), reservation=rnd.random() < 0.5,
                    preemption=PreemptionSettings(
                        max_searches=rnd.choice((1, 2, 3)), max_per_team=rnd.choice((None, 1)),
                        owed_waits_tiers=rnd.choice((frozenset(), frozenset({0})))))


def _without_owed_bound(s: Snapshot) -> Plan:
    owed._BOUND = False
    try:
        return plan_admissions(s)
    finally:
        owed._BOUND = True


@settings(max_examples=300, deadline=None)
@given(owed_long_queues())
def test_owed_claims_replay_and_skip_hopeless_searches_as_the_whole_pass_decides(
    s: Snapshot,
) -> None:
    """The replay of waits gives an owed claim whose search found nothing (rule R11) the
    wait the whole pass gives, its words and cause included; an owed search skipped as
    unable to succeed (`owed.may_find`) decides what running it would."""
    plan = plan_admissions(s)
    for reference in (_without_replay(s), _without_owed_bound(s)):
        assert plan == reference
        assert plan.waits.items() == reference.waits.items()
        assert list(plan.wait_causes()) == list(reference.wait_causes())
