"""Rules A6 (CPU and memory are fitted like GPUs) and A7 (topology-aware gangs), with the
preemption search (R1-R4) for both: the pure policy, without Django."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    RunningJob,
    Topology,
    TopologyMode,
)
from queueing.policy.workspace import Capacity

from .test_admission import ago, q, snap

GI = 2**30
CPU = 1000  # millicores


def node(name: str, free: int = 8, *, cap: int = 8, cpu: int | None = 96 * CPU,
         cpu_free: int | None = None, mem: int | None = 1024 * GI, mem_free: int | None = None,
         rack: str | None = None, gpu_type: str = "h100") -> NodeState:
    return NodeState(name, gpu_type, cap, free,
                     cpu_free=cpu if cpu_free is None else cpu_free,
                     memory_free=mem if mem_free is None else mem_free,
                     topology={"rack": rack} if rack is not None else {},
                     cpu_allocatable=cpu, memory_allocatable=mem)


def qr(job_id: int, gpus: int = 8, replicas: int = 1, *, cpu: int | None = None,
       mem: int | None = None, topology: Topology | None = None, team: str = "a",
       tier: int = 100) -> QueuedJob:
    return replace(q(job_id, team, gpus=gpus, replicas=replicas, tier=tier),
                   cpu_millicores=cpu, memory_bytes=mem, topology=topology)


def rr(job_id: int, on: tuple[str, ...], gpus: int = 8, *, cpu: int | None = None,
       mem: int | None = None, tier: int = 0, team: str = "b") -> RunningJob:
    return RunningJob(job_id, team, "h100", gpus, len(on), tier, started_at=ago(3600),
                      nodes=on, cpu_millicores=cpu, memory_bytes=mem)


def placement(plan: Any, job_id: int) -> tuple[str, ...]:
    (a,) = [a for a in plan.admissions if a.job_id == job_id]
    return tuple(a.placement)


RACK_REQUIRED = Topology("rack", TopologyMode.REQUIRED)
RACK_PREFERRED = Topology("rack", TopologyMode.PREFERRED)


# --- A6: CPU and memory -------------------------------------------------------------------

def test_rule_a6_a_replica_needs_cpu_and_memory_beside_its_gpus() -> None:
    """n0 has the GPUs but only 16 CPUs free; n1 has all three: the job goes to n1."""
    plan = plan_admissions(snap(nodes=(node("n0", cpu_free=16 * CPU), node("n1")),
                                queued=(qr(1, cpu=32 * CPU, mem=256 * GI),)))
    assert placement(plan, 1) == ("n1",)


def test_rule_a6_the_job_waits_for_cpu_while_the_gpus_are_free() -> None:
    plan = plan_admissions(snap(nodes=(node("n0", mem_free=100 * GI),),
                                queued=(qr(1, cpu=32 * CPU, mem=256 * GI),)))
    wait = plan.waits[1]
    assert plan.admissions == () and wait.reason is WaitReason.CPU_MEMORY
    assert wait.message.startswith(
        "no h100 node has 32 CPUs and 256Gi memory free beside 8 GPUs")


def test_rule_a6_a_replica_larger_than_any_nodes_cpu_never_fits() -> None:
    plan = plan_admissions(snap(nodes=(node("n0"),), queued=(qr(1, cpu=200 * CPU),)))
    assert plan.waits[1].reason is WaitReason.NO_FIT
    assert plan.waits[1].message == "no h100 node has 8 GPUs and 200 CPUs for one replica"


def test_rule_a6_cpu_limits_how_many_replicas_a_node_holds() -> None:
    """Two 4-GPU replicas of 64 CPUs: the GPUs of one node would hold both, its CPU holds
    one; the gang spreads over two nodes, and a third such replica does not fit."""
    nodes = (node("n0"), node("n1"))
    plan = plan_admissions(snap(nodes=nodes, queued=(qr(1, gpus=4, replicas=2, cpu=64 * CPU),)))
    assert placement(plan, 1) == ("n0", "n1")
    plan = plan_admissions(snap(nodes=nodes, queued=(qr(1, gpus=4, replicas=3, cpu=64 * CPU),)))
    assert plan.waits[1].reason is WaitReason.NO_FIT  # even empty: 2 slots, needs 3


def test_rule_a6_unknown_cpu_or_memory_is_no_constraint() -> None:
    plan = plan_admissions(snap(nodes=(node("n0", cpu=None, mem=None),),
                                queued=(qr(1, cpu=500 * CPU, mem=10_000 * GI),)))
    assert placement(plan, 1) == ("n0",)


def test_rule_a6_a_job_without_cpu_or_memory_fits_on_gpus_alone() -> None:
    plan = plan_admissions(snap(nodes=(node("n0", cpu_free=0, mem_free=0),), queued=(qr(1),)))
    assert placement(plan, 1) == ("n0",)


def test_rule_a6_best_fit_still_orders_by_free_gpus_then_name() -> None:
    """n0 (2 free GPUs) is skipped for lack of CPU; of n1 and n2 (4 free each) the name
    decides: CPU and memory never reorder the nodes."""
    nodes = (node("n0", free=2, cpu_free=0), node("n2", free=4), node("n1", free=4),
             node("n3", free=8))
    plan = plan_admissions(snap(nodes=nodes, queued=(qr(1, gpus=2, cpu=CPU),)))
    assert placement(plan, 1) == ("n1",)


def test_rule_a6_admissions_in_one_pass_consume_cpu() -> None:
    """Each 1-GPU job takes 48 CPUs: the node's 96 CPUs take two, the third waits."""
    plan = plan_admissions(snap(nodes=(node("n0"),),
                                queued=tuple(qr(i, gpus=1, cpu=48 * CPU) for i in (1, 2, 3))))
    assert len(plan.admissions) == 2
    (waiting,) = plan.waits.values()
    assert waiting.reason is WaitReason.CPU_MEMORY


