"""Rules H1-H7 (docs/scheduling.md, "Shared GPUs"): fractions of a GPU packed per GPU,
whole GPUs of a packed type, what is counted in GPU-equivalents, what a wait says and
what a preemption frees. Tables on snapshots, without Django."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from queueing.policy.admission import WaitReason, plan_admissions
from queueing.policy.preemption import work_lost_gpu_hours
from queueing.policy.priority import PriorityWeights
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)
from queueing.policy.stages.state import cluster_gpus
from queueing.policy.workspace import Capacity, Workspace, per_gpu_free, replicas_when_empty

NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)
NO_AGE = PriorityWeights(fair_share=10_000.0, age=0.0, size=0.0)
TS = "ts-a10"  # time-sliced, 4 slices per GPU


def node(name: str, gpu_free: tuple[int, ...], s: int = 4, gpu_type: str = TS) -> NodeState:
    """A packed node of len(gpu_free) GPUs, S slices each, `gpu_free` free per GPU."""
    return NodeState(name, gpu_type, len(gpu_free) * s, sum(gpu_free), slices_per_gpu=s,
                     gpu_free=gpu_free)


def q(job_id: int, units: int, replicas: int = 1, team: str = "a", tier: int = 100,
      gpu_type: str = TS, gpu_types: tuple[str, ...] = ()) -> QueuedJob:
    return QueuedJob(job_id, team, gpu_type, units, replicas, tier,
                     NOW - timedelta(seconds=1000 - job_id), gpu_types=gpu_types)


def run(job_id: int, units: int, on: tuple[str, ...], slots: tuple[int, ...],
        team: str = "b", tier: int = 0, started: float = 3600.0) -> RunningJob:
    return RunningJob(job_id, team, TS, units, len(on), tier, preemptible=True,
                      started_at=NOW - timedelta(seconds=started), nodes=on, gpu_slots=slots)


def snap(nodes: tuple[NodeState, ...], queued: tuple[QueuedJob, ...] = (),
         running: tuple[RunningJob, ...] = (), **kw: Any) -> Snapshot:
    kw.setdefault("priority_weights", NO_AGE)
    kw.setdefault("preemption", PreemptionSettings(enabled=False))
    kw.setdefault("units_per_gpu", {TS: 4})
    return Snapshot(now=NOW, nodes=nodes, queued=queued, running=running, **kw)


def placed(plan: Any) -> dict[int, tuple[tuple[str, ...], tuple[int, ...]]]:
    return {a.job_id: (a.placement, a.gpu_slots) for a in plan.admissions}


# --- H1 units -----------------------------------------------------------------------------

@pytest.mark.parametrize(("capacity", "free", "s", "given", "expect"), [
    (8, 8, 4, (), [4, 4]),            # empty: every GPU wholly free
    (8, 5, 4, (), [1, 4]),            # 5 free on as few GPUs as possible, the highest
    (12, 5, 4, (), [0, 1, 4]),
    (8, 3, 4, (1, 2), [1, 2]),        # as the snapshot says
    (8, 2, 4, (1, 2), [1, 1]),        # the node reports less: the highest GPUs lose it
    (8, 8, 4, (9, -1), [4, 0]),       # each cut to [0, S]
])
def test_rule_h1_a_packed_nodes_free_slices_per_gpu(capacity: int, free: int, s: int,
                                                    given: tuple[int, ...],
                                                    expect: list[int]) -> None:
    assert per_gpu_free(capacity, free, s, given) == expect


def test_rule_h1_a_whole_gpu_job_on_a_packed_type_holds_s_slices_of_one_gpu() -> None:
    # 1 whole GPU = 4 units on a 4-slice type; its gpu_slots name the GPU it took.
    plan = plan_admissions(snap((node("n", (4, 4)),), (q(1, 4),)))
    assert placed(plan) == {1: (("n",), (0,))}


def test_rule_h1_two_whole_gpus_per_replica_list_both_gpus_per_replica() -> None:
    plan = plan_admissions(snap((node("n", (4, 4, 4, 4)),), (q(1, 8, replicas=2),)))
    assert placed(plan) == {1: (("n", "n"), (0, 1, 2, 3))}


def test_rule_h1_a_mig_instance_is_one_unit_and_a_seventh_of_a_gpu() -> None:
    s = snap((NodeState("m", "mig-1g", 7, 7),), units_per_gpu={"mig-1g": 7})
    assert s.gpus_of("mig-1g", 7) == 1.0
    assert s.gpus_of("mig-1g", 1) == pytest.approx(1 / 7)
    # A MIG node packs nothing: each instance is a device (slices_per_gpu stays 1).
    plan = plan_admissions(snap((NodeState("m", "mig-1g", 7, 7),), (q(1, 3, gpu_type="mig-1g"),),
                                units_per_gpu={"mig-1g": 7}))
    assert placed(plan) == {1: (("m",), ())}


# --- H2 node fit per GPU ------------------------------------------------------------------

@pytest.mark.parametrize(("gpu_free", "units", "replicas", "fits"), [
    ((1, 1, 1, 1), 2, 1, False),  # 4 free slices, none 2 on one GPU
    ((1, 1, 2, 1), 2, 1, True),
    ((2, 2, 0, 0), 2, 2, True),   # one replica per GPU
    ((3, 0, 0, 0), 2, 2, False),  # 3 free on one GPU hold one replica of 2
    ((4, 4, 0, 0), 2, 4, True),   # two fractions per GPU
    ((4, 3, 4, 0), 4, 2, True),   # whole GPUs: the wholly free ones
    ((4, 3, 3, 3), 4, 2, False),  # 13 free slices, one wholly free GPU
    ((4, 3, 4, 0), 8, 1, True),   # 2 whole GPUs on one node
    ((3, 3, 3, 3), 3, 4, True),   # 3 of 4 slices: one per GPU
])
def test_rule_h2_node_fit_counts_slices_per_gpu(gpu_free: tuple[int, ...], units: int,
                                                replicas: int, fits: bool) -> None:
    cap = Capacity([node("n", gpu_free)])
    assert cap.fits(TS, units, replicas) is fits
    got = cap.place(TS, units, replicas)
    assert (got is not None) is fits


@pytest.mark.parametrize(("units", "s", "gpus", "expect"), [
    (1, 4, 2, 8), (3, 4, 2, 2), (2, 4, 3, 6), (4, 4, 3, 3), (8, 4, 3, 1), (2, 1, 3, 1),
])
def test_rule_h2_replicas_an_empty_packed_node_holds(units: int, s: int, gpus: int,
                                                     expect: int) -> None:
    assert replicas_when_empty(gpus * s, units, slices_per_gpu=s) == expect


def test_rule_h2_a_fraction_never_lands_on_a_gpu_held_whole() -> None:
    # GPU 0 held whole (0 free); GPU 1 has 1 slice left: a 2-slice fraction waits.
    plan = plan_admissions(snap((node("n", (0, 1)),), (q(1, 2),)))
    assert not plan.admissions
    assert plan.waits[1].reason is WaitReason.CAPACITY


def test_rule_h2_whole_gpus_wait_while_every_gpu_is_shared() -> None:
    plan = plan_admissions(snap((node("n", (3, 3)),), (q(1, 4),)))
    assert not plan.admissions


# --- H3 packing -----------------------------------------------------------------------------

@pytest.mark.parametrize(("nodes", "units", "expect"), [
    # The shared GPU with the fewest free slices that fit, before a wholly free GPU.
    (((("a", (4, 2, 3)),)), 2, ("a", 1)),
    (((("a", (4, 2, 3)),)), 3, ("a", 2)),
    (((("a", (4, 2, 3)),)), 4, ("a", 0)),   # whole GPU: only a wholly free one
    # Across nodes: a shared GPU anywhere beats opening one.
    (((("a", (4, 4)), ("b", (4, 1)))), 1, ("b", 1)),
    (((("a", (4, 4)), ("b", (4, 1)))), 2, ("b", 0)),  # b's only fit is GPU 0: busier node
    (((("a", (3, 4)), ("b", (4, 2)))), 2, ("b", 1)),  # 2 free beats 3 free
    (((("a", (2, 4)), ("b", (4, 2)))), 2, ("a", 0)),  # ties by node name
])
def test_rule_h3_fractions_pack_onto_shared_gpus_best_fit(
        nodes: tuple[tuple[str, tuple[int, ...]], ...], units: int,
        expect: tuple[str, int]) -> None:
    plan = plan_admissions(snap(tuple(node(n, gf) for n, gf in nodes), (q(1, units),)))
    (got,) = plan.admissions
    assert (got.placement[0], got.gpu_slots[0]) == expect


def test_rule_h3_two_halves_share_a_gpu_a_third_opens_the_next() -> None:
    plan = plan_admissions(snap((node("n", (4, 4)),), (q(1, 2), q(2, 2), q(3, 2), q(4, 4))))
    got = placed(plan)
    assert got[1][1] == got[2][1] == (0,)
    assert got[3][1] == (1,)
    assert 4 not in got  # whole GPU: none wholly free any more
    assert plan.waits[4].reason is WaitReason.CAPACITY


def test_rule_h3_whole_gpus_take_the_node_with_the_fewest_wholly_free() -> None:
    plan = plan_admissions(snap((node("a", (4, 4, 4)), node("b", (4, 1, 4))), (q(1, 4),)))
    assert placed(plan) == {1: (("b",), (0,))}


def test_rule_h3_exclusive_nodes_keep_their_placement() -> None:
    # A world without packed nodes: gpu_slots stay empty, placement as rule A3.
    s = Snapshot(now=NOW, nodes=(NodeState("x", "h100", 8, 3), NodeState("y", "h100", 8, 8)),
                 queued=(q(1, 2, gpu_type="h100"),), running=(), priority_weights=NO_AGE,
                 preemption=PreemptionSettings(enabled=False))
    assert placed(plan_admissions(s)) == {1: (("x",), ())}


# --- H4 counting ----------------------------------------------------------------------------

def test_rule_h4_cluster_size_and_job_size_in_gpu_equivalents() -> None:
    s = snap((node("n", (4, 4)), NodeState("h", "h100", 8, 8)))
    assert cluster_gpus(s) == 10.0  # 8 slices of 4 = 2 GPUs, plus 8


def test_rule_h4_the_entry_penalty_of_a_quarter_is_a_quarter_of_a_gpu() -> None:
    from queueing.policy.fairshare import FairShareState

    def after(nodes: tuple[NodeState, ...], job: QueuedJob) -> float:
        state = FairShareState({"a": 1.0, "b": 1.0}, {"a": 1.0, "b": 1.0})
        s = snap(nodes, (job,), fair_share_state=state, interval_seconds=3600.0)
        return plan_admissions(s).fair_share_after["a"]

    quarter = after((node("n", (4, 4)),), q(1, 1))
    one_unit_whole = after((NodeState("h", "h100", 8, 8),), q(1, 1, gpu_type="h100"))
    four_quarters = after((node("n", (4, 4)),), q(1, 1, replicas=4))
    # One slice of 4 is charged 0.25 GPU-h, not 1: its factor drops less than for one
    # whole GPU; four slices are charged as the whole GPU.
    assert quarter > one_unit_whole
    assert four_quarters == pytest.approx(one_unit_whole)


def test_rule_h4_work_lost_counts_a_fraction_in_gpu_equivalents() -> None:
    r = run(9, 1, ("n",), (0,), started=3600.0)
    assert work_lost_gpu_hours(r, NOW, 4) == pytest.approx(0.25)
    assert work_lost_gpu_hours(r, NOW) == pytest.approx(1.0)


# --- H5 what a wait says --------------------------------------------------------------------

def test_rule_h5_a_fraction_wait_names_the_most_free_slices_on_one_gpu() -> None:
    plan = plan_admissions(snap((node("n", (1, 1, 1, 1)),), (q(1, 2),)))
    w = plan.waits[1]
    assert w.reason is WaitReason.CAPACITY
    assert "2 slices of 4 (0.5 GPU) of one ts-a10 GPU" in w.message
    assert "no ts-a10 GPU has 2 free slices; the most on one GPU is 1" in w.message
    assert "4 slices free in all" in w.message


def test_rule_h5_a_whole_gpu_wait_names_the_wholly_free_gpus() -> None:
    plan = plan_admissions(snap((node("n", (3, 4, 2)),), (q(1, 8),)))
    w = plan.waits[1]
    assert "1 × 2 whole GPUs of ts-a10, wholly free" in w.message
    assert "the most wholly free ts-a10 GPUs on one node: 1 on n; needs 2" in w.message


# --- H6 preemption ----------------------------------------------------------------------------

def test_rule_h6_victims_are_taken_on_one_gpu() -> None:
    # GPU 0: quarters 11 and 12 and half 14 (team b, low tier); GPU 1: half 13 and 2
    # free slices. A whole GPU of a higher tier: removing 13, the least work lost (rule
    # R4), frees GPU 1 wholly; nothing on GPU 0 is taken (its jobs free no whole GPU
    # unless all three go).
    running = (run(11, 1, ("n",), (0,), started=7200), run(12, 1, ("n",), (0,), started=7200),
               run(13, 2, ("n",), (1,), started=60), run(14, 2, ("n",), (0,), started=7200))
    s = snap((node("n", (0, 2)),), (q(1, 4, tier=200),), running,
             preemption=PreemptionSettings(enabled=True))
    plan = plan_admissions(s)
    (p,) = plan.preemptions
    victims = {v.job_id for v in p.victims}
    # Whole GPU wanted: GPU 1 (job 13, 2 slices) frees it wholly; GPU 0 needs 3 victims.
    assert victims == {13}


def test_rule_h6_removal_gives_slices_back_to_the_victims_gpu() -> None:
    r = run(11, 2, ("n",), (1,))
    ws = Workspace(snap((node("n", (1, 2)),), running=(r,)))
    undo = ws.simulate_removal([r])
    assert ws.capacity.gpu_free["n"] == [1, 4]
    assert ws.capacity.free["n"] == 5
    undo()
    assert ws.capacity.gpu_free["n"] == [1, 2]
    assert ws.capacity.free["n"] == 3


def test_rule_h6_a_fraction_preempts_on_the_gpu_where_it_then_fits() -> None:
    # GPU 0: 1 free + quarter job 11; GPU 1: 1 free + a half (job 12), a quarter (13).
    # A half needs one victim on GPU 0 (the quarter: 1 + 1 = 2 free).
    running = (run(11, 1, ("n",), (0,)), run(12, 2, ("n",), (1,)), run(13, 1, ("n",), (1,)))
    s = snap((node("n", (3, 1)),), (q(1, 2, tier=200),), running,
             preemption=PreemptionSettings(enabled=True))
    plan = plan_admissions(s)
    assert placed(plan)[1] == (("n",), (0,))  # GPU 0 has 3 free: no preemption at all
    s2 = snap((node("n", (1, 1)),), (q(1, 2, tier=200),), running,
              preemption=PreemptionSettings(enabled=True, lost_per_wait=None))
    (p,) = plan_admissions(s2).preemptions
    assert [v.job_id for v in p.victims] == [11]


def test_rule_h4_rule_r9_counts_the_work_lost_in_gpu_equivalents() -> None:
    # Job 11, a quarter, ran an hour: 0.25 GPU-hours lost (1 slice-hour).
    running = (run(11, 1, ("n",), (0,)), run(12, 2, ("n",), (1,)), run(13, 1, ("n",), (1,)))
    s = snap((node("n", (1, 1)),), (q(1, 2, tier=200),), running,
             preemption=PreemptionSettings(enabled=True, lost_per_wait=0.1))
    plan = plan_admissions(s)
    assert not plan.preemptions
    assert plan.waits[1].message == (
        "waiting for 1 × 2 slices of 4 (0.5 GPU) of one ts-a10 GPU; preempting now would "
        "lose 0.25 GPU-hours of other jobs' work, more than its wait so far is worth "
        "(rule R9)")


# --- H7 what does not apply -------------------------------------------------------------------

def test_rule_h7_a_job_on_a_packed_type_tries_no_other_type() -> None:
    s = snap((node("n", (0, 0)), NodeState("h", "h100", 8, 8)),
             (q(1, 2, gpu_types=(TS, "h100")),))
    plan = plan_admissions(s)
    assert not plan.admissions


def test_rule_h7_no_reservation_on_a_packed_type() -> None:
    s = snap((node("n", (2, 2)),), (q(1, 8),), running=(
        RunningJob(5, "b", TS, 2, 2, 0, preemptible=False, started_at=NOW, nodes=("n", "n"),
                   gpu_slots=(0, 1), max_runtime_seconds=600),), reservation=True)
    plan = plan_admissions(s)
    assert TS not in plan.reservations


def test_rule_h4_quotas_count_units() -> None:
    # Nominal 1 GPU of a 4-slice type = 4 units: four quarters, not a fifth.
    s = snap((node("n", (4, 4)),), tuple(q(i, 1) for i in range(1, 6)),
             quotas={("a", TS): QuotaLimit(4, 0)})
    plan = plan_admissions(s)
    assert len(plan.admissions) == 4
    assert plan.waits[5].reason is WaitReason.QUOTA


# --- H2, H3, H6 property ----------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

S = 4


@st.composite
def worlds(draw: st.DrawFn) -> tuple[tuple[NodeState, ...], tuple[QueuedJob, ...],
                                     tuple[RunningJob, ...]]:
    """Random packed nodes (some GPUs held by running fractions or whole GPUs) and a
    queue of fractions and whole-GPU jobs."""
    nodes: list[NodeState] = []
    running: list[RunningJob] = []
    rid = 1000
    for k in range(draw(st.integers(1, 3))):
        name = f"n{k}"
        gpus = draw(st.integers(1, 4))
        gf = [S] * gpus
        for i in range(gpus):
            kind = draw(st.sampled_from(["free", "whole", "fractions"]))
            if kind == "whole":
                gf[i] = 0
                running.append(run(rid, S, (name,), (i,)))
                rid += 1
            elif kind == "fractions":
                for size in draw(st.lists(st.integers(1, S - 1), max_size=3)):
                    if size <= gf[i]:
                        gf[i] -= size
                        running.append(run(rid, size, (name,), (i,)))
                        rid += 1
        nodes.append(node(name, tuple(gf)))
    queued = tuple(
        q(j + 1, draw(st.sampled_from([1, 2, 3, S, 2 * S])), draw(st.integers(1, 3)))
        for j in range(draw(st.integers(1, 8))))
    return tuple(nodes), queued, tuple(running)


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_rule_h2_h3_property_no_gpu_overcommitted_fractions_pack(
        world: tuple[tuple[NodeState, ...], tuple[QueuedJob, ...], tuple[RunningJob, ...]],
) -> None:
    nodes, queued, running = world
    plan = plan_admissions(snap(nodes, queued, running))
    free = {n.name: list(n.gpu_free) for n in nodes}
    whole_held = {(r.nodes[0], r.gpu_slots[0]) for r in running if r.gpus_per_replica == S}
    jobs = {j.id: j for j in queued}
    for a in plan.admissions:  # in the order the plan made them
        job = jobs[a.job_id]
        units = job.gpus_per_replica
        per = [a.gpu_slots[k * (units // S or 1):(k + 1) * (units // S or 1)]
               for k in range(job.replicas)]
        assert len(a.gpu_slots) == job.replicas * max(1, units // S)
        for name, gpus in zip(a.placement, per, strict=True):
            if units < S:
                (i,) = gpus
                assert (name, i) not in whole_held  # no fraction on a GPU held whole
                fresh = free[name][i] == S
                if fresh:
                    # H3: no already-shared GPU of any node had room for it.
                    assert not any(units <= f < S for fs in free.values() for f in fs)
                else:
                    # H3: the shared GPU with the fewest free slices that hold it, ties
                    # by node name and GPU index.
                    assert (free[name][i], name, i) == min(
                        (f, n, j) for n, fs in free.items() for j, f in enumerate(fs)
                        if units <= f < S)
                free[name][i] -= units
            else:
                for i in gpus:
                    assert free[name][i] == S  # whole GPUs: wholly free ones only
                    free[name][i] = 0
                    whole_held.add((name, i))
            assert all(f >= 0 for f in free[name])  # never over-committed
    # A job left waiting for capacity really had no room left (H2).
    for job in queued:
        if job.id in {a.job_id for a in plan.admissions}:
            continue
        assert plan.waits[job.id].reason in (WaitReason.CAPACITY, WaitReason.NO_FIT)
        room = sum(
            (sum(f // job.gpus_per_replica for f in fs) if job.gpus_per_replica < S
             else sum(1 for f in fs if f == S) // (job.gpus_per_replica // S))
            for fs in free.values())
        assert room < job.replicas


@settings(max_examples=200, deadline=None)
@given(worlds(), st.data())
def test_rule_h6_property_removal_and_placement_undo_exactly(
        world: tuple[tuple[NodeState, ...], tuple[QueuedJob, ...], tuple[RunningJob, ...]],
        data: st.DataObject) -> None:
    nodes, queued, running = world
    ws = Workspace(snap(nodes, queued, running))
    cap = ws.capacity
    before = ({n: list(f) for n, f in cap.gpu_free.items()}, dict(cap.free))
    victims = data.draw(st.lists(st.sampled_from(running), unique_by=lambda r: r.id)
                        if running else st.just([]))
    undo = ws.simulate_removal(victims)
    for name, gf in cap.gpu_free.items():
        assert all(0 <= f <= S for f in gf) and sum(gf) == cap.free[name]
    for r in victims:  # H6: each victim's GPU got its slices back
        (i,) = r.gpu_slots
        assert cap.gpu_free[r.nodes[0]][i] >= min(S, r.gpus_per_replica)
    job = queued[0]
    placed = cap.place(TS, job.gpus_per_replica, job.replicas)
    if placed is not None:
        slots = cap.last_slots
        cap.release(placed, job.gpus_per_replica, slots=slots)
    undo()
    assert ({n: list(f) for n, f in cap.gpu_free.items()}, dict(cap.free)) == before
    # Rule H3's index of shared GPUs is the one a fresh workspace builds.
    assert cap._shared == Capacity(nodes)._shared
