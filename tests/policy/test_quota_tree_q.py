"""Quotas in a tree, rules Q3-Q7 (docs/scheduling.md, "Quotas in a tree"): table tests
per rule, Volcano's reported failures of hierarchical reclaim as scenarios, the flat
fast path held to the tree's plans, and the reclaim property over random trees (with
the mutation of rule Q6 it catches)."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from queueing.policy import workspace
from queueing.policy.admission import Plan, WaitReason, plan_admissions
from queueing.policy.preemption import owed_claim
from queueing.policy.quota_tree import QuotaTree
from queueing.policy.snapshot import (
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)
from queueing.policy.workspace import Ledger, Workspace

from .tree_world import GT, NOW, place, queued, two_cycles, victim_teams, world

Q = QuotaLimit

# research (64 + borrowing 8): vision 32, speech 32; ops (64): prod 64. 16 nodes.
RESEARCH = {"vision": "research", "speech": "research", "research": None,
            "prod": "ops", "ops": None}


def research_quotas(**over: QuotaLimit) -> dict[str, QuotaLimit]:
    quotas = {"research": Q(64, 8), "vision": Q(32), "speech": Q(32), "ops": Q(64),
              "prod": Q(64)}
    quotas.update(over)
    return quotas


# --- Q3: the nominal carved down the tree -----------------------------------------------

@pytest.mark.parametrize(
    ("quotas", "node", "nominal", "own"),
    [
        ({"research": Q(16), "vision": Q(8), "speech": Q(4)}, "research", 16, 4),
        ({"research": Q(16), "vision": Q(8), "speech": Q(4)}, "vision", 8, 8),
        ({"vision": Q(8), "speech": Q(4)}, "research", 12, 0),  # no row: the children's sum
        ({"research": Q(16)}, "research", 16, 16),  # teams without rows: all pool
    ],
)
def test_rule_q3_a_departments_nominal_is_carved_into_its_childrens(
    quotas: dict[str, QuotaLimit], node: str, nominal: int, own: int,
) -> None:
    tree = QuotaTree(RESEARCH, {(t, GT): q for t, q in quotas.items()}, {GT: 64})
    assert tree.nominal(node, GT) == nominal
    assert tree.own[(node, GT)] == own


def test_rule_q3_the_pool_is_shared_by_the_subtree_and_no_further() -> None:
    """research 16 = vision 8 + speech 4 + a pool of 4, borrowing limit 0: vision may
    take its 8, the pool's 4 and speech's unused 4 - 16 - and not one more."""
    quotas = {"research": Q(16, 0), "vision": Q(8), "speech": Q(4)}
    tree = QuotaTree(RESEARCH, {(t, GT): q for t, q in quotas.items()}, {GT: 64})
    assert tree.fits("vision", GT, 16)
    assert not tree.fits("vision", GT, 17)
    tree.add("speech", GT, 4)
    assert tree.fits("vision", GT, 12) and not tree.fits("vision", GT, 13)


# --- Q4: admission in the tree ------------------------------------------------------------

def test_rule_q4_the_wait_names_the_binding_department() -> None:
    running = place([(1, "vision", 40), (2, "speech", 30)], 16)
    s = world(RESEARCH, research_quotas(), running, [queued(10, "vision", 4)], 16)
    plan = plan_admissions(s)
    assert plan.admissions == ()
    wait = plan.waits[10]
    assert wait.reason is WaitReason.QUOTA
    assert wait.message == (
        "department research (above team vision) may hold at most 72 h100 GPUs "
        "(nominal 64 + borrowing limit 8) and holds 70; 4 more would pass it (rule Q4)")


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000))
def test_rule_q4_the_kept_ranking_of_guarders_is_the_plain_one(seed: int) -> None:
    """`QuotaTree.guarders` keeps its ranking until usage moves: over random trees and
    moves it names exactly what `guarders_reference` walks and sorts anew."""
    import random

    rng = random.Random(seed)
    teams = [f"n{i}" for i in range(rng.randint(2, 25))]
    parent = {t: (rng.choice(teams[:i]) if i and rng.random() < 0.7 else None)
              for i, t in enumerate(teams)}
    quotas = {}
    for t in teams:
        if rng.random() < 0.7:
            n = rng.randint(0, 16)
            quotas[(t, GT)] = QuotaLimit(n, rng.choice([None, rng.randint(0, 8)]),
                                         rng.choice([None, rng.randint(0, n)]))
    tree = QuotaTree(parent, quotas, {GT: 200})
    for _ in range(30):
        besides = rng.choice(teams)
        assert tree.guarders(GT, besides) == tree.guarders_reference(GT, besides)
        if rng.random() < 0.6:
            tree.add(rng.choice(teams), GT, rng.randint(-2, 6))


def test_rule_q4_within_every_limit_it_is_admitted() -> None:
    running = place([(1, "vision", 40), (2, "speech", 30)], 16)
    s = world(RESEARCH, research_quotas(), running, [queued(10, "vision", 2)], 16)
    assert [a.job_id for a in plan_admissions(s).admissions] == [10]


def test_rule_q4_a_job_larger_than_the_departments_limit_never_fits() -> None:
    s = world(RESEARCH, research_quotas(), (), [queued(10, "vision", 80)], 16)
    wait = plan_admissions(s).waits[10]
    assert wait.reason is WaitReason.NEVER_FITS
    assert "department research (above team vision) may hold at most 72" in wait.message


def test_rule_q4_gpus_a_department_guards_name_it() -> None:
    """Department speech (nominal 8, lending limit 0) keeps its 8 idle GPUs: vision, in
    another department, may not borrow them, and the wait says who guards them."""
    parent = {"speech-asr": "speech", "speech": None, "vision": "research",
              "research": None}
    quotas = {"speech": Q(8, None, 0), "speech-asr": Q(8), "research": Q(8),
              "vision": Q(8)}
    s = world(parent, quotas, (), [queued(10, "vision", 12)], 2)
    plan = plan_admissions(s)
    wait = plan.waits[10]
    assert wait.reason is WaitReason.LENDING
    assert wait.message == (
        "8 of the 16 h100 GPUs left are guarded by department speech (8) (their lending "
        "limits); team vision may not borrow them (rule Q4)")
    # Within what is not guarded, it is admitted.
    s = world(parent, quotas, (), [queued(10, "vision", 8)], 2)
    assert [a.job_id for a in plan_admissions(s).admissions] == [10]


def test_rule_q4_the_fleets_cap_alone_stays_a_capacity_wait() -> None:
    """A full fleet in a tree without lending limits: the job waits for capacity (rule
    A2), not for quota, as it would flat."""
    running = place([(1, "prod", 64), (2, "speech", 64)], 16)
    s = world(RESEARCH, research_quotas(), running, [queued(10, "vision", 4)], 16,
              preemption=replace(world(RESEARCH, {}, (), (), 1).preemption, enabled=False))
    assert plan_admissions(s).waits[10].reason is WaitReason.CAPACITY


# --- Q5: lending to siblings first, then up -------------------------------------------------

def test_rule_q5_a_team_borrowing_inside_its_department_does_not_make_it_borrow() -> None:
    """vision (8) borrows 4 of speech's (8) unused nominal: vision borrows, research (16)
    does not - and another department's teams are untouched."""
    parent = {**RESEARCH}
    quotas = {"research": Q(16), "vision": Q(8), "speech": Q(8), "ops": Q(16),
              "prod": Q(16)}
    tree = QuotaTree(parent, {(t, GT): q for t, q in quotas.items()}, {GT: 32})
    tree.add("vision", GT, 12)
    assert tree.borrowing("vision", GT)
    assert not tree.borrowing("research", GT)
    assert tree.usage[("research", GT)] == 12 <= tree.sq[("research", GT)]
    # Past its department's nominal it borrows from the fleet: research does too.
    tree.add("vision", GT, 8)
    assert tree.borrowing("research", GT)


