"""The pass's shortcuts for a fleet (docs/performance.md, "A fleet of 5,000 nodes: the
pass") give what their plain references give, over random small fleets (hypothesis):
teams in a tree of departments with borrowing and lending limits at every level
(rules Q3-Q7), whole and time-sliced GPU types (rules H1-H5), one or two clusters with
spot pools (rules K1-K4), a long queue of few shapes, preemption off or on. Each
shortcut is switched off in turn and the plans compared whole: admissions,
preemptions, order, every wait's reason and message."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from queueing.policy import admission, workspace
from queueing.policy.admission import Plan, WaitReason, plan_admissions
from queueing.policy.fairshare import FairShareState
from queueing.policy.priority import PriorityWeights
from queueing.policy.quota_tree import QuotaTree
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)
from queueing.policy.stages import heads, nodes, pipeline, quota
from queueing.policy.stages.heads import QueueOrder

from . import test_plan_fast_paths, test_plan_properties
from .clusters_world import NOW
from .test_plan_fast_paths import queue_order_ids

WHOLE = ("h100", "a100")
SLICED, SLICES = "a10", 4


def _tree(rnd: random.Random) -> tuple[dict[str, str | None], list[str]]:
    """Divisions, departments and teams (or teams alone at the top, now and then)."""
    parent: dict[str, str | None] = {}
    teams: list[str] = []
    for d in range(rnd.randint(1, 3)):
        div = f"d{d}"
        parent[div] = None
        for e in range(rnd.randint(1, 2)):
            dept = f"{div}.e{e}"
            parent[dept] = div
            for k in range(rnd.randint(1, 3)):
                team = f"{dept}.t{k}"
                parent[team] = dept
                teams.append(team)
    if rnd.random() < 0.3:
        parent["solo"] = None
        teams.append("solo")
    return parent, teams


def _quota(rnd: random.Random) -> QuotaLimit:
    nominal = rnd.choice((0, 2, 4, 8, 16, 32))
    return QuotaLimit(nominal, rnd.choice((None, None, 0, 2, 4, 8, 16)),
                      rnd.choice((None, None, 0, nominal // 2)))


@st.composite
def fleets(draw: st.DrawFn) -> Snapshot:
    """A small fleet in the bench's image: a quota tree, whole and time-sliced types,
    GPUs partly taken, a queue of many jobs of few shapes over three tiers."""
    rnd = random.Random(draw(st.integers(0, 2**32)))
    parent, teams = _tree(rnd)
    clusters = ("a", "b")[: rnd.choice((1, 1, 2))]
    node_list: list[NodeState] = []
    running: list[RunningJob] = []
    for cluster in clusters:
        for gt in (*WHOLE, SLICED):
            for i in range(rnd.randint(1, 3)):
                spot = cluster == "a" and i == 2
                name = f"{cluster}/{gt}-{i}"
                if gt == SLICED:
                    gf = [rnd.randint(0, SLICES) for _ in range(4)]
                    node_list.append(NodeState(name, gt, 4 * SLICES, sum(gf), cluster=cluster,
                                               spot=spot, slices_per_gpu=SLICES,
                                               gpu_free=tuple(gf)))
                    used = 4 * SLICES - sum(gf)
                else:
                    free = rnd.randint(0, 8)
                    node_list.append(NodeState(name, gt, 8, free, cluster=cluster, spot=spot))
                    used = 8 - free
                if used:
                    running.append(RunningJob(
                        id=len(running) + 1, team=rnd.choice(teams), gpu_type=gt,
                        gpus_per_replica=used, replicas=1, tier_rank=rnd.choice((0, 100)),
                        started_at=NOW - timedelta(hours=rnd.uniform(0.1, 5)),
                        nodes=(name,), cluster=cluster))
    quotas = {(n, gt): _quota(rnd) for n in parent for gt in (*WHOLE, SLICED)
              if rnd.random() < 0.9}
    queued = []
    shapes = [(rnd.choice((*WHOLE, SLICED)), rnd.choice((1, 1, 2, 4, 8)), rnd.choice((1, 1, 2)))
              for _ in range(rnd.randint(2, 8))]
    for k in range(rnd.randint(5, 120)):
        gt, g, reps = rnd.choice(shapes)
        queued.append(QueuedJob(
            id=1000 + k, team=rnd.choice(teams), gpu_type=gt, gpus_per_replica=g,
            replicas=reps, tier_rank=rnd.choice((0, 100, 100, 200)),
            submitted_at=NOW - timedelta(seconds=rnd.randrange(100_000)),
            clusters=rnd.choice((None, None, frozenset("a"), frozenset("b"))),
            spot_ok=rnd.random() < 0.5, max_runtime_seconds=rnd.choice((None, 600))))
    state = FairShareState({t: rnd.expovariate(0.1) for t in teams},
                           {t: 1 / len(teams) for t in teams})
    searches = rnd.choice((0, 0, 0, 2))
    return Snapshot(
        now=NOW, nodes=tuple(node_list), queued=tuple(queued), running=tuple(running),
        quotas=quotas, fair_share_state=state, priority_weights=PriorityWeights(),
        interval_seconds=rnd.choice((3.0, 600.0)), units_per_gpu={SLICED: SLICES},
        team_parent=parent, reservation=rnd.random() < 0.5,
        cluster_ranks={c: rnd.randrange(2) for c in clusters},
        preemption=PreemptionSettings(enabled=searches > 0, max_searches=max(1, searches)))


@contextmanager
def _off(module: object, name: str) -> Iterator[None]:
    kept = getattr(module, name)
    setattr(module, name, False)
    try:
        yield
    finally:
        setattr(module, name, kept)


def _plain(s: Snapshot, module: object, name: str) -> Plan:
    with _off(module, name):
        return plan_admissions(s)


def _same_plan(fast: Plan, ref: Plan) -> None:
    assert fast == ref
    assert dict(fast.wait_causes()) == dict(ref.wait_causes())


def _same(s: Snapshot, plain: Callable[[Snapshot], Plan]) -> None:
    _same_plan(plan_admissions(s), plain(s))


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_rule_q4s_limits_kept_per_top_level_node_are_the_plain_ones(s: Snapshot) -> None:
    """`Ledger.tree_limit` kept until something moves under the team's top-level node
    (`LIMITS_PER_TOP`) against kept until anything moves."""
    _same(s, lambda s: _plain(s, workspace, "LIMITS_PER_TOP"))


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_capacity_waits_kept_per_gpu_type_are_the_plain_ones(s: Snapshot) -> None:
    """Rules E2, E3, K3's memos kept until a node of the type changes (`PER_TYPE`)
    against kept until any node changes."""
    _same(s, lambda s: _plain(s, nodes, "PER_TYPE"))


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 2**32))
def test_rule_q4s_guard_summary_is_the_plain_ranking_summed(seed: int) -> None:
    """`QuotaTree.guard_summary` (the lending wait's words) over random trees and moves:
    the first three, the count and the sum of what `guarders_reference` walks and
    sorts anew for the team."""
    rnd = random.Random(seed)
    teams = [f"n{i}" for i in range(rnd.randint(2, 30))]
    parent = {t: (rnd.choice(teams[:i]) if i and rnd.random() < 0.7 else None)
              for i, t in enumerate(teams)}
    quotas = {}
    for t in teams:
        if rnd.random() < 0.8:
            n = rnd.randint(0, 16)
            quotas[(t, "h100")] = QuotaLimit(n, rnd.choice([None, rnd.randint(0, 8)]),
                                             rnd.choice([None, rnd.randint(0, n)]))
    tree = QuotaTree(parent, quotas, {"h100": 300})
    for _ in range(40):
        besides = rnd.choice((*teams, "newcomer"))
        plain = tree.guarders_reference("h100", besides)
        assert tree.guard_summary("h100", besides) == (
            plain[:3], len(plain), sum(k for _n, k in plain))
        if rnd.random() < 0.6:
            tree.add(rnd.choice((*teams, "newcomer")), "h100", rnd.randint(-2, 6))


@settings(max_examples=200, deadline=None)
@given(st.one_of(fleets(), test_plan_fast_paths.long_queues()), st.sampled_from((1, 2, 5)),
       st.sampled_from((1, 3)))
def test_a_replay_judged_off_and_on_again_gives_the_whole_pass(
        s: Snapshot, quiet: int, trial: int) -> None:
    """The replay of waits stopped after `_LANE_TRIAL` misses and on again after
    `_LANE_QUIET` jobs found the state unchanged, against every job through the whole
    pass."""
    kept = admission._LANE_TRIAL, admission._LANE_QUIET
    admission._LANE_TRIAL, admission._LANE_QUIET = trial, quiet
    try:
        plan = plan_admissions(s)
    finally:
        admission._LANE_TRIAL, admission._LANE_QUIET = kept
    _same_plan(plan, _plain(s, admission, "_REPLAY"))


@settings(max_examples=300, deadline=None)
@given(st.one_of(fleets(), test_plan_fast_paths.long_queues(),
                 test_plan_properties.snapshots()))
def test_waits_replayed_per_gpu_type_and_across_tiers_are_the_whole_pass(
        s: Snapshot) -> None:
    """The replay of waits at each GPU type's stamp, across tiers (`_PER_TYPE`),
    against every job through the whole pass, and against the replay at every
    change's stamp per tier."""
    plan = plan_admissions(s)
    _same_plan(plan, _plain(s, admission, "_REPLAY"))
    _same_plan(plan, _plain(s, admission, "_PER_TYPE"))


@settings(max_examples=200, deadline=None)
@given(fleets())
def test_rule_q4s_lending_words_kept_per_type_are_said_anew(s: Snapshot) -> None:
    """The lending wait's words kept per (team, type) until the type moves
    (`WORDS_KEPT`) against said anew for every wait."""
    _same(s, lambda s: _plain(s, quota, "WORDS_KEPT"))


@settings(max_examples=500, deadline=None)
@given(test_plan_fast_paths.queues_and_charges(), st.sampled_from((1, 2, 5)),
       st.sampled_from((1, 4, 1000)))
def test_the_rest_of_a_tier_sorted_when_quiet_is_the_heaps_order(
        case: tuple[Snapshot, list[tuple[int, str, float]]], quiet: int, share: int) -> None:
    """Rule O1: the heap's tier sorted again once `RESORT_QUIET` jobs passed with no
    charge (and on the heap again at the next charge), against the heap alone."""
    s, charges = case
    # As the pass charges (rule F6): the team of the job just yielded, now and then.
    own = [(n, "", hours) for n, _team, hours in charges]
    for case_charges in (charges, own):
        kept = heads.RESORT_QUIET, heads.RESORT_SHARE
        heads.RESORT_QUIET, heads.RESORT_SHARE = quiet, share
        try:
            fast = queue_order_ids(s, fast=True, charges=case_charges)
        finally:
            heads.RESORT_QUIET, heads.RESORT_SHARE = kept
        assert fast == queue_order_ids(s, fast=False, charges=case_charges)




@settings(max_examples=200, deadline=None)
@given(st.one_of(fleets(), test_plan_fast_paths.long_queues()))
def test_a_plan_on_the_tiers_sorted_when_quiet_is_the_plan_on_the_heap(s: Snapshot) -> None:
    kept = heads.RESORT_QUIET
    heads.RESORT_QUIET = 1
    try:
        fast = plan_admissions(s)
    finally:
        heads.RESORT_QUIET = kept
    _same_plan(fast, _plain(s, QueueOrder, "fast"))


@settings(max_examples=300, deadline=None)
@given(test_plan_fast_paths.queues_and_charges())
def test_a_tier_after_a_charge_sorted_is_the_heaps_order(
        case: tuple[Snapshot, list[tuple[int, str, float]]]) -> None:
    """Rule O1: a tier reached after some charge, sorted with each team's factor as the
    heap keys it then (`LATER_SORTED`), against that tier on the heap from its start."""
    s, charges = case
    own = [(n, "", hours) for n, _team, hours in charges]
    for case_charges in (charges, own):
        fast = queue_order_ids(s, fast=True, charges=case_charges)
        with _off(heads, "LATER_SORTED"):
            assert fast == queue_order_ids(s, fast=True, charges=case_charges)


@st.composite
def big_classes(draw: st.DrawFn) -> Snapshot:
    """A fleet (`fleets`) whose queue is a few classes of many equal jobs - two or three
    teams, one to three shapes, any cluster - with now and then a job the replay does
    not give a wait to (an array's member, a job of several GPU types), and preemption
    off, on with searches, or on with none left (rule R11's owed claims still search)."""
    s = draw(fleets())
    rnd = random.Random(draw(st.integers(0, 2**32)))
    teams = sorted({t for t, _gt in s.quotas if t in s.team_parent and not any(
        p == t for p in s.team_parent.values())})[:rnd.randint(2, 3)] or ["solo"]
    shapes = [(rnd.choice((*WHOLE, SLICED)), rnd.choice((1, 2, 4, 8)), rnd.choice((1, 2)),
               rnd.random() < 0.5) for _ in range(rnd.randint(1, 3))]
    queued = []
    for k in range(rnd.randint(20, 300)):
        gt, g, reps, spot = rnd.choice(shapes)
        odd = rnd.random() < 0.02
        queued.append(QueuedJob(
            id=5000 + k, team=rnd.choice(teams), gpu_type=gt, gpus_per_replica=g,
            replicas=reps, tier_rank=rnd.choice((0, 100, 200)), spot_ok=spot,
            submitted_at=NOW - timedelta(seconds=rnd.randrange(100_000)),
            array_id=7 if odd and gt == SLICED else None,
            gpu_types=(gt, *(t for t in WHOLE if t != gt)) if odd and gt in WHOLE else ()))
    searches = rnd.choice((-1, -1, 0, 2))
    return replace(s, queued=tuple(queued), array_limits={7: 1},
                   preemption=PreemptionSettings(enabled=searches >= 0,
                                                 max_searches=max(0, searches)))


@settings(max_examples=300, deadline=None)
@given(st.one_of(big_classes(), fleets()))
def test_lending_waits_replayed_are_the_whole_pass(s: Snapshot) -> None:
    """Rules A1, Q4: a lending wait given again by the replay of waits (its words an
    entry of `Waits.lending`, `LENDING_REPLAYED`) against each through the stages, and
    against every job through the whole pass."""
    plan = plan_admissions(s)
    _same_plan(plan, _plain(s, pipeline, "LENDING_REPLAYED"))
    _same_plan(plan, _plain(s, admission, "_REPLAY"))


@settings(max_examples=300, deadline=None)
@given(st.one_of(big_classes(), fleets(), test_plan_fast_paths.long_queues(),
                 test_plan_properties.snapshots()))
def test_a_classs_wait_given_at_once_is_the_replay_asked_per_job(s: Snapshot) -> None:
    """A class's wait given to its next jobs until a stamp moves (`_PER_CLASS`) against
    the replay asked for each job, and against every job through the whole pass."""
    plan = plan_admissions(s)
    _same_plan(plan, _plain(s, admission, "_PER_CLASS"))
    _same_plan(plan, _plain(s, admission, "_REPLAY"))


@settings(max_examples=200, deadline=None)
@given(st.one_of(big_classes(), fleets(), test_plan_fast_paths.long_queues(),
                 test_plan_properties.snapshots()), st.integers(0, 2**32))
def test_the_plan_expanded_only_where_read_is_the_plan_made_per_job(
        s: Snapshot, seed: int) -> None:
    """The waits given per class kept in bulk and `Plan.order` kept as indices
    (`_EXPANDED_ON_READ`) against each job's id and wait made in the pass, read every
    way a consumer reads a plan, each on a plan fresh from the pass (its first read
    expands it): how many waits, whether a job waits, one job's wait, the wait causes
    and every wait in order, the order; and against every job through the whole pass."""
    ref = _plain(s, admission, "_EXPANDED_ON_READ")
    ids = list(ref.order)
    probe = random.Random(seed).choice(ids) if ids else 0
    assert len(plan_admissions(s).waits) == len(ref.waits)
    assert (probe in plan_admissions(s).waits) == (probe in ref.waits)
    assert plan_admissions(s).waits.get(probe) == ref.waits.get(probe)
    assert list(plan_admissions(s).wait_causes()) == list(ref.wait_causes())
    plan = plan_admissions(s)
    assert len(plan.order) == len(ref.order)
    assert plan.order == ref.order and tuple(plan.order) == tuple(ref.order)
    assert plan.order[:2] == ref.order[:2]
    assert list(plan.waits.items()) == list(ref.waits.items())
    _same_plan(plan, ref)
    _same_plan(plan, _plain(s, admission, "_REPLAY"))


@settings(max_examples=300, deadline=None)
@given(st.one_of(big_classes(), fleets(), test_plan_fast_paths.long_queues(),
                 test_plan_properties.snapshots()))
def test_rule_q4s_waits_replayed_per_path_are_the_whole_pass(s: Snapshot) -> None:
    """Rule Q4's waits of stage 3 replayed while the team's path binds as it did
    (`_PATH_KEPT`) against the replay at the GPU type's stamp alone, and against every
    job through the whole pass."""
    plan = plan_admissions(s)
    _same_plan(plan, _plain(s, admission, "_PATH_KEPT"))
    _same_plan(plan, _plain(s, admission, "_REPLAY"))


def _two_teams(one_division: bool, capacity: bool = False) -> Snapshot:
    """Team d0.e.t under department d0.e, at its borrowing limit of h100 (each job it
    asks waits for rule Q4, naming d0.e), and team d1.e.t with room, under another
    division or (`one_division`) under d0 too; their jobs interleaved in rule O1's order
    (fixed factors: no charge moves a team down), preemption off. Each admission of
    d1.e.t moves the type; in one division the path's count too, not d0.e's holdings.
    With `capacity`, d0.e has no borrowing limit and d0.e.t's jobs are gangs of two
    nodes: they wait for capacity, and the free blocks their words name shrink with each
    admission of d1.e.t."""
    parent: dict[str, str | None] = {
        "d0": None, "d0.e": "d0", "d0.e.t": "d0.e", "d1": None,
        "d1.e": "d0" if one_division else "d1", "d1.e.t": "d1.e"}
    quotas = {("d0.e", "h100"): QuotaLimit(4, None if capacity else 0),
              ("d0.e.t", "h100"): QuotaLimit(4),
              ("d1.e", "h100"): QuotaLimit(16), ("d1.e.t", "h100"): QuotaLimit(16)}
    running = (RunningJob(id=1, team="d0.e.t", gpu_type="h100", gpus_per_replica=4,
                          replicas=1, tier_rank=0, started_at=NOW - timedelta(hours=1),
                          nodes=("n0",)),)
    queued = tuple(QueuedJob(
        id=100 + k, team=("d0.e.t", "d1.e.t")[k % 2], gpu_type="h100",
        gpus_per_replica=8 if capacity and k % 2 == 0 else 1,
        replicas=2 if capacity and k % 2 == 0 else 1, tier_rank=0,
        submitted_at=NOW - timedelta(seconds=1000 - k)) for k in range(40))
    return Snapshot(
        now=NOW, nodes=(NodeState("n0", "h100", 8, 4), NodeState("n1", "h100", 8, 8)),
        queued=queued, running=running, quotas=quotas, team_parent=parent,
        fair_share={"d0.e.t": 1.0, "d1.e.t": 1.0}, priority_weights=PriorityWeights(),
        preemption=PreemptionSettings(enabled=False))


def test_rule_q4s_waits_are_replayed_per_path_where_the_type_moved() -> None:
    """The path kept (`_PATH_KEPT`) runs where it may: d0.e.t's class replays its quota
    wait while the GPU type moves - nothing moved under its division, or (one division)
    its binding level holds what it held; the plans stay the reference's."""
    calls: list[tuple[bool, bool]] = []
    kept = admission._Replay._path_holds

    def spy(self: admission._Replay, c: int, path: tuple[list[int], int, object],
            job: QueuedJob) -> bool:
        moved = path[0][0] != path[1]
        calls.append((moved, kept(self, c, path, job)))  # type: ignore[arg-type]
        return calls[-1][1]

    for one_division in (False, True):
        s = _two_teams(one_division)
        calls.clear()
        admission._Replay._path_holds = spy  # type: ignore[method-assign, assignment]
        try:
            plan = plan_admissions(s)
        finally:
            admission._Replay._path_holds = kept  # type: ignore[method-assign]
        _same_plan(plan, _plain(s, admission, "_PATH_KEPT"))
        _same_plan(plan, _plain(s, admission, "_REPLAY"))
        assert len(plan.admissions) == 12
        assert calls and all(held for _, held in calls), "not replayed per path"
        assert all(moved == one_division for moved, _ in calls)
        assert plan.waits[102].reason is WaitReason.QUOTA
    for one_division in (False, True):  # capacity waits: not kept per path
        s = _two_teams(one_division, capacity=True)
        plan = plan_admissions(s)
        _same_plan(plan, _plain(s, admission, "_PATH_KEPT"))
        assert plan.waits[102].reason is WaitReason.CAPACITY
        assert plan.waits[102] != plan.waits[138]
