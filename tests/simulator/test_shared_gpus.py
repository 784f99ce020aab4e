"""Fractional GPUs in the simulator (docs/simulator.md, "Fractional GPUs"): the trace's
shared-GPU mode (parsing, slice rounding, the sampled share, the pools), the per-GPU
slice book, fractions packed on one GPU where the whole-GPU mode holds a GPU each, the
accounting in GPU-equivalents, and the scenario's time-sliced types."""

from __future__ import annotations

from pathlib import Path

import pytest

from queueing.policy.snapshot import QuotaLimit, Snapshot
from queueing.simulator.baselines import BASELINES, run_baseline
from queueing.simulator.cli import main
from queueing.simulator.engine import charged, in_units, run_fairq
from queueing.simulator.metrics import summarize
from queueing.simulator.model import NodeSpec, Scenario, SimJob, TeamSpec, TierSpec, Workload
from queueing.simulator.scenario import ScenarioError, parse_scenario
from queueing.simulator.slices import SliceBook, SliceError, pack_fraction, pick_whole
from queueing.simulator.trace import (
    GPU_TYPE,
    SHARED_TYPE,
    ShareMode,
    TraceError,
    load_openb,
    sample_fractions,
    slices_for,
    whole_gpus,
)

TS = "t4"


@pytest.mark.parametrize(("milli", "s", "k"), [
    (50, 8, 1), (250, 4, 1), (251, 4, 2), (470, 4, 2), (470, 8, 4), (500, 2, 1),
    (810, 4, 4), (810, 8, 7), (999, 8, 8), (1000, 4, 4)])
def test_gpu_milli_is_rounded_up_to_the_slice_grid_never_down(milli: int, s: int,
                                                               k: int) -> None:
    assert slices_for(milli, s) == k
    assert k / s >= milli / 1000


def _trace(tmp: Path) -> Path:
    (tmp / "nodes.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "n-big-0,96000,786432,8,G2\nn-big-1,96000,786432,8,G2\n"
        "n-t4-0,32000,131072,2,T4\nn-t4-1,32000,131072,2,T4\n")
    rows = ["name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
            "creation_time,deletion_time,scheduled_time"]
    # p0: 0.47 of a GPU; p1: 0.81; p2: 0.05; p3: whole 1 GPU; p4: 8 GPUs; p5: 0.25.
    for i, (gpu, milli) in enumerate([(1, 470), (1, 810), (1, 50), (1, 1000), (8, 1000),
                                      (1, 250)]):
        rows.append(f"p{i},1000,1024,{gpu},{milli},,LS,Succeeded,{100 * i},"
                    f"{100 * i + 3600},{100 * i}")
    (tmp / "pods.csv").write_text("\n".join(rows) + "\n")
    return tmp


def test_the_trace_mode_asks_slices_on_the_time_sliced_pool(tmp_path: Path) -> None:
    w = load_openb(_trace(tmp_path), rho=1.0, gpus=20, share=ShareMode(4, models=("T4",)))
    by = {j.id: j for j in w.jobs}
    assert w.scenario.slices == {SHARED_TYPE: 4}
    assert {n.gpu_type for n in w.scenario.nodes} == {GPU_TYPE, SHARED_TYPE}
    # 470 -> 2 of 4 slices; 810 -> 4 of 4: a whole GPU; 50 -> 1; 250 -> 1.
    assert [(by[i].gpu_type, by[i].gpu_slices, by[i].asked) for i in (1, 2, 3, 6)] == [
        (SHARED_TYPE, 2, 0.47), (SHARED_TYPE, 0, 0.81), (SHARED_TYPE, 1, 0.05),
        (SHARED_TYPE, 1, 0.25)]
    assert by[2].share == 1.0 and by[1].share == 0.5 and by[1].units_per_replica == 2
    assert (by[5].gpu_type, by[5].gpus_per_replica, by[5].asked) == (GPU_TYPE, 8, None)
    # Quotas stay in GPUs per type (the loop multiplies the time-sliced one by S).
    assert sum(q.nominal for (_, gt), q in w.scenario.quotas.items()
               if gt == SHARED_TYPE) == 4
    # The offered load counts what the tasks asked: a fraction's gpu_milli / 1000.
    asked = sum(j.useful * j.runtime for j in w.jobs)
    assert asked == pytest.approx(3600 * (0.47 + 0.81 + 0.05 + 1 + 8 + 0.25))
    assert w.horizon == pytest.approx(asked / (20 * 1.0))
    share = w.source["share"]
    assert isinstance(share, dict)
    assert share["fraction_jobs"] == 4 and share["sliced_jobs"] == 3
    assert 1.0 < share["rho_slices"] < share["rho_whole_gpus"]