def test_rule_q5_a_sibling_takes_the_department_pool_before_the_fleet() -> None:
    """research 16 with borrowing limit 0 (vision 8, speech 8): vision gets speech's
    idle 8 but nothing from ops's idle 16."""
    quotas = {"research": Q(16, 0), "vision": Q(8), "speech": Q(8), "ops": Q(16),
              "prod": Q(16)}
    s = world(RESEARCH, quotas, (), [queued(10, "vision", 16), queued(11, "vision", 1)], 4)
    plan = plan_admissions(s)
    assert [a.job_id for a in plan.admissions] == [10]
    assert "department research (above team vision)" in plan.waits[11].message


# --- Q6: reclaim walks the tree -------------------------------------------------------------

# research 8 = vision 4 + speech 4 (no pool); intern (no row) under research; ops 8: prod 8.
SHARE = {"vision": "research", "speech": "research", "intern": "research",
         "research": None, "prod": "ops", "ops": None}
SHARE_Q = {"research": Q(8), "vision": Q(4), "speech": Q(4), "ops": Q(8), "prod": Q(8)}


def test_rule_q6_the_sibling_holding_a_teams_share_is_reclaimed_not_the_others() -> None:
    """intern holds vision's lent 4; speech is within its 4, prod within ops's 8. vision
    takes back exactly intern's job, and runs the next cycle."""
    running = place([(1, "speech", 4), (2, "intern", 4), (3, "prod", 8)], 2)
    first, _s2, second = two_cycles(world(SHARE, SHARE_Q, running,
                                          [queued(10, "vision", 4)], 2))
    assert victim_teams(first) == ["intern"]
    assert [v.job_id for p in first.preemptions for v in p.victims] == [2]
    assert [a.job_id for a in second.admissions] == [10]


