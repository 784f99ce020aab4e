"""The admission pass's stages one at a time (docs/scheduling.md, "The admission pass in
stages"): table tests per stage on small snapshots, each stage called as the pipeline
calls it, on a real pass state (no stand-ins)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import pytest

from queueing.policy.dependencies import Dependency, DependencyKind
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    Snapshot,
)
from queueing.policy.stages.admit import admit, final_wait
from queueing.policy.stages.flavors import assign, k2_order, pools_for
from queueing.policy.stages.heads import gate
from queueing.policy.stages.nodes import fit
from queueing.policy.stages.pipeline import attempt, try_of
from queueing.policy.stages.preempt import nominated_wait, preempt
from queueing.policy.stages.quota import borrowing_blocked, quota_fit
from queueing.policy.stages.state import DONE, Pass, Try
from queueing.policy.stages.waits import CODE, WaitReason
from queueing.policy.workspace import replicas_when_empty

from .test_admission import ago, nodes, q, run, snap


def _try(s: Snapshot, job_id: int | None = None, gpu_type: str | None = None) -> tuple[Pass, Try]:
    """A pass over `s` and a try of its queued job `job_id` (the first by default)."""
    p = Pass(s)
    index = 0 if job_id is None else next(i for i, j in enumerate(p.jobs) if j.id == job_id)
    job = p.jobs[index]
    return p, try_of(p, job, index, gpu_type or job.gpu_type)


def _reason(p: Pass, job_id: int) -> WaitReason:
    return p.waits[job_id].reason


# --- the pure count of rule A3 shared with the submit check -----------------------------

@pytest.mark.parametrize(
    ("capacity", "gpus", "cpu", "memory", "cpu_alloc", "mem_alloc", "want"),
    [
        (8, 1, 0, 0, None, None, 8),
        (8, 3, 0, 0, None, None, 2),
        (8, 9, 0, 0, None, None, 0),
        (8, 0, 0, 0, None, None, 0),  # a replica of no GPUs: no count
        (8, 2, 16_000, 0, 32_000, None, 2),  # CPU holds two of the four
        (8, 2, 0, 2**30, None, 3 * 2**30, 3),
        (8, 2, 16_000, 0, None, None, 4),  # CPU not known: no constraint
        (8, 2, 0, 0, 1, 1, 4),  # asks none: the allocatables do not count
    ],
)
def test_rule_a3_replicas_an_empty_node_holds(capacity: int, gpus: int, cpu: int, memory: int,
                                              cpu_alloc: int | None, mem_alloc: int | None,
                                              want: int) -> None:
    assert replicas_when_empty(capacity, gpus, cpu, memory, cpu_alloc, mem_alloc) == want


# --- stage 1: heads (the gates) ------------------------------------------------------------

def _dep_job(**kw: Any) -> QueuedJob:
    return QueuedJob(1, "a", "h100", 1, 1, 100, ago(0), **kw)


@pytest.mark.parametrize(
    ("job", "counts", "closed", "active", "limits", "reason"),
    [
        (_dep_job(), {}, frozenset(), {}, {}, None),
        (_dep_job(dependencies=(Dependency(DependencyKind.AFTER_OK, job=7),)),
         {("job", 7): {"RUNNING": 1}}, frozenset(), {}, {}, WaitReason.DEPENDENCY),
        (_dep_job(dependencies=(Dependency(DependencyKind.AFTER_OK, job=7),)),
         {("job", 7): {"FAILED": 1}}, frozenset(), {}, {}, WaitReason.DEPENDENCY_NEVER),
        (_dep_job(dependencies=(Dependency(DependencyKind.AFTER_OK, job=7),)),
         {("job", 7): {"SUCCEEDED": 1}}, frozenset(), {}, {}, None),
        (_dep_job(clusters=frozenset({"east"})), {}, frozenset({"east"}), {}, {},
         WaitReason.CLUSTER),
        (_dep_job(clusters=frozenset({"east", "west"})), {}, frozenset({"east"}), {}, {}, None),
        (_dep_job(array_id=5), {}, frozenset(), {5: 2}, {5: 2}, WaitReason.ARRAY_LIMIT),
        (_dep_job(array_id=5), {}, frozenset(), {5: 1}, {5: 2}, None),
    ],
)
def test_rule_d1_the_heads_gate_a_job_before_any_gpu_is_looked_at(
    job: QueuedJob, counts: Any, closed: frozenset[str], active: dict[int, int],
    limits: dict[int, int], reason: WaitReason | None,
) -> None:
    never: dict[int, str] = {}
    wait = gate(job, counts, closed, defaultdict(int, active), limits, never)
    assert (wait and wait.reason) == reason
    assert (1 in never) == (reason is WaitReason.DEPENDENCY_NEVER)


# --- stage 2: flavor assignment ------------------------------------------------------------

def _pool_nodes() -> tuple[NodeState, ...]:
    return (NodeState("e-0", "h100", 8, 8, cluster="east"),
            NodeState("e-s", "h100", 8, 8, cluster="east", spot=True),
            NodeState("w-0", "h100", 8, 2, cluster="west"),
            NodeState("a-0", "a100", 8, 8, cluster="east"))


@pytest.mark.parametrize(
    ("clusters", "spot_ok", "allowed", "others"),
    [
        (None, False, ("h100@east", "h100@west"), ("h100@east~spot",)),
        (None, True, ("h100@east", "h100@east~spot", "h100@west"), ()),
        (frozenset({"west"}), True, ("h100@west",), ("h100@east", "h100@east~spot")),
        (frozenset(), True, (), ("h100@east", "h100@east~spot", "h100@west")),
    ],
)
def test_rule_k3_flavor_assignment_gives_the_pools_a_job_may_use(
    clusters: frozenset[str] | None, spot_ok: bool, allowed: tuple[str, ...],
    others: tuple[str, ...],
) -> None:
    job = QueuedJob(1, "a", "h100", 1, 1, 100, ago(0), clusters=clusters, spot_ok=spot_ok)
    p = Pass(snap(nodes=_pool_nodes(), queued=(job,)))
    assert pools_for(p, job, "h100") == (allowed, others)


def test_rule_k2_flavor_assignment_orders_pools_by_rank_free_gpus_then_spot_first() -> None:
    job = QueuedJob(1, "a", "h100", 1, 1, 100, ago(0), spot_ok=True)
    pools = ("h100@east", "h100@east~spot", "h100@west")
    p = Pass(snap(nodes=_pool_nodes(), queued=(job,)))
    assert k2_order(p, pools, 1) == ("h100@east~spot", "h100@east", "h100@west")
    p = Pass(snap(nodes=_pool_nodes(), queued=(job,), cluster_ranks={"east": 1}))
    assert k2_order(p, pools, 1)[0] == "h100@west"


@pytest.mark.parametrize(
    ("gpus", "replicas", "fitting", "reason"),
    [
        (8, 1, ("h100",), None),
        (8, 2, ("h100",), None),
        (8, 3, (), WaitReason.NO_FIT),  # two 8-GPU nodes hold two replicas of 8
        (9, 1, (), WaitReason.NO_FIT),  # larger than any node
    ],
)
def test_rule_a4_flavor_assignment_keeps_the_pools_that_hold_the_gang_empty(
    gpus: int, replicas: int, fitting: tuple[str, ...], reason: WaitReason | None,
) -> None:
    p, t = _try(snap(nodes=nodes(("h100", 8, 0), ("h100", 8, 0)),
                     queued=(q(1, gpus=gpus, replicas=replicas),)))
    step = assign(p, t)
    assert t.fitting == fitting
    assert (step is None) == (reason is None)
    if reason is not None:
        assert _reason(p, 1) is reason


# --- stage 3: quota fit and borrowing ------------------------------------------------------

@pytest.mark.parametrize(
    ("quota", "held", "asks", "over", "reason"),
    [
        (None, 0, 4, False, None),  # no quota row: no ceiling
        (QuotaLimit(4, 0), 0, 4, False, None),
        (QuotaLimit(4, 0), 2, 4, True, WaitReason.QUOTA),
        (QuotaLimit(4, 2), 2, 4, False, None),  # borrows 2 beyond nominal
        (QuotaLimit(2, 1), 0, 4, True, WaitReason.NEVER_FITS),  # ceiling 3 < 4
    ],
)
def test_rule_q1_quota_fit_against_the_ceiling(quota: QuotaLimit | None, held: int, asks: int,
                                               over: bool, reason: WaitReason | None) -> None:
    running = (run(50, gpus=held, on=("h100-1",)),) if held else ()
    quotas = {("a", "h100"): quota} if quota is not None else {}
    p, t = _try(snap(nodes=nodes(("h100", 8), ("h100", 8)), queued=(q(1, gpus=asks),),
                     running=running, quotas=quotas))
    step = quota_fit(p, t)
    assert t.over is over
    assert (step is None) == (reason is None)
    if reason is not None:
        assert _reason(p, 1) is reason


def test_rule_a1_borrowing_is_blocked_by_what_other_teams_guard() -> None:
    quotas = {("b", "h100"): QuotaLimit(8, 0, lending_limit=0), ("a", "h100"): QuotaLimit(0)}
    p, t = _try(snap(nodes=nodes(("h100", 8), ("h100", 8)), queued=(q(1, gpus=8),),
                     quotas=quotas))
    assert quota_fit(p, t) is None and borrowing_blocked(p, t) is False
    p, t = _try(snap(nodes=nodes(("h100", 8), ("h100", 8)), queued=(q(1, gpus=9),),
                     quotas=quotas))
    assert quota_fit(p, t) is None and borrowing_blocked(p, t) is True


# --- stage 4: node fit -----------------------------------------------------------------

@pytest.mark.parametrize(
    ("free", "gpus", "replicas", "placement", "reason"),
    [
        ((8, 3), 2, 1, ("h100-1",), None),  # best fit: the fuller node
        ((8, 3), 4, 3, None, WaitReason.CAPACITY),
        ((8, 8), 4, 3, ("h100-0", "h100-0", "h100-1"), None),
        ((1, 1), 2, 1, None, WaitReason.CAPACITY),
    ],
)
def test_rule_a3_node_fit_places_best_fit_or_says_why_not(
    free: tuple[int, int], gpus: int, replicas: int, placement: tuple[str, ...] | None,
    reason: WaitReason | None,
) -> None:
    p, t = _try(snap(nodes=nodes(("h100", 8, free[0]), ("h100", 8, free[1])),
                     queued=(q(1, gpus=gpus, replicas=replicas),)))
    assert assign(p, t) is None
    fit(p, t)
    assert t.placement == placement
    if reason is not None:
        assert t.why_not == CODE[reason]
        final_wait(p, t)
        assert _reason(p, 1) is reason


def test_rule_e3_node_fit_names_the_largest_free_block() -> None:
    p, t = _try(snap(nodes=nodes(("h100", 8, 3), ("h100", 8, 1)), queued=(q(1, gpus=4),)))
    assert attempt(p, t) is DONE or _reason(p, 1) is WaitReason.CAPACITY
    assert "largest free block: 3 GPUs on h100-0" in p.waits[1].message


# --- stage 5: preemption targets -----------------------------------------------------------

def test_rule_r1_preemption_targets_a_lower_tier_and_holds_the_gpus() -> None:
    s = snap(nodes=nodes(("h100", 8, 0)), queued=(q(1, gpus=8, tier=200),),
             running=(run(50, gpus=8, tier=0),),
             preemption=PreemptionSettings(enabled=True, lost_per_wait=None))
    p, t = _try(s)
    assert assign(p, t) is None
    fit(p, t)
    assert t.placement is None
    assert preempt(p, t) == DONE
    assert [v.job_id for v in p.preemptions[0].victims] == [50]
    assert _reason(p, 1) is WaitReason.PREEMPTING
    assert p.holder["h100"] == 1 and p.holds["h100"] == {"h100-0": 8}


def test_rule_r1_no_victim_leaves_the_wait_to_the_last_stage() -> None:
    s = snap(nodes=nodes(("h100", 8, 0)), queued=(q(1, gpus=8, tier=0),),
             running=(run(50, gpus=8, tier=200),),
             preemption=PreemptionSettings(enabled=True))
    p, t = _try(s)
    assign(p, t)
    fit(p, t)
    assert preempt(p, t) is None
    assert p.waits.refused[1] == "capacity:no_victim"


def test_rule_a5_a_nominated_preemptor_waits_for_its_victims_holding_what_is_free() -> None:
    s = snap(nodes=nodes(("h100", 8, 2)), queued=(q(1, gpus=8),), nominated={1: 1},
             nominated_placement={1: ("h100-0",)})
    p, t = _try(s)
    assert nominated_wait(p, t) == DONE
    assert _reason(p, 1) is WaitReason.PREEMPTING
    assert p.cap.free["h100-0"] == 0 and p.holds["h100"] == {"h100-0": 2}


# --- stage 6: admit ------------------------------------------------------------------------

def test_rule_f6_admit_charges_quota_and_fair_share_and_records_the_type() -> None:
    p, t = _try(snap(nodes=nodes(("h100", 8)), queued=(q(1, gpus=4),), interval_seconds=60.0,
                     billing_weights={"h100": 2.0}))
    assign(p, t)
    fit(p, t)
    before = p.factors.charged
    admit(p, t)
    (a,) = p.admissions
    assert (a.job_id, a.gpu_type, a.placement) == (1, "h100", ("h100-0",))
    assert p.ledger.held[("a", "h100")] == 4
    assert p.factors.charged > before  # rule F6: the entry penalty, weighted