def test_rule_a6_place_and_release_are_inverse() -> None:
    cap = Capacity((node("n0"), node("n1", free=4)))
    before = (dict(cap.free), dict(cap.cpu_free), dict(cap.memory_free))
    got = cap.place("h100", 4, 2, cpu=40 * CPU, memory=500 * GI)
    assert got == ("n1", "n0")
    assert cap.cpu_free["n1"] == 56 * CPU and cap.memory_free["n0"] == 524 * GI
    assert got is not None
    cap.release(got, 4, cpu=40 * CPU, memory=500 * GI)
    assert (cap.free, cap.cpu_free, cap.memory_free) == before


def test_rule_a6_preemption_frees_the_victims_cpu() -> None:
    """GPUs are free on n0 but a low-tier job holds its CPU: the high-tier job preempts
    it (R1) for the CPU, not for GPUs."""
    plan = plan_admissions(snap(
        nodes=(node("n0", free=4, cpu_free=16 * CPU),),
        queued=(qr(100, gpus=4, cpu=64 * CPU, tier=200),),
        running=(rr(1, ("n0",), gpus=4, cpu=80 * CPU),),
        preemption=PreemptionSettings(enabled=True, lost_per_wait=None)))
    (p,) = plan.preemptions
    assert [v.job_id for v in p.victims] == [1] and p.placement == ("n0",)


def test_rule_a6_no_victim_when_freeing_it_does_not_free_enough_cpu() -> None:
    plan = plan_admissions(snap(
        nodes=(node("n0", free=4, cpu_free=0),),
        queued=(qr(100, gpus=4, cpu=64 * CPU, tier=200),),
        running=(rr(1, ("n0",), gpus=4, cpu=32 * CPU, tier=300),  # not preemptible by R1
                 rr(2, ("n0",), gpus=4, cpu=32 * CPU)),
        preemption=PreemptionSettings(enabled=True, lost_per_wait=None)))
    assert plan.preemptions == () and plan.waits[100].reason is WaitReason.CPU_MEMORY


# --- A7: topology -------------------------------------------------------------------------

RACKS = (node("a0", rack="r1"), node("a1", rack="r1"), node("b0", rack="r2"),
         node("b1", rack="r2"), node("b2", rack="r2"))


def test_rule_a7_required_packs_the_gang_into_one_domain() -> None:
    plan = plan_admissions(snap(nodes=RACKS, queued=(qr(1, replicas=3, topology=RACK_REQUIRED),)))
    assert placement(plan, 1) == ("b0", "b1", "b2")


def test_rule_a7_required_chooses_the_domain_with_the_fewest_free_gpus() -> None:
    """Both racks hold 2 × 8; r2 has 24 free GPUs, r1 16: r1 is the best fit."""
    plan = plan_admissions(snap(nodes=RACKS, queued=(qr(1, replicas=2, topology=RACK_REQUIRED),)))
    assert placement(plan, 1) == ("a0", "a1")


def test_rule_a7_required_ties_break_by_domain_name() -> None:
    nodes = (node("x", rack="r2"), node("y", rack="r1"))
    plan = plan_admissions(snap(nodes=nodes, queued=(qr(1, topology=RACK_REQUIRED),)))
    assert placement(plan, 1) == ("y",)


def test_rule_a7_required_waits_when_no_domain_holds_the_gang_now() -> None:
    """Four nodes free but at most two in one rack (r2 has three, one busy): the gang
    waits with the topology reason and a smaller job behind it is admitted (A4)."""
    nodes = (node("a0", rack="r1"), node("a1", rack="r1"), node("b0", rack="r2"),
             node("b1", rack="r2"), node("b2", 0, rack="r2"))
    plan = plan_admissions(snap(nodes=nodes, queued=(
        qr(1, replicas=3, topology=RACK_REQUIRED), qr(2, gpus=8))))
    assert plan.waits[1].reason is WaitReason.TOPOLOGY
    assert plan.waits[1].message.startswith("no rack has room for all 3 replicas of 8 GPUs")
    assert [a.job_id for a in plan.admissions] == [2]