def test_whole_gpus_gives_each_fraction_a_whole_gpu_of_the_same_jobs(tmp_path: Path) -> None:
    w = load_openb(_trace(tmp_path), rho=1.0, gpus=20, share=ShareMode(4, models=("T4",)))
    ww = whole_gpus(w)
    assert [(j.submit, j.runtime, j.gpu_type) for j in ww.jobs] == [
        (j.submit, j.runtime, j.gpu_type) for j in w.jobs]
    assert all(j.gpu_slices == 0 for j in ww.jobs)
    assert [j.asked for j in ww.jobs] == [j.asked for j in w.jobs]
    assert ww.jobs[0].units_per_replica == 4 and ww.jobs[0].share == 1.0


def test_share_mode_refusals(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="2-64"):
        ShareMode(1)
    with pytest.raises(TraceError, match=r"\(0, 1\)"):
        ShareMode(4, fractions=1.0)
    with pytest.raises(TraceError, match="no node of A100"):
        load_openb(_trace(tmp_path), gpus=20, share=ShareMode(4, models=("A100",)))


def test_fractions_are_sampled_down_to_the_share_with_a_seeded_rule(trace_dir: Path) -> None:
    w = load_openb(trace_dir, rho=1.2, seed=0, share=ShareMode(8, fractions=0.3))
    share = w.source["share"]
    assert isinstance(share, dict)
    assert share["trace_fraction_share"] == pytest.approx(2328 / 5489)
    assert share["fraction_share"] == pytest.approx(0.3, abs=0.001)
    again = load_openb(trace_dir, rho=1.2, seed=0, share=ShareMode(8, fractions=0.3))
    assert [j.id for j in again.jobs] == [j.id for j in w.jobs]
    names = [f"p{i}" for i in range(100)]
    frac = [i % 2 == 0 for i in range(100)]
    a, b = sample_fractions(names, frac, 0.3, 1), sample_fractions(names, frac, 0.3, 2)
    assert len(a) == len(b) == round(0.3 * 50 / 0.7) and a != b
    assert all(frac[names.index(n)] for n in a)


def _workload(jobs: list[SimJob], gpus: int = 1, s: int = 4) -> Workload:
    sc = Scenario(nodes=(NodeSpec("n0", TS, gpus),), teams=(TeamSpec("a", 1.0),),
                  tiers=(TierSpec("low", 10),), quotas={("a", TS): QuotaLimit(gpus)},
                  slices={TS: s})
    return Workload(sc, tuple(jobs), horizon=400.0)


def _frac(i: int, k: int, submit: float = 0.0, runtime: float = 100.0,
          asked: float | None = None) -> SimJob:
    return SimJob(i, "a", "low", TS, 1, 1, submit, runtime, runtime, gpu_slices=k,
                  slices_per_gpu=4, asked=k / 4 if asked is None else asked)


def _starts(result: object) -> dict[int, float]:
    return {r.job.id: r.attempts[0].start for r in result.records}  # type: ignore[attr-defined]


@pytest.mark.parametrize("policy", ["fairq", *BASELINES])
def test_two_fractions_share_one_gpu_where_whole_gpus_take_turns(policy: str) -> None:
    w = _workload([_frac(1, 2), _frac(2, 2)])
    run = (lambda x: run_fairq(x)) if policy == "fairq" else (lambda x: run_baseline(policy, x))
    assert _starts(run(w)) == {1: 0.0, 2: 0.0}
    assert _starts(run(whole_gpus(w))) == {1: 0.0, 2: 100.0}


