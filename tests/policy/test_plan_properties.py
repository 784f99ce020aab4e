"""Properties of `plan_admissions` over random snapshots (hypothesis): a plan never
exceeds node capacity, quotas or borrowing/lending limits; gangs are atomic; protected
jobs are never victims; the same snapshot (in any input order) gives the same plan."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from queueing.policy.admission import Plan, plan_admissions
from queueing.policy.fairshare import FairShareState
from queueing.policy.preemption import PreemptionRule, is_protected, reclaim_only
from queueing.policy.priority import PriorityWeights
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
TEAMS = ("a", "b", "c")
TYPES = ("h100", "a100")
TIERS = (0, 100, 200)


@st.composite
def snapshots(draw: st.DrawFn) -> Snapshot:
    rnd = random.Random(draw(st.integers(0, 2**32)))
    nodes: list[NodeState] = []
    free: dict[str, int] = {}
    for gt in TYPES[: draw(st.integers(1, 2))]:
        for i in range(draw(st.integers(1, 4))):
            cap = draw(st.sampled_from((4, 8)))
            nodes.append(NodeState(f"{gt}-{i}", gt, cap, cap))
            free[f"{gt}-{i}"] = cap
    types = sorted({n.gpu_type for n in nodes})
    running: list[RunningJob] = []
    for job_id in range(1, draw(st.integers(0, 12)) + 1):
        gt = rnd.choice(types)
        g = rnd.choice((1, 2, 4))
        reps = rnd.choice((1, 1, 2))
        candidates = [n.name for n in nodes if n.gpu_type == gt]
        placed: list[str] = []
        for _ in range(reps):
            room = [n for n in candidates if free[n] >= g]
            if not room:
                break
            n = rnd.choice(room)
            free[n] -= g
            placed.append(n)
        if len(placed) < reps:
            for n in placed:
                free[n] += g
            continue
        running.append(RunningJob(
            id=job_id, team=rnd.choice(TEAMS), gpu_type=gt, gpus_per_replica=g,
            replicas=reps, tier_rank=rnd.choice(TIERS), preemptible=rnd.random() < 0.8,
            started_at=NOW - timedelta(seconds=rnd.choice((0, 30, 600, 7200))),
            min_runtime_seconds=rnd.choice((0, 0, 300)), nodes=tuple(placed),
        ))
    queued = tuple(
        QueuedJob(id=100 + i, team=rnd.choice(TEAMS), gpu_type=rnd.choice(types),
                  gpus_per_replica=rnd.choice((1, 2, 4, 8)), replicas=rnd.choice((1, 1, 2, 3)),
                  tier_rank=rnd.choice(TIERS),
                  submitted_at=NOW - timedelta(seconds=rnd.randrange(0, 10_000)))
        for i in range(draw(st.integers(0, 15)))
    )
    quotas = {}
    for team in TEAMS:
        for gt in types:
            if rnd.random() < 0.7:
                quotas[(team, gt)] = QuotaLimit(
                    nominal=rnd.choice((0, 2, 4, 8)),
                    borrowing_limit=rnd.choice((None, 0, 2, 8)),
                    lending_limit=rnd.choice((None, None, 0, 2)),
                )
    state = FairShareState({t: rnd.random() * 10 for t in TEAMS},
                           {t: 1 / len(TEAMS) for t in TEAMS})
    return Snapshot(
        now=NOW,
        nodes=tuple(NodeState(n.name, n.gpu_type, n.capacity, free[n.name]) for n in nodes),
        queued=queued, running=tuple(running), quotas=quotas,
        fair_share_state=state, interval_seconds=rnd.choice((0.0, 3.0, 600.0)),
        priority_weights=PriorityWeights(),
        preemption=PreemptionSettings(max_per_team=rnd.choice((None, 1, 3)),
                                      used={"a": rnd.randrange(0, 3)}),
    )


def _final_holdings(s: Snapshot, plan: Plan) -> dict[tuple[str, str], int]:
    queued = {q.id: q for q in s.queued}
    victims = {v.job_id for p in plan.preemptions for v in p.victims}
    held: dict[tuple[str, str], int] = defaultdict(int)
    for r in s.running:
        if r.id not in victims:
            held[(r.team, r.gpu_type)] += r.total_gpus
    for a in plan.admissions:
        held[(a.team, a.gpu_type)] += queued[a.job_id].total_gpus
    for p in plan.preemptions:
        held[(p.team, p.gpu_type)] += queued[p.preemptor_id].total_gpus
    return held


@settings(max_examples=300, deadline=None)
@given(snapshots())
def test_a_plan_never_exceeds_node_capacity(s: Snapshot) -> None:
    plan = plan_admissions(s)
    queued = {q.id: q for q in s.queued}
    running = {r.id: r for r in s.running}
    node = {n.name: n for n in s.nodes}
    admitted: dict[str, int] = defaultdict(int)
    for a in plan.admissions:
        for name in a.placement:
            admitted[name] += queued[a.job_id].gpus_per_replica
    freed: dict[str, int] = defaultdict(int)
    reserved: dict[str, int] = defaultdict(int)
    for p in plan.preemptions:
        for v in p.victims:
            for name in running[v.job_id].nodes:
                freed[name] += running[v.job_id].gpus_per_replica
        for name in p.placement:
            reserved[name] += queued[p.preemptor_id].gpus_per_replica
    for name, n in node.items():
        # Admissions are submitted at once: only GPUs free now (rule A2, A5).
        assert admitted[name] <= n.free, name
        assert admitted[name] + reserved[name] <= n.free + freed[name], name


@settings(max_examples=300, deadline=None)
@given(snapshots())
def test_a_plan_never_passes_a_quota_ceiling_or_a_lending_limit(s: Snapshot) -> None:
    plan = plan_admissions(s)
    held = _final_holdings(s, plan)
    gaining = {(a.team, a.gpu_type) for a in plan.admissions}
    gaining |= {(p.team, p.gpu_type) for p in plan.preemptions}
    capacity: dict[str, int] = defaultdict(int)
    for n in s.nodes:
        capacity[n.gpu_type] += n.capacity
    for team, gt in gaining:
        ceiling = s.quota(team, gt).ceiling
        assert ceiling is None or held[(team, gt)] <= ceiling
        guarded_by_others = 0
        for (other, ogt), q in s.quotas.items():
            if ogt == gt and other != team and q.lending_limit is not None:
                guarded_by_others += max(0, q.nominal - held[(other, gt)] - q.lending_limit)
        used = sum(v for (_, t), v in held.items() if t == gt)
        assert used + guarded_by_others <= capacity[gt]


@settings(max_examples=300, deadline=None)
@given(snapshots())
def test_gangs_are_atomic_and_on_their_gpu_type(s: Snapshot) -> None:
    plan = plan_admissions(s)
    queued = {q.id: q for q in s.queued}
    node_type = {n.name: n.gpu_type for n in s.nodes}
    placed = [(a.job_id, a.placement) for a in plan.admissions]
    placed += [(p.preemptor_id, p.placement) for p in plan.preemptions]
    for job_id, placement in placed:
        assert len(placement) == queued[job_id].replicas
        assert {node_type[n] for n in placement} == {queued[job_id].gpu_type}
    decided = [a.job_id for a in plan.admissions] + list(plan.waits)
    assert sorted(decided) == sorted(queued)  # every queued job: admitted xor waiting
    assert sorted(plan.order) == sorted(queued)


@settings(max_examples=300, deadline=None)
@given(snapshots())
def test_protected_jobs_are_never_victims_and_rules_hold(s: Snapshot) -> None:
    plan = plan_admissions(s)
    queued = {q.id: q for q in s.queued}
    running = {r.id: r for r in s.running}
    held: dict[tuple[str, str], int] = defaultdict(int)
    for r in s.running:
        held[(r.team, r.gpu_type)] += r.total_gpus
    seen: set[int] = set()
    per_team: dict[str, int] = defaultdict(int)
    for p in plan.preemptions:
        job = queued[p.preemptor_id]
        per_team[p.team] += len(p.victims)
        if not p.owed:  # rule R5; an owed claim's preemptions count, it is not refused
            left = s.preemption.left(p.team)
            assert left is None or per_team[p.team] <= left
        for v in p.victims:
            r = running[v.job_id]
            limit = s.preemption.max_preemptions_per_job
            # Rule R3 (not for an owed claim, rule R11); rule Q2: a non-preemptible job
            # only for a reclaim (R2).
            assert p.owed or not is_protected(r, s.now, limit) or (
                v.rule is PreemptionRule.RECLAIM and reclaim_only(r, s.now, limit))
            assert r.preemptible or v.rule is PreemptionRule.RECLAIM
            assert v.job_id not in seen  # one victim, one preemptor
            seen.add(v.job_id)
            assert r.gpu_type == job.gpu_type
            if v.rule is PreemptionRule.PRIORITY:  # rule R1
                assert r.tier_rank < job.tier_rank
            else:  # rule R2 (Q2: any tier for a non-preemptible job)
                assert r.team != job.team
                assert r.tier_rank <= job.tier_rank or not r.preemptible
                assert held[(r.team, r.gpu_type)] > s.quota(r.team, r.gpu_type).nominal


@settings(max_examples=200, deadline=None)
@given(snapshots(), st.randoms(use_true_random=False))
def test_the_same_snapshot_gives_the_same_plan_in_any_input_order(
    s: Snapshot, rnd: random.Random,
) -> None:
    plan = plan_admissions(s)
    assert plan_admissions(s) == plan
    shuffled = list(s.queued), list(s.running), list(s.nodes)
    for lst in shuffled:
        rnd.shuffle(lst)
    other = Snapshot(now=s.now, nodes=tuple(shuffled[2]), queued=tuple(shuffled[0]),
                     running=tuple(shuffled[1]), quotas=s.quotas,
                     fair_share_state=s.fair_share_state, interval_seconds=s.interval_seconds,
                     priority_weights=s.priority_weights, preemption=s.preemption)
    assert plan_admissions(other) == plan
