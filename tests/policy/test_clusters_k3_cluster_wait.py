"""Rule K3 as the plan sees it (the pin and selector resolved to `QueuedJob.clusters`):
a job waits with reason `cluster` when no cluster it may use can hold it, or has no room
now while one it may not use has; capacity waits in its own clusters stay `capacity`."""

from __future__ import annotations

from queueing.policy.admission import WaitReason, plan_admissions

from .clusters_world import job, pool, snap


def test_a_pin_to_a_cluster_without_nodes_of_the_type_is_a_cluster_wait() -> None:
    # "west" is not in the snapshot (unreachable or disabled): its jobs wait, named.
    plan = plan_admissions(snap(pool("east", "h100", 2), [job(1, clusters={"west"})]))
    wait = plan.waits[1]
    assert wait.reason is WaitReason.CLUSTER
    assert wait.message == ("no node of its cluster west can hold 1 × 8 GPUs of h100, "
                            "even empty (rules K1, K3)")


def test_a_cluster_too_small_for_the_gang_is_a_cluster_wait_when_another_holds_it() -> None:
    nodes = pool("small", "h100", 1) + pool("big", "h100", 4)
    plan = plan_admissions(snap(nodes, [job(1, replicas=2, clusters={"small"})]))
    assert plan.waits[1].reason is WaitReason.CLUSTER


def test_no_cluster_at_all_holding_it_stays_gang_does_not_fit() -> None:
    nodes = pool("small", "h100", 1) + pool("big", "h100", 2)
    plan = plan_admissions(snap(nodes, [job(1, replicas=3, clusters={"small"})]))
    assert plan.waits[1].reason is WaitReason.NO_FIT


def test_room_only_in_a_cluster_it_may_not_use_names_that_cluster() -> None:
    nodes = pool("a", "h100", 1, free=0) + pool("b", "h100", 1)
    plan = plan_admissions(snap(nodes, [job(1, clusters={"a"})]))
    wait = plan.waits[1]
    assert wait.reason is WaitReason.CLUSTER
    assert wait.message == ("waiting for 1 × 8 GPUs of h100 in its cluster a; it would fit "
                            "now in cluster b, which it may not use (rule K3)")


def test_no_room_anywhere_is_a_capacity_wait() -> None:
    nodes = pool("a", "h100", 1, free=0) + pool("b", "h100", 1, free=0)
    plan = plan_admissions(snap(nodes, [job(1, clusters={"a"})]))
    assert plan.waits[1].reason is WaitReason.CAPACITY


def test_a_selector_of_several_clusters_lists_them() -> None:
    plan = plan_admissions(snap(pool("c", "h100", 1), [job(1, clusters={"b", "a"})]))
    assert "its clusters a, b can hold" in plan.waits[1].message


def test_a_selector_matching_no_cluster_says_so() -> None:
    plan = plan_admissions(snap(pool("c", "h100", 1), [job(1, clusters=set())]))
    assert plan.waits[1].reason is WaitReason.CLUSTER
    assert "the clusters its pin or selector allows (none)" in plan.waits[1].message