def test_the_loop_says_which_gpu_holds_each_fraction() -> None:
    seen: list[Snapshot] = []
    w = _workload([_frac(1, 2), _frac(2, 2), _frac(3, 1, submit=10.0)])
    r = run_fairq(w, on_snapshot=seen.append)
    late = next(s for s in seen if s.now > seen[0].now)
    node = late.nodes[0]
    assert (node.capacity, node.free, node.slices_per_gpu, node.gpu_free) == (4, 0, 4, (0,))
    assert sorted((j.id, j.gpus_per_replica, j.gpu_slots) for j in late.running) == [
        (1, 2, (0,)), (2, 2, (0,))]
    assert late.units_per_gpu == {TS: 4}
    assert late.quotas[("a", TS)].nominal == 4  # 1 GPU x 4 slices
    assert _starts(r)[3] == 100.0


def test_fractions_on_different_gpus_leave_no_whole_gpu() -> None:
    # Two GPUs of 4: 3 + 3 slices go on GPU 0 and GPU 1; 2 slices are free, on two GPUs,
    # so a whole GPU waits for the first fraction to end.
    jobs = [_frac(1, 3), _frac(2, 3, runtime=200.0),
            SimJob(3, "a", "low", TS, 1, 1, 1.0, 50.0, 50.0, slices_per_gpu=4)]
    w = _workload(jobs, gpus=2)
    seen: list[Snapshot] = []
    for result in (run_fairq(w, on_snapshot=seen.append), run_baseline("greedy", w),
                   run_baseline("fifo", w)):
        assert _starts(result) == {1: 0.0, 2: 0.0, 3: 100.0}
    # fairq's plan put them on GPUs 0 and 1 (rule H3: no shared GPU holds 3 of 4).
    waiting = next(s for s in seen if s.now > seen[0].now)
    assert waiting.nodes[0].gpu_free == (1, 1)
    assert sorted(j.gpu_slots for j in waiting.running) == [(0,), (1,)]


def test_the_book_packs_on_shared_gpus_first_and_gives_slices_back() -> None:
    book = SliceBook([NodeSpec("a", TS, 2), NodeSpec("b", TS, 2), NodeSpec("x", "g", 8)],
                     {TS: 4})
    assert not book.shared("x")
    hold = book.take("b", slices=2)
    assert hold == ("b", (0,), 2)
    # A shared GPU (b's GPU 0, 2 free) before any free one, also on another node.
    assert pack_fraction(book, ["a", "b"], 1) == ("b", 0)
    assert pack_fraction(book, ["a", "b"], 3) == ("b", 1)  # the node already in use
    assert pick_whole(book, ["a", "b"], 2) == "a"
    assert pick_whole(book, ["a", "b"], 1) == "b"  # best fit: fewest whole GPUs free
    with pytest.raises(SliceError, match="no GPU 0 with 3 free"):
        book.take("b", slices=3, gpu=0)
    book.give(hold)
    assert book.gpu_free("b") == (4, 4) and book.whole_free("b") == 2


def test_gpu_hours_count_gpu_equivalents_and_the_waste_of_whole_gpus() -> None:
    # A task that asked 0.2 of a GPU: 1 slice of 4 (0.25) packed, or a whole GPU.
    w = _workload([_frac(1, 1, runtime=3600.0, asked=0.2)])
    w = Workload(w.scenario, w.jobs, horizon=3600.0)
    frac = summarize(run_baseline("greedy", w), w)["overall"]
    whole = summarize(run_baseline("greedy", whole_gpus(w)), whole_gpus(w))["overall"]
    assert isinstance(frac, dict) and isinstance(whole, dict)
    assert frac["delivered_gpu_hours"] == pytest.approx(0.25)
    assert frac["useful_gpu_hours"] == pytest.approx(0.2)
    assert frac["fraction_waste_gpu_hours"] == pytest.approx(0.05)
    assert whole["delivered_gpu_hours"] == pytest.approx(1.0)
    assert whole["fraction_waste_gpu_hours"] == pytest.approx(0.8)
    # Fair share charges the fraction 0.25 GPU-h per hour at weight 2.
    assert charged(w.jobs[0], 2.0) == (1, 0.5)
    assert charged(whole_gpus(w).jobs[0], 2.0) == (1, 2.0)