def test_rule_q6_a_department_borrowing_from_the_fleet_is_reclaimed_from() -> None:
    """research holds 12 of its 8 (intern borrows from the fleet); prod, within ops's
    8, takes back its 4 from research's subtree - from intern, its borrower."""
    running = place([(1, "vision", 4), (2, "speech", 4), (3, "intern", 4), (4, "prod", 4)], 2)
    first, _s2, second = two_cycles(world(SHARE, SHARE_Q, running,
                                          [queued(10, "prod", 4)], 2))
    assert victim_teams(first) == ["intern"]
    assert [a.job_id for a in second.admissions] == [10]


def test_rule_q6_no_reclaim_from_a_team_whose_path_below_the_lca_does_not_borrow() -> None:
    """research borrows from the fleet (intern), but for vision - its sibling - speech
    is within its share: speech is no victim, only intern is."""
    ws = Workspace(world(SHARE, SHARE_Q, place([(1, "speech", 4), (2, "intern", 8)], 2),
                         (), 2))
    assert ws.ledger.reclaimable("vision", "intern", GT)
    assert not ws.ledger.reclaimable("vision", "speech", GT)
    assert ws.ledger.reclaimable("prod", "speech", GT)  # research borrows, below the root


def test_rule_q6_victims_nearest_first() -> None:
    """Both intern (a sibling) and guest (top level, no quota) borrow; vision's claim
    takes the sibling's job although guest's jobs lost less work (R4 alone would take
    one of them)."""
    parent = {**SHARE, "guest": None}
    running = place([(1, "speech", 4), (2, "intern", 4), (3, "guest", 4), (4, "guest", 4)], 2)
    recent = NOW - timedelta(minutes=10)  # not an hour ago
    running = running[:2] + tuple(replace(r, started_at=recent) for r in running[2:])
    first = plan_admissions(world(parent, SHARE_Q, running, [queued(10, "vision", 4)], 2))
    assert victim_teams(first) == ["intern"]
    # Flat (no departments), R4 alone: the job that lost the least work goes.
    flat = dict.fromkeys(parent)
    first = plan_admissions(world(flat, {"vision": Q(4)}, running, [queued(10, "vision", 4)], 2))
    assert victim_teams(first) == ["guest"]


def test_rule_q6_is_rechecked_as_each_victim_is_taken() -> None:
    """b (department d1, both 8) holds 12, c (top level, no quota) 4, on a full fleet
    of 16; t (department top, both 8) claims 8. b's jobs lost the least work, but once
    4 of them went b and d1 are within their nominal: the other 4 victims are c's."""
    parent = {"t": "top", "top": None, "b": "d1", "d1": None, "c": None}
    quotas = {"top": Q(8), "t": Q(8), "d1": Q(8), "b": Q(8)}
    jobs = [(i, "b", 1) for i in range(1, 13)] + [(i, "c", 1) for i in range(13, 17)]
    running = place(jobs, 2)
    recent = NOW - timedelta(minutes=10)
    running = tuple(replace(r, started_at=recent) if r.team == "b" else r for r in running)
    first, _s2, second = two_cycles(world(parent, quotas, running, [queued(10, "t", 8)], 2))
    assert victim_teams(first) == ["b"] * 4 + ["c"] * 4
    assert [a.job_id for a in second.admissions] == [10]


def test_rule_q6_the_claimants_department_beyond_its_guarantee_reclaims_nothing_far() -> None:
    """research's own jobs (a department is a team too) hold 8 of its 8; vision, within
    its own 4, may not reclaim from another department's borrower: its path below the
    root (research) would pass its guarantee."""
    parent = {**SHARE, "guest": None}
    running = place([(1, "research", 8), (2, "guest", 8)], 2)
    s = world(parent, SHARE_Q, running, [queued(10, "vision", 4)], 2)
    assert plan_admissions(s).preemptions == ()