def test_rule_a7_required_never_fits_when_no_domain_is_big_enough() -> None:
    plan = plan_admissions(snap(nodes=RACKS, queued=(qr(1, replicas=4, topology=RACK_REQUIRED),)))
    assert plan.waits[1].reason is WaitReason.NO_FIT
    assert "one rack of h100 nodes holds at most 3 replicas" in plan.waits[1].message


def test_rule_a7_required_skips_nodes_without_the_label() -> None:
    nodes = (node("loose"), node("a0", 0, rack="r1"))
    plan = plan_admissions(snap(nodes=nodes, queued=(qr(1, topology=RACK_REQUIRED),)))
    assert plan.admissions == () and plan.waits[1].reason is WaitReason.TOPOLOGY


def test_rule_a7_preferred_uses_one_domain_when_one_holds_it() -> None:
    plan = plan_admissions(snap(nodes=RACKS, queued=(qr(1, replicas=2, topology=RACK_PREFERRED),)))
    assert placement(plan, 1) == ("a0", "a1")


def test_rule_a7_preferred_spreads_over_the_fewest_domains_otherwise() -> None:
    """Racks r1 (1 free node), r2 (2), r3 (2): a gang of 4 uses r2 and r3, not r1."""
    nodes = (node("a0", rack="r1"), node("b0", rack="r2"), node("b1", rack="r2"),
             node("c0", rack="r3"), node("c1", rack="r3"))
    plan = plan_admissions(snap(nodes=nodes, queued=(qr(1, replicas=4, topology=RACK_PREFERRED),)))
    assert sorted(placement(plan, 1)) == ["b0", "b1", "c0", "c1"]


def test_rule_a7_preferred_falls_back_to_plain_best_fit() -> None:
    nodes = (node("a0", rack="r1"), node("loose"))
    plan = plan_admissions(snap(nodes=nodes, queued=(qr(1, replicas=2, topology=RACK_PREFERRED),)))
    assert sorted(placement(plan, 1)) == ["a0", "loose"]


def test_rule_a7_and_a6_together_a_domain_needs_the_cpu_too() -> None:
    """r1 has the GPUs but not the CPU: the required gang goes to r2."""
    nodes = (node("a0", rack="r1", cpu_free=0), node("a1", rack="r1"),
             node("b0", rack="r2"), node("b1", rack="r2"), node("b2", rack="r2"))
    plan = plan_admissions(snap(nodes=nodes, queued=(
        qr(1, replicas=2, cpu=CPU, topology=RACK_REQUIRED),)))
    assert placement(plan, 1) == ("b0", "b1")


def test_rule_a7_preemption_for_a_required_gang_frees_one_domain() -> None:
    """Both racks are full of low-tier work. r1: a0 holds one 8-GPU job (the cheapest
    victim of all, by id), a1 two 4-GPU jobs: 3 victims to free the rack. r2: b0 and b1
    one 8-GPU job each: 2 victims. A per-replica search would start with a0 and scatter
    the gang; per domain, r2's two jobs are the victims and the gang is placed in r2."""
    nodes = (node("a0", 0, rack="r1"), node("a1", 0, rack="r1"),
             node("b0", 0, rack="r2"), node("b1", 0, rack="r2"))
    running = (rr(1, ("a0",)), rr(2, ("a1",), gpus=4), rr(3, ("a1",), gpus=4),
               rr(4, ("b0",)), rr(5, ("b1",)))
    plan = plan_admissions(snap(
        nodes=nodes, running=running,
        queued=(qr(100, replicas=2, tier=200, topology=RACK_REQUIRED),),
        preemption=PreemptionSettings(enabled=True, lost_per_wait=None)))
    (p,) = plan.preemptions
    assert sorted(v.job_id for v in p.victims) == [4, 5]
    assert sorted(p.placement) == ["b0", "b1"]


def test_rule_a7_preemption_never_scatters_a_required_gang() -> None:
    """One free node per rack and one low-tier victim per rack, but each rack has only
    one more node with room: after removing it each rack holds 2, the gang needs 3 in
    one rack, so no preemption is made."""
    nodes = (node("a0", rack="r1"), node("a1", 0, rack="r1"),
             node("b0", rack="r2"), node("b1", 0, rack="r2"))
    running = (rr(1, ("a1",)), rr(2, ("b1",)))
    plan = plan_admissions(snap(
        nodes=nodes, running=running,
        queued=(qr(100, replicas=3, tier=200, topology=RACK_REQUIRED),),
        preemption=PreemptionSettings(enabled=True, lost_per_wait=None)))
    assert plan.preemptions == () and plan.waits[100].reason is WaitReason.NO_FIT


@pytest.mark.parametrize("mode", list(TopologyMode))
def test_rule_a7_a_single_replica_needs_a_labelled_node_only_when_required(
        mode: TopologyMode) -> None:
    plan = plan_admissions(snap(nodes=(node("loose"),),
                                queued=(qr(1, topology=Topology("rack", mode)),)))
    assert (plan.admissions != ()) is (mode is TopologyMode.PREFERRED)
