"""Rules Q1, O1, A1-A5: ordering and admission on a snapshot, without Django."""

from __future__ import annotations

import itertools
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.fairshare import FairShareState
from queueing.policy.priority import PriorityWeights, job_priority
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
NO_AGE = PriorityWeights(fair_share=10_000.0, age=0.0, size=0.0)


def ago(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def nodes(*specs: tuple[str, int, int] | tuple[str, int]) -> tuple[NodeState, ...]:
    """("h100", 8) = one empty 8-GPU node; ("h100", 8, 3) = 3 of them free."""
    out = []
    counts: dict[str, int] = {}
    for spec in specs:
        gpu_type, cap = spec[0], spec[1]
        free = spec[2] if len(spec) > 2 else cap  # type: ignore[misc]
        i = counts.get(gpu_type, 0)
        counts[gpu_type] = i + 1
        out.append(NodeState(f"{gpu_type}-{i}", gpu_type, cap, free))
    return tuple(out)


def q(job_id: int, team: str = "a", gpus: int = 1, replicas: int = 1, tier: int = 100,
      gpu_type: str = "h100", age: float = 0.0) -> QueuedJob:
    return QueuedJob(job_id, team, gpu_type, gpus, replicas, tier, ago(age + job_id / 1000))


def run(job_id: int, team: str = "a", gpus: int = 1, on: tuple[str, ...] = ("h100-0",),
        tier: int = 0, started: float = 3600.0, preemptible: bool = True,
        min_runtime: int = 0, gpu_type: str = "h100") -> RunningJob:
    return RunningJob(job_id, team, gpu_type, gpus, len(on), tier, preemptible=preemptible,
                      started_at=ago(started), min_runtime_seconds=min_runtime, nodes=on)


def snap(*, nodes: tuple[NodeState, ...], queued: tuple[QueuedJob, ...] = (),
         running: tuple[RunningJob, ...] = (), **kw: Any) -> Snapshot:
    kw.setdefault("priority_weights", NO_AGE)
    kw.setdefault("preemption", PreemptionSettings(enabled=False))
    return Snapshot(now=NOW, nodes=nodes, queued=queued, running=running, **kw)


def admitted(plan: Any) -> list[int]:
    return [a.job_id for a in plan.admissions]


# --- Q1 / A1: quota ------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("quota", "held", "asks", "admit", "reason"),
    [
        (QuotaLimit(4, 0), 0, 4, True, None),
        (QuotaLimit(4, 0), 2, 4, False, WaitReason.QUOTA),
        (QuotaLimit(4, 2), 2, 4, True, None),  # borrows 2 beyond nominal
        (QuotaLimit(4, 2), 3, 4, False, WaitReason.QUOTA),
        (QuotaLimit(0, None), 8, 8, True, None),  # no ceiling
    ],
)
def test_rule_q1_the_team_ceiling_is_nominal_plus_borrowing_limit(
    quota: QuotaLimit, held: int, asks: int, admit: bool, reason: WaitReason | None,
) -> None:
    running = (run(1, gpus=held, on=("h100-1",)),) if held else ()
    plan = plan_admissions(snap(nodes=nodes(("h100", 8), ("h100", 8, 8 - held)),
                                queued=(q(10, gpus=asks),), running=running,
                                quotas={("a", "h100"): quota}))
    assert (admitted(plan) == [10]) is admit
    if reason is not None:
        assert plan.waits[10].reason is reason


@pytest.mark.parametrize(
    ("lending", "admit"),
    [(None, True), (8, True), (4, True), (2, False), (0, False)],
)
def test_rule_q1_a_team_may_not_borrow_others_nominal_beyond_their_lending_limit(
    lending: int | None, admit: bool,
) -> None:
    """Team b guarantees 8 of 16 GPUs and uses none; team a (no quota) asks for 12.
    b lends at most `lending` of its 8 idle GPUs: a may take 8 + lending."""
    quotas = {("b", "h100"): QuotaLimit(8, None, lending)}
    plan = plan_admissions(snap(nodes=nodes(("h100", 8), ("h100", 8)),
                                queued=(q(1, gpus=6, replicas=2),), quotas=quotas))
    assert (admitted(plan) == [1]) is admit
    if not admit:
        assert plan.waits[1].reason is WaitReason.LENDING


def test_rule_q1_the_lender_itself_may_use_its_guarded_nominal() -> None:
    quotas = {("b", "h100"): QuotaLimit(8, None, 0)}
    plan = plan_admissions(snap(nodes=nodes(("h100", 8), ("h100", 8)),
                                queued=(q(1, "a", gpus=8), q(2, "b", gpus=8)), quotas=quotas))
    assert sorted(admitted(plan)) == [1, 2]