# --- Q7: owed in the tree ---------------------------------------------------------------------

@pytest.mark.parametrize(
    ("running", "owed"),
    [
        ([(1, "speech", 4)], True),
        ([(1, "speech", 4), (2, "intern", 4)], True),  # a sibling's borrowing: still owed
        ([(1, "speech", 4), (2, "research", 4)], False),  # the department's own jobs count
        ([(1, "vision", 2)], True),
        ([(1, "vision", 2), (2, "research", 4), (3, "speech", 4)], False),
    ],
)
def test_rule_q7_owed_needs_the_team_and_every_department_above_within_nominal(
    running: list[tuple[int, str, int]], owed: bool,
) -> None:
    s = world(SHARE, SHARE_Q, place(running, 2), [queued(10, "vision", 2)], 2)
    assert owed_claim(s, s.queued[0], GT) is owed


def test_rule_q7_an_owed_claim_preempts_at_once_from_q6_victims() -> None:
    """With no search left in the pass (max_searches 0), only an owed claim preempts."""
    running = place([(1, "speech", 4), (2, "intern", 4), (3, "prod", 8)], 2)
    s = world(SHARE, SHARE_Q, running, [queued(10, "vision", 4)], 2)
    s = replace(s, preemption=replace(s.preemption, max_searches=0))
    plan = plan_admissions(s)
    assert [(p.preemptor_id, p.owed) for p in plan.preemptions] == [(10, True)]
    assert victim_teams(plan) == ["intern"]
    # The same claim by a team whose department's own jobs fill its guarantee: not owed,
    # and with no search left it waits.
    running = place([(1, "speech", 4), (2, "research", 4), (3, "prod", 8)], 2)
    s = replace(s, running=running)
    assert plan_admissions(s).preemptions == ()


def test_rule_q7_the_pass_counts_what_it_already_claimed() -> None:
    """Two vision jobs of 4 each, vision's nominal 4: only the first is owed."""
    running = place([(1, "speech", 4), (2, "intern", 4), (3, "prod", 8)], 2)
    s = world(SHARE, SHARE_Q, running, [queued(10, "vision", 4), queued(11, "vision", 4)], 2)
    s = replace(s, preemption=replace(s.preemption, max_searches=0))
    plan = plan_admissions(s)
    assert [p.preemptor_id for p in plan.preemptions] == [10]


# --- Volcano's reported failures of hierarchical reclaim, as scenarios --------------------
# volcano#4817, volcano#4679, volcano#3990, volcano#4808: "reclaim does not work in
# hierarchical mode". Each runs two cycles: the claimant's victims are taken in the
# first, it runs in the second.

def test_rule_q6_volcano_reclaim_across_two_levels() -> None:
    """lab > group > alpha (alpha guaranteed 8 through two departments) while beta, in
    another department, borrows the whole fleet: alpha takes back its 8."""
    parent = {"alpha": "group", "group": "lab", "lab": None, "beta": "other",
              "other": None}
    quotas = {"lab": Q(8), "group": Q(8), "alpha": Q(8), "other": Q(8), "beta": Q(8)}
    running = place([(1, "beta", 8), (2, "beta", 8)], 2)
    first, _s2, second = two_cycles(world(parent, quotas, running,
                                          [queued(10, "alpha", 8)], 2))
    assert victim_teams(first) == ["beta"]
    assert [a.job_id for a in second.admissions] == [10]


def test_rule_q6_volcano_a_sibling_borrowing_from_an_idle_department() -> None:
    """x and y share department d1 (8 each); d2 (team z, 16) is idle, so y borrows it.
    When z's work arrives, z takes back its 16 from y - never from x, within its share."""
    parent = {"x": "d1", "y": "d1", "d1": None, "z": "d2", "d2": None}
    quotas = {"d1": Q(16), "x": Q(8), "y": Q(8), "d2": Q(16), "z": Q(16)}
    running = place([(1, "x", 8), (2, "y", 8), (3, "y", 8), (4, "y", 8)], 4)
    first, _s2, second = two_cycles(world(parent, quotas, running,
                                          [queued(10, "z", 16)], 4))
    assert victim_teams(first) == ["y", "y"]
    assert [a.job_id for a in second.admissions] == [10]


