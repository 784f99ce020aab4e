"""Rule K1: all replicas of a gang on nodes of one cluster; `Admission.cluster` says which."""

from __future__ import annotations

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.snapshot import PreemptionSettings

from .clusters_world import NOW, cluster_of, job, pool, running, snap


def test_a_gang_never_spans_two_clusters_even_when_only_both_together_hold_it() -> None:
    # 2 free nodes in each cluster: a 3-node gang fits the GPUs of both, of neither alone.
    plan = plan_admissions(snap(pool("east", "h100", 2) + pool("west", "h100", 2),
                                [job(1, replicas=3)]))
    assert plan.admissions == ()
    wait = plan.waits[1]
    assert wait.reason is WaitReason.NO_FIT
    assert "of one cluster (rule K1)" in wait.message
    assert "hold at most 2 replicas" in wait.message


def test_the_admission_names_the_cluster_of_all_its_nodes() -> None:
    plan = plan_admissions(snap(pool("east", "h100", 1, free=0) + pool("west", "h100", 3),
                                [job(1, replicas=3)]))
    (a,) = plan.admissions
    assert a.cluster == "west"
    assert {cluster_of(n) for n in a.placement} == {"west"}


def test_a_gang_waits_for_room_in_one_cluster_and_the_largest_block_names_it() -> None:
    # One free node per cluster, the gang needs two: capacity, not "never".
    nodes = pool("east", "h100", 2, free=0) + pool("east", "h100", 1, prefix="m") \
        + pool("west", "h100", 1, free=0) + pool("west", "h100", 1, gpus=8, free=4, prefix="m")
    plan = plan_admissions(snap(nodes, [job(1, replicas=2)]))
    wait = plan.waits[1]
    assert wait.reason is WaitReason.CAPACITY
    assert "largest free block: 8 GPUs on east/m-h100-0 (cluster east)" in wait.message
    assert "12 h100 GPUs free in all" in wait.message


def test_one_cluster_without_names_plans_as_before() -> None:
    # Cluster "" is the only cluster: no cluster words, no cluster on the admission.
    plan = plan_admissions(snap(pool("", "h100", 2), [job(1, replicas=3), job(2)]))
    assert plan.waits[1].reason is WaitReason.NO_FIT
    assert "cluster" not in plan.waits[1].message
    (a,) = plan.admissions
    assert a.cluster == ""


def test_rule_a9_reserves_in_one_cluster_and_holds_nothing_back_in_the_others() -> None:
    # East: two nodes, one free, one busy until in an hour; a 2-node gang reserves there
    # (west is too small for it). A later 8-GPU job that runs for ever may not take
    # east's free node (it would delay the gang) but takes west's.
    nodes = pool("east", "h100", 1, free=0) + pool("east", "h100", 1, prefix="m") \
        + pool("west", "h100", 1, prefix="w")
    busy = (running(50, ("east/n-h100-0",), cluster="east", max_runtime_seconds=3600,
                    started_at=NOW),)
    queued = [job(1, replicas=2, clusters={"east"}), job(2), job(3)]
    plan = plan_admissions(snap(nodes, queued, running_jobs=busy, reservation=True,
                                preemption=PreemptionSettings(enabled=False)))
    assert plan.reservations["h100"][0] == 1
    assert [(a.job_id, a.cluster) for a in plan.admissions] == [(2, "west")]
    assert plan.waits[3].reason is WaitReason.RESERVED
