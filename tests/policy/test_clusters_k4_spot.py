"""Rule K4: spot nodes only for `spot_ok` jobs, which prefer them within a cluster."""

from __future__ import annotations

from queueing.policy.admission import WaitReason, plan_admissions

from .clusters_world import job, pool, snap


def test_a_job_that_may_not_use_spot_never_lands_on_a_spot_node() -> None:
    nodes = pool("cloud", "h100", 2, spot=True) + pool("cloud", "h100", 1)
    plan = plan_admissions(snap(nodes, [job(1), job(2), job(3)]))
    placed = {a.job_id: a.placement for a in plan.admissions}
    assert placed == {1: ("cloud/n-h100-0",)}
    assert plan.waits[2].reason is WaitReason.CLUSTER
    assert "it would fit now on spot nodes of cluster cloud" in plan.waits[2].message
    assert "not spot nodes" in plan.waits[2].message


def test_a_spot_ok_job_prefers_spot_nodes_of_its_cluster() -> None:
    nodes = pool("cloud", "h100", 1) + pool("cloud", "h100", 1, spot=True)
    plan = plan_admissions(snap(nodes, [job(1, spot_ok=True)]))
    assert plan.admissions[0].placement == ("cloud/spot-h100-0",)


def test_a_spot_ok_job_uses_regular_nodes_when_the_spot_ones_are_full() -> None:
    nodes = pool("cloud", "h100", 1) + pool("cloud", "h100", 1, spot=True, free=0)
    plan = plan_admissions(snap(nodes, [job(1, spot_ok=True)]))
    assert plan.admissions[0].placement == ("cloud/n-h100-0",)


def test_the_cluster_rank_comes_before_the_spot_preference() -> None:
    # K2 chooses the cluster first (on-prem is rank 0), then K4 prefers spot inside it.
    nodes = pool("onprem", "h100", 1) + pool("cloud", "h100", 1, spot=True)
    plan = plan_admissions(snap(nodes, [job(1, spot_ok=True)], ranks={"onprem": 0, "cloud": 1}))
    assert plan.admissions[0].cluster == "onprem"


def test_a_gang_is_not_split_between_spot_and_regular_nodes() -> None:
    # One spot node and one regular node free: a 2-node spot_ok gang needs two of a kind.
    nodes = pool("cloud", "h100", 1) + pool("cloud", "h100", 1, spot=True)
    plan = plan_admissions(snap(nodes, [job(1, replicas=2, spot_ok=True)]))
    assert plan.admissions == ()
    assert plan.waits[1].reason is WaitReason.NO_FIT


def test_only_spot_capacity_of_its_type_is_a_cluster_wait_for_a_job_without_spot() -> None:
    plan = plan_admissions(snap(pool("cloud", "h100", 4, spot=True), [job(1)]))
    wait = plan.waits[1]
    assert wait.reason is WaitReason.CLUSTER
    assert wait.message.startswith("no node of any cluster (not spot nodes")


def test_the_no_fit_wait_says_a_gang_takes_nodes_of_one_kind() -> None:
    nodes = pool("cloud", "h100", 1) + pool("cloud", "h100", 1, spot=True)
    plan = plan_admissions(snap(nodes, [job(1, replicas=2, spot_ok=True)]))
    assert "nodes of one kind, spot or not (rule K4) hold at most 1 replicas" in \
        plan.waits[1].message