def test_rule_q6_volcano_a_deep_tree_with_lending_limits_at_several_levels() -> None:
    """org > div > dept > team (4 levels) with lending limits at div and team; a team of
    another division borrows what the deep team does not use; the deep team claims its
    nominal back and runs, and the lending limits keep what they guard."""
    parent = {"deep": "dept", "dept": "div", "div": "org", "org": None,
              "near": "dept", "far": "div2", "div2": "org"}
    quotas = {"org": Q(32), "div": Q(16, None, 8), "dept": Q(16), "deep": Q(8, None, 4),
              "near": Q(8), "div2": Q(16), "far": Q(16)}
    tree = QuotaTree(parent, {(t, GT): q for t, q in quotas.items()}, {GT: 32})
    # deep keeps 4 of its 8; div keeps its subtree quota (12: deep lends only 4) beyond
    # its lending limit of 8.
    assert tree.g[("deep", GT)] == 4 and tree.g[("div", GT)] == 4
    # near runs its 8; far borrows 4 beyond its 16; the 4 left are deep's kept part.
    running = place([(1, "near", 8), (2, "far", 8), (3, "far", 8), (4, "far", 4)], 4)
    s = world(parent, quotas, running, [queued(9, "far", 4)], 4)
    wait = plan_admissions(s).waits[9]
    assert wait.reason is WaitReason.LENDING
    assert "guarded by team deep (4)" in wait.message
    first, _s2, second = two_cycles(world(parent, quotas, running,
                                          [queued(10, "deep", 8)], 4))
    assert victim_teams(first) == ["far"]
    assert [a.job_id for a in second.admissions] == [10]


# --- the reclaim property over random trees -------------------------------------------------

@st.composite
def trees(draw: st.DrawFn) -> Snapshot:
    """A random tree (depth up to 4; borrowing and lending limits at random levels;
    some teams without a row) carved inside a full fleet of 2-6 nodes; running jobs of
    its teams filling every GPU; 1-4 queued jobs. Every tier the same: the claims are
    reclaims (rules Q6, Q7), not priority."""
    nodes = draw(st.integers(2, 6), label="nodes")
    fleet = nodes * 8
    parent: dict[str, str | None] = {}
    quotas: dict[str, QuotaLimit] = {}
    teams: list[str] = []

    def grow(name: str, above: str | None, depth: int, budget: int) -> None:
        parent[name] = above
        kids = draw(st.integers(0, 3)) if depth < 4 else 0
        nominal = draw(st.integers(0, budget))
        if kids or draw(st.booleans()):
            borrowing = draw(st.one_of(st.none(), st.integers(0, 8)))
            lending = draw(st.one_of(st.none(), st.integers(0, nominal)))
            quotas[name] = QuotaLimit(nominal, borrowing, lending)
        else:
            nominal = 0  # no row: guaranteed nothing
        if not kids:
            teams.append(name)
            return
        carve(name, depth + 1, nominal, kids)

    def carve(above: str | None, depth: int, budget: int, kids: int) -> None:
        """The children's nominals out of `budget`; often the last takes all that is
        left (no pool)."""
        left = budget
        for k in range(kids):
            last = k == kids - 1 and draw(st.booleans())
            share = left if last else draw(st.integers(0, left))
            left -= share
            grow(f"{above or 'd'}.{k}", above, depth, share)

    carve(None, 1, fleet, draw(st.integers(1, 3)))
    jobs: list[tuple[int, str, int]] = []
    used = 0
    while used < fleet:
        gpus = min(fleet - used, draw(st.integers(1, 4)))
        jobs.append((len(jobs) + 1, draw(st.sampled_from(teams)), gpus))
        used += gpus
    guaranteed = [t for t in teams if t in quotas] or teams
    queue = [queued(100 + i, draw(st.sampled_from(guaranteed)), draw(st.integers(1, 4)))
             for i in range(draw(st.integers(1, 4)))]
    return world(parent, quotas, place(jobs, nodes), queue, nodes)


def owed_in_order(s: Snapshot, plan: Plan) -> list[QueuedJob]:
    """The queued jobs owed their GPUs (rule Q7) in the pass's order, each counting as
    held, as rule R11 does, the jobs before it that the pass admitted or preempted for."""
    by_id = {j.id: j for j in s.queued}
    served = {a.job_id for a in plan.admissions} | {p.preemptor_id for p in plan.preemptions}
    owed: list[QueuedJob] = []
    before: list[RunningJob] = []
    for job_id in plan.order:
        job = by_id[job_id]
        if owed_claim(replace(s, running=s.running + tuple(before)), job, GT):
            owed.append(job)
        if job_id in served:
            before.append(RunningJob(job.id, job.team, GT, 1, job.replicas, job.tier_rank))
    return owed


