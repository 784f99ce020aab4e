"""Quotas in a tree, rules Q3-Q7 (docs/scheduling.md, "Quotas in a tree"): table tests
per rule, Volcano's reported failures of hierarchical reclaim as scenarios, the flat
fast path held to the tree's plans, and the reclaim property over random trees (with
the mutation of rule Q6 it catches)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.preemption import owed_claim
from queueing.policy.quota_tree import QuotaTree
from queueing.policy.snapshot import QuotaLimit
from queueing.policy.workspace import Workspace

from .tree_world import GT, place, queued, two_cycles, victim_teams, world

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
    recent = running[2].started_at.replace(minute=50)  # 10 minutes ago, not an hour
    running = running[:2] + tuple(replace(r, started_at=recent) for r in running[2:])
    first = plan_admissions(world(parent, SHARE_Q, running, [queued(10, "vision", 4)], 2))
    assert victim_teams(first) == ["intern"]
    # Flat (no departments), R4 alone: the job that lost the least work goes.
    flat = dict.fromkeys(parent)
    first = plan_admissions(world(flat, {"vision": Q(4)}, running, [queued(10, "vision", 4)], 2))
    assert victim_teams(first) == ["guest"]


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