# --- O1: order -----------------------------------------------------------------------------

def test_rule_o1_tier_comes_before_fair_share() -> None:
    plan = plan_admissions(snap(
        nodes=nodes(("h100", 8)),
        queued=(q(1, "rich", gpus=8, tier=200), q(2, "poor", gpus=8, tier=100)),
        fair_share={"rich": 0.01, "poor": 1.0},
    ))
    assert admitted(plan) == [1] and plan.order == (1, 2)


def test_rule_o1_within_a_tier_the_higher_priority_team_first() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8)),
                                queued=(q(1, "rich", gpus=8), q(2, "poor", gpus=8)),
                                fair_share={"rich": 0.1, "poor": 0.9}))
    assert admitted(plan) == [2]


def test_rule_o1_ties_break_by_submit_time_then_id() -> None:
    same = ago(60)
    jobs = (QueuedJob(7, "a", "h100", 8, 1, 100, same), QueuedJob(3, "a", "h100", 8, 1, 100, same),
            QueuedJob(9, "a", "h100", 8, 1, 100, ago(120)))
    plan = plan_admissions(snap(nodes=nodes(("h100", 8)), queued=jobs))
    assert plan.order == (9, 3, 7)


def test_rule_o1_each_admission_charges_the_team_so_teams_interleave() -> None:
    """Rule F6 through O1: two equal teams, live standings, 1-GPU jobs: after each
    admission the charged team's factor drops and the other team goes next."""
    state = FairShareState({"a": 1.0, "b": 1.0}, {"a": 0.5, "b": 0.5})
    queued = tuple(q(i, "a") for i in range(1, 5)) + tuple(q(i, "b") for i in range(11, 15))
    plan = plan_admissions(snap(nodes=nodes(("h100", 8)), queued=queued,
                                fair_share_state=state, interval_seconds=3600.0))
    teams = ["a" if i < 10 else "b" for i in plan.order]
    assert all(x != y for x, y in itertools.pairwise(teams)), teams
    assert plan.fair_share_after["a"] == pytest.approx(plan.fair_share_after["b"])


def test_rule_o1_the_job_part_orders_a_teams_own_jobs() -> None:
    weights = PriorityWeights(fair_share=0.0, age=1000.0, size=0.0)
    queued = (q(1, age=10), q(2, age=5000), q(3, age=100))
    plan = plan_admissions(snap(nodes=nodes(("h100", 8)), queued=queued,
                                priority_weights=weights))
    assert plan.order == (2, 3, 1)


@pytest.mark.parametrize("seed", range(5))
def test_rule_p2_the_order_is_tier_then_job_priority_then_submit_time_then_id(seed: int) -> None:
    """With nothing admitted (no entry penalty, F6), the pass's order is rule P2 applied
    to `job_priority`, the breakdown the API shows (P1, P3)."""
    rnd = random.Random(seed)
    weights = PriorityWeights(fair_share=10_000.0, age=1_000.0, size=500.0,
                              max_age_seconds=7200.0, favor_small=bool(seed % 2))
    factors = {t: rnd.choice((0.125, 0.5, 1.0)) for t in "abcd"}
    same = ago(3600)
    queued = tuple(
        QueuedJob(i, rnd.choice("abcd"), "h100", rnd.choice((1, 2, 4)), rnd.choice((1, 2)),
                  rnd.choice((0, 100, 200)), same if i % 7 == 0 else ago(rnd.uniform(-60, 9000)))
        for i in rnd.sample(range(1, 1000), 60))
    cluster = nodes(("a100", 8), ("a100", 8))  # no h100 node: every job waits
    plan = plan_admissions(snap(nodes=cluster, queued=queued, fair_share=factors,
                                priority_weights=weights))

    def rule_p2(j: QueuedJob) -> tuple[Any, ...]:
        p = job_priority(j, now=NOW, fair_share_factor=factors[j.team], weights=weights,
                         cluster_gpus=16)
        return (-j.tier_rank, -p.total, j.submitted_at, j.id)

    assert not plan.admissions
    assert list(plan.order) == [j.id for j in sorted(queued, key=rule_p2)]


# --- A2-A4: node fit, gang, best fit, best effort -----------------------------------------

