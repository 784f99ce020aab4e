"""Rule K8 as the plan sees it: a closed cluster (`Snapshot.closed_clusters`: disabled,
draining while jobs still run there) takes no new work. Its free nodes are never a
placement, never the capacity a wait or a preemption counts on, and a job whose clusters
are all closed waits with reason `cluster` saying they are disabled; its running jobs
still hold their team's quota."""

from __future__ import annotations

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.snapshot import PreemptionSettings, QuotaLimit

from .clusters_world import job, pool, running, snap


def test_k8_a_closed_clusters_free_nodes_are_never_a_placement() -> None:
    # "off" is empty and cheaper (rank 0): open, it would take the job (rule K2).
    nodes = pool("off", "h100", 2) + pool("on", "h100", 1)
    plan = plan_admissions(snap(nodes, [job(1), job(2, team="b")], ranks={"on": 10},
                                closed_clusters=frozenset({"off"})))
    assert [(a.job_id, a.cluster) for a in plan.admissions] == [(1, "on")]
    wait = plan.waits[2]
    assert wait.reason is WaitReason.CAPACITY
    assert "off" not in wait.message  # "why it waits" never says it would fit there


def test_k8_a_closed_cluster_is_no_room_a_pinned_job_is_told_it_would_fit_in() -> None:
    # Rule K3's "it would fit now in cluster ..." names only clusters that take work.
    nodes = pool("a", "h100", 1, free=0) + pool("off", "h100", 1)
    plan = plan_admissions(snap(nodes, [job(1, clusters={"a"})],
                                closed_clusters=frozenset({"off"})))
    assert plan.waits[1].reason is WaitReason.CAPACITY
    assert "off" not in plan.waits[1].message


def test_k8_a_job_pinned_to_a_closed_cluster_is_told_it_is_disabled() -> None:
    nodes = pool("off", "h100", 1) + pool("on", "h100", 1)
    plan = plan_admissions(snap(nodes, [job(1, clusters={"off"})],
                                closed_clusters=frozenset({"off"})))
    assert not plan.admissions
    wait = plan.waits[1]
    assert wait.reason is WaitReason.CLUSTER
    assert wait.message == ("its cluster off is disabled: it takes no new work (rule K8); "
                            "this job waits until it is enabled again")


def test_k8_the_disabled_wait_wins_over_no_node_of_its_type_anywhere() -> None:
    # No a100 in the snapshot at all: still the pin's cluster is what keeps it waiting.
    plan = plan_admissions(snap(pool("on", "h100", 1), [job(1, gpu_type="a100",
                                                            clusters={"off"})],
                                closed_clusters=frozenset({"off"})))
    assert plan.waits[1].reason is WaitReason.CLUSTER
    assert "its cluster off is disabled" in plan.waits[1].message


def test_k8_a_job_with_an_open_cluster_left_is_placed_there() -> None:
    nodes = pool("off", "h100", 1) + pool("on", "h100", 1)
    plan = plan_admissions(snap(nodes, [job(1, clusters={"off", "on"})],
                                closed_clusters=frozenset({"off"})))
    assert [a.cluster for a in plan.admissions] == ["on"]


def test_k8_a_draining_clusters_jobs_hold_quota_and_are_no_victims() -> None:
    # Team b's job runs on the closed cluster: it counts against b's ceiling, and a
    # higher tier's job preempts nothing there (open, "off" would be its victim's place:
    # rule R1 with R9 off preempts job 7).
    busy = running(7, ("off/n-h100-0",), cluster="off", team="b", tier=0)
    nodes = pool("off", "h100", 1, free=0) + pool("on", "h100", 1, free=0)
    quotas = {("b", "h100"): QuotaLimit(nominal=0, borrowing_limit=8)}
    plan = plan_admissions(snap(nodes, [job(1, team="b"), job(2, team="a", tier=500)],
                                running_jobs=(busy,), quotas=quotas,
                                preemption=PreemptionSettings(lost_per_wait=None),
                                closed_clusters=frozenset({"off"})))
    assert plan.waits[1].reason is WaitReason.QUOTA
    assert not plan.preemptions
    assert plan.waits[2].reason is WaitReason.CAPACITY