def stranded(s: Snapshot) -> list[int]:
    """The owed jobs not admitted after one cycle plus the victims' grace: plan,
    remove the victims the plan preempted, plan again."""
    first, _s2, second = two_cycles(s)
    admitted = {a.job_id for a in (*first.admissions, *second.admissions)}
    return [j.id for j in owed_in_order(s, first) if j.id not in admitted]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trees())
def test_rule_q6_no_team_within_its_guarantee_waits_beyond_a_cycle_for_a_borrower(
    s: Snapshot,
) -> None:
    """In a full fleet, every GPU another team holds beyond some guarantee is a
    borrower's; a job owed its GPUs (its team and every department above within their
    nominal, rule Q7) is admitted within one cycle plus its victims' grace."""
    assert stranded(s) == []


def _top_level_only(self: Ledger, claimant: str, team: str, gpu_type: str) -> bool:
    """A deliberate mutation of rule Q6: only top-level borrowing counts."""
    tree = self.running_tree
    if tree is None:
        return self.borrowing(team, gpu_type)
    top = tree.path(team)[-1]
    return top != tree.path(claimant)[-1] and tree.borrowing(top, gpu_type)


def test_rule_q6_the_property_catches_top_level_only_reclaim(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The property above fails when rule Q6 counts only top-level borrowing: the
    sibling scenario strands vision, and hypothesis finds a random tree that strands a
    claim too."""
    monkeypatch.setattr(Ledger, "reclaimable", _top_level_only)
    running = place([(1, "speech", 4), (2, "intern", 4), (3, "prod", 8)], 2)
    assert stranded(world(SHARE, SHARE_Q, running, [queued(10, "vision", 4)], 2)) == [10]
    found = find(trees(), lambda s: bool(stranded(s)),
                 settings=settings(max_examples=1000, deadline=None, database=None,
                                   derandomize=True, phases=[Phase.generate]))
    assert stranded(found)


# --- the flat fast path is the tree's plan ---------------------------------------------------

@st.composite
def flat_worlds(draw: st.DrawFn) -> Snapshot:
    """Random flat worlds (no department): quotas with random limits, running jobs of
    three tiers, queued gangs, preemption with the product's rules R3, R5 and R9."""
    nodes = draw(st.integers(1, 4))
    fleet = nodes * 8
    teams = ["a", "b", "c", "d"]
    quotas = {t: QuotaLimit(n, draw(st.one_of(st.none(), st.integers(0, 8))),
                            draw(st.one_of(st.none(), st.integers(0, n))))
              for t in teams if draw(st.booleans())
              for n in (draw(st.integers(0, fleet // 2)),)}
    jobs: list[tuple[int, str, int]] = []
    used = 0
    for _ in range(draw(st.integers(0, 8))):
        gpus = draw(st.integers(1, 6))
        if used + gpus > fleet:
            break
        jobs.append((len(jobs) + 1, draw(st.sampled_from(teams)), gpus))
        used += gpus
    running = tuple(replace(r, tier_rank=draw(st.sampled_from([0, 100, 200])),
                            started_at=NOW - timedelta(minutes=draw(st.integers(1, 120))))
                    for r in place(jobs, nodes))
    queue = [queued(100 + i, draw(st.sampled_from(teams)), draw(st.integers(1, 10)),
                    tier=draw(st.sampled_from([0, 100, 200])))
             for i in range(draw(st.integers(1, 6)))]
    pre = PreemptionSettings(max_searches=draw(st.integers(0, 3)))
    return world(dict.fromkeys(teams), quotas, running, queue, nodes, preemption=pre)


def _plan_words(s: Snapshot) -> tuple[object, ...]:
    plan = plan_admissions(s)
    return (plan.admissions, plan.preemptions, plan.order,
            sorted((j, w.reason) for j, w in plan.waits.items()))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flat_worlds())
def test_rule_q4_a_flat_forest_plans_the_same_through_the_tree(s: Snapshot) -> None:
    """Rule Q1's flat ledger (the fast path) and the quota tree give the same plan -
    admissions, preemptions and their victims, order and wait reasons - on flat worlds."""
    flat = _plan_words(s)
    workspace.TREE_ALWAYS = True
    try:
        tree = _plan_words(s)
    finally:
        workspace.TREE_ALWAYS = False
    assert tree == flat