def test_rule_a2_a_replica_needs_one_node_with_enough_free_gpus() -> None:
    # 8 GPUs free in all, but 4 + 4 on two nodes: a 1 × 8 job does not fit.
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 4), ("h100", 8, 4)),
                                queued=(q(1, gpus=8),)))
    assert admitted(plan) == [] and plan.waits[1].reason is WaitReason.CAPACITY


def test_rule_a2_a_replica_larger_than_any_node_never_fits() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8)), queued=(q(1, gpus=9),)))
    assert plan.waits[1].reason is WaitReason.NO_FIT


def test_rule_a3_a_gang_is_placed_whole_across_nodes() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8), ("h100", 8)),
                                queued=(q(1, gpus=8, replicas=2),)))
    assert plan.admissions[0].placement == ("h100-0", "h100-1")


def test_rule_a3_a_gang_that_does_not_fit_whole_takes_nothing() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8), ("h100", 8, 4)),
                                queued=(q(1, gpus=6, replicas=2), q(2, gpus=8))))
    assert admitted(plan) == [2]


def test_rule_a3_best_fit_keeps_whole_nodes_free() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8), ("h100", 8, 3), ("h100", 8, 5)),
                                queued=(q(1, gpus=3), q(2, gpus=8))))
    assert {a.job_id: a.placement for a in plan.admissions} == {1: ("h100-1",), 2: ("h100-0",)}


def test_rule_a4_a_job_that_does_not_fit_does_not_block_smaller_ones() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 4)),
                                queued=(q(1, gpus=8, tier=200), q(2, gpus=4))))
    assert admitted(plan) == [2] and plan.waits[1].reason is WaitReason.CAPACITY


def test_rule_a5_a_nominated_preemptor_is_planned_first() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8)),
                                queued=(q(1, gpus=8, tier=300), q(2, gpus=8, tier=100)),
                                nominated={2: 0}))
    assert admitted(plan) == [2] and plan.order[0] == 2


def test_rule_a5_a_nominated_preemptor_whose_victims_still_run_waits() -> None:
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 0)), queued=(q(2, gpus=8),),
                                nominated={2: 3}, preemption=PreemptionSettings()))
    assert plan.waits[2].reason is WaitReason.PREEMPTING and plan.preemptions == ()


def test_the_same_snapshot_gives_the_same_plan() -> None:
    s = snap(nodes=nodes(("h100", 8), ("h100", 8, 5), ("a100", 8)),
             queued=tuple(q(i, "abc"[i % 3], gpus=1 + i % 4, gpu_type=("h100", "a100")[i % 2])
                          for i in range(1, 40)))
    assert plan_admissions(s) == plan_admissions(s)


def test_plan_waits_reads_like_a_dict_of_waits() -> None:
    """Explain code reads `plan.waits` as a Mapping[int, Wait] (lazily formatted)."""
    plan = plan_admissions(snap(nodes=nodes(("h100", 8, 2)),
                                queued=(q(1, gpus=4), q(2, gpus=9), q(3, gpus=1)),
                                quotas={("a", "h100"): QuotaLimit(0, 0)}))
    assert set(plan.waits) == {1, 2, 3} and len(plan.waits) == 3 and 1 in plan.waits
    assert plan.waits.get(4) is None
    w = plan.waits[1]
    # A ceiling of 0 below the job's 4 GPUs: it can never run (rule E6), not just "quota".
    assert w.job_id == 1 and w.reason is WaitReason.NEVER_FITS
    assert w.message == ("team a may hold at most 0 h100 GPUs (its quota's nominal + "
                         "borrowing limit); this job asks 4: it can never run unless the "
                         "quota is raised")
    # 9 GPUs on no 8-GPU node: it cannot fit anywhere, which raising the quota would not
    # change (rule E6).
    assert plan.waits[2].reason is WaitReason.NO_FIT
    assert dict(plan.waits) == {k: plan.waits[k] for k in (1, 2, 3)}


def test_a_gang_the_empty_nodes_cannot_hold_does_not_fit_rather_than_waits() -> None:
    """Rule A4: 3 replicas of 8 GPUs on two 8-GPU nodes can never run: say so."""
    plan = plan_admissions(snap(nodes=nodes(("a100", 8, 8), ("a100", 8, 8)),
                                queued=(q(1, gpu_type="a100", gpus=8, replicas=3),
                                        q(2, gpu_type="a100", gpus=8, replicas=2))))
    assert plan.waits[1].reason is WaitReason.NO_FIT
    assert "at most 2 replicas of 8 GPUs; this gang needs 3" in plan.waits[1].message
    assert admitted(plan) == [2]  # the same shape at 2 replicas fits and runs
