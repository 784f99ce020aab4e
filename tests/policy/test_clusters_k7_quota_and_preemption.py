"""Rule K7: quotas per team and GPU type summed over all clusters; one fair share;
preemption victims only in the cluster the preemptor lands in, tried in rule K2 order."""

from __future__ import annotations

from datetime import timedelta

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.preemption import find_victims
from queueing.policy.snapshot import PreemptionSettings, QuotaLimit
from queueing.policy.workspace import Workspace, pool_key

from .clusters_world import NOW, job, pool, running, snap

NO_R9 = PreemptionSettings(lost_per_wait=None)


def test_the_quota_ceiling_counts_what_the_team_holds_in_every_cluster() -> None:
    # Ceiling 16 h100s: 8 held in east, so one more 8-GPU job (in west) and no third.
    nodes = pool("east", "h100", 2) + pool("west", "h100", 2)
    held = (running(90, ("east/n-h100-0",), cluster="east", team="a", tier=100),)
    plan = plan_admissions(snap(
        nodes, [job(1), job(2)], running_jobs=held,
        quotas={("a", "h100"): QuotaLimit(nominal=8, borrowing_limit=8)}))
    assert [a.job_id for a in plan.admissions] == [1]
    wait = plan.waits[2]
    assert wait.reason is WaitReason.QUOTA
    assert "holds 16 h100 GPUs" in wait.message


def test_nominal_quota_may_be_used_in_any_cluster() -> None:
    # Lending limit 0: b's 16 nominal h100s are guarded wherever they are idle, so a
    # may use only what exceeds them: 24 - 16 = 8 GPUs, whatever the cluster.
    nodes = pool("east", "h100", 1) + pool("west", "h100", 2)
    quotas = {("b", "h100"): QuotaLimit(nominal=16, lending_limit=0)}
    plan = plan_admissions(snap(nodes, [job(1, team="a"), job(2, team="a")], quotas=quotas))
    assert [a.job_id for a in plan.admissions] == [1]
    assert plan.waits[2].reason is WaitReason.LENDING


def test_victims_are_only_searched_in_the_cluster_the_preemptor_may_land_in() -> None:
    # Low-tier jobs fill both clusters; the high-tier job is pinned to west: its victim
    # is there, never the (cheaper by rule R4: ran less) one in east.
    nodes = pool("east", "h100", 1, free=0) + pool("west", "h100", 1, free=0)
    run = (running(10, ("east/n-h100-0",), cluster="east"),
           running(11, ("west/n-h100-0",), cluster="west", started_at=NOW.replace(hour=1)))
    plan = plan_admissions(snap(nodes, [job(1, tier=200, clusters={"west"})], running_jobs=run,
                                preemption=NO_R9))
    (p,) = plan.preemptions
    assert p.cluster == "west"
    assert [v.job_id for v in p.victims] == [11]
    assert p.placement == ("west/n-h100-0",)


def test_the_clusters_are_tried_in_rule_k2_order_and_the_first_with_victims_wins() -> None:
    nodes = pool("a", "h100", 1, free=0) + pool("b", "h100", 1, free=0) \
        + pool("c", "h100", 1, free=0)
    run = (running(10, ("a/n-h100-0",), cluster="a", tier=300),  # protected by tier: no
           running(11, ("b/n-h100-0",), cluster="b"),
           running(12, ("c/n-h100-0",), cluster="c"))
    plan = plan_admissions(snap(nodes, [job(1, tier=200)], running_jobs=run,
                                ranks={"a": 0, "b": 2, "c": 1}, preemption=NO_R9))
    (p,) = plan.preemptions
    assert (p.cluster, [v.job_id for v in p.victims]) == ("c", [12])


def test_a_victim_set_is_never_made_of_jobs_of_two_clusters() -> None:
    # Each cluster: two 4-GPU halves of one 8-GPU node, one half free. Victims in one
    # cluster suffice (one job); never one from each.
    nodes = pool("a", "h100", 1, free=4) + pool("b", "h100", 1, free=4)
    run = (running(10, ("a/n-h100-0",), cluster="a", gpus=4),
           running(11, ("b/n-h100-0",), cluster="b", gpus=4))
    ws = Workspace(snap(nodes, [], running_jobs=run, preemption=NO_R9))
    for cluster, victim in (("a", 10), ("b", 11)):
        found = find_victims(ws, job(1, tier=200), now=NOW, factor=lambda _t: 1.0,
                             pool=pool_key("h100", cluster))
        assert found is not None
        assert [v.job_id for v in found[0].victims] == [victim]
        found[1]()  # undo: the workspace is as before
    assert ws.capacity.free == {"a/n-h100-0": 4, "b/n-h100-0": 4}


def test_running_jobs_of_an_unreachable_cluster_hold_quota_but_are_no_victims() -> None:
    # Cluster "gone" left the snapshot (rule K5): its job still counts for team a's
    # quota (K7), and cannot be preempted to make room anywhere.
    nodes = pool("here", "h100", 1, free=0)
    run = (running(10, ("gone/n-h100-0",), cluster="gone", team="a"),
           running(11, ("here/n-h100-0",), cluster="here", team="b", tier=300))
    plan = plan_admissions(snap(
        nodes, [job(1, team="a", tier=200)], running_jobs=run, preemption=NO_R9,
        quotas={("a", "h100"): QuotaLimit(nominal=8, borrowing_limit=8)}))
    assert plan.preemptions == ()
    assert plan.waits[1].reason is WaitReason.CAPACITY


def test_rule_e4_counts_only_the_protected_jobs_of_the_clusters_it_may_use() -> None:
    nodes = pool("a", "h100", 1, free=0) + pool("b", "h100", 1, free=0)
    run = (running(10, ("a/n-h100-0",), cluster="a", min_runtime_seconds=600,
                   started_at=NOW - timedelta(seconds=60)),
           running(11, ("b/n-h100-0",), cluster="b", min_runtime_seconds=600,
                   started_at=NOW - timedelta(seconds=300)))
    plan = plan_admissions(snap(nodes, [job(1, tier=200, clusters={"a"})], running_jobs=run,
                                preemption=NO_R9))
    wait = plan.waits[1]
    assert wait.until == NOW + timedelta(seconds=540)
    assert "1 running job it could preempt is protected" in wait.message


def test_a_running_jobs_cluster_is_the_one_of_its_nodes() -> None:
    # A running job whose `cluster` was left empty by its caller is still a victim in
    # the cluster its nodes are in, and only there.
    nodes = pool("east", "h100", 1, free=0) + pool("west", "h100", 1, free=0)
    run = (running(10, ("east/n-h100-0",), cluster=""),
           running(11, ("west/n-h100-0",), cluster=""))
    plan = plan_admissions(snap(nodes, [job(1, tier=200, clusters={"west"})], running_jobs=run,
                                preemption=NO_R9))
    (p,) = plan.preemptions
    assert (p.cluster, [v.job_id for v in p.victims]) == ("west", [11])