def test_quotas_reach_the_policy_in_slices() -> None:
    q = in_units({("a", TS): QuotaLimit(2, 1, 1), ("a", "g"): QuotaLimit(3)}, {TS: 4})
    assert q == {("a", TS): QuotaLimit(8, 4, 4), ("a", "g"): QuotaLimit(3)}


def _scenario(gpu_types: dict[str, object], job: dict[str, object]) -> Workload:
    return parse_scenario({
        "cluster": {"node_pools": [{"name": "t4", "gpu_type": "t4", "nodes": 1,
                                    "gpus_per_node": 2}]},
        "gpu_types": gpu_types, "teams": [{"name": "a", "weight": 1}],
        "tiers": [{"name": "low", "rank": 10}],
        "jobs": [{"team": "a", "tier": "low", "gpu_type": "t4", "runtime_seconds": 60,
                  **job}]})


def test_a_scenario_declares_a_time_sliced_type_and_fractions() -> None:
    w = _scenario({"t4": {"sharing": "time-sliced", "slices_per_gpu": 4}}, {"gpu_slices": 1})
    assert w.scenario.slices == {"t4": 4}
    j = w.jobs[0]
    assert (j.gpu_slices, j.slices_per_gpu, j.share, j.asked) == (1, 4, 0.25, 0.25)


@pytest.mark.parametrize(("types", "job", "message"), [
    ({}, {"gpu_slices": 1}, r"jobs\[0\].gpu_slices: t4 is not time-sliced"),
    ({"t4": {"sharing": "time-sliced", "slices_per_gpu": 4}}, {"gpu_slices": 4},
     r"jobs\[0\].gpu_slices: a fraction is fewer than the 4 slices"),
    ({"t4": {"sharing": "mps", "slices_per_gpu": 4}}, {"gpu_slices": 1, "gpus_per_replica": 2},
     r"jobs\[0\].gpus_per_replica: a fraction \(gpu_slices\) is on one GPU"),
    ({"t4": {"sharing": "exclusive", "slices_per_gpu": 4}}, {},
     r"gpu_types.t4.slices_per_gpu: an exclusive type has 1"),
    ({"t4": {"sharing": "shared"}}, {}, r"gpu_types.t4.sharing: one of"),
    ({"t4": {"sharing": "time-sliced"}}, {}, r"gpu_types.t4.slices_per_gpu: 2-64"),
])
def test_a_scenario_refuses_bad_sharing(types: dict[str, object], job: dict[str, object],
                                        message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        _scenario(types, job)


def test_the_example_scenario_packs_what_whole_gpus_queue() -> None:
    from queueing.simulator.scenario import load_scenario
    w = load_scenario(Path(__file__).resolve().parents[2] / "bench/scenarios/shared_gpus.yaml")
    frac = summarize(run_baseline("greedy", w), w)["overall"]
    whole = summarize(run_baseline("greedy", whole_gpus(w)), whole_gpus(w))["overall"]
    assert isinstance(frac, dict) and isinstance(whole, dict)
    assert frac["fraction_waste_gpu_hours"] == 0.0 < whole["fraction_waste_gpu_hours"]
    assert frac["wait_p95_min"] < whole["wait_p95_min"]


def test_the_command_line_refuses_fractions_without_share(capsys: pytest.CaptureFixture[str],
                                                          trace_dir: Path) -> None:
    assert main(["--trace", str(trace_dir), "--fractions", "0.3", "--quiet"]) == 2
    assert "--fractions and --share-models need --share S" in capsys.readouterr().err
    assert main(["--trace", str(trace_dir), "--share", "4", "--fractions", "x",
                 "--quiet"]) == 2
    assert "--fractions: a share in (0, 1) or 'trace'" in capsys.readouterr().err
