"""GPU types a task accepts (queueing/simulator/gpu_spec.py; docs/simulator.md, "GPU
types a task accepts"): `--gpu-spec off|trace|gen:SHARE`, obeyed by every baseline and
handed to fairq's policy as `QueuedJob.gpu_types`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from queueing.policy.snapshot import Snapshot
from queueing.simulator.baselines import BASELINES, run_baseline
from queueing.simulator.cli import main
from queueing.simulator.engine import run_fairq
from queueing.simulator.gpu_spec import GpuSpecError, GpuSpecMode, split_spec
from queueing.simulator.metrics import goal_checks
from queueing.simulator.model import NodeSpec, Scenario, SimJob, TeamSpec, TierSpec, Workload
from queueing.simulator.trace import load_openb


@pytest.mark.parametrize(("text", "mode"), [
    ("off", GpuSpecMode("off")),
    ("trace", GpuSpecMode("trace")),
    ("TRACE", GpuSpecMode("trace")),
    ("gen:0.3", GpuSpecMode("gen", 0.3)),
    ("gen:1", GpuSpecMode("gen", 1.0)),
])
def test_gpu_spec_modes_parse(text: str, mode: GpuSpecMode) -> None:
    assert GpuSpecMode.parse(text) == mode


@pytest.mark.parametrize("text", ["on", "gen", "gen:0", "gen:1.5", "gen:-0.1", "gen:x", ""])
def test_bad_gpu_spec_modes_are_refused(text: str) -> None:
    with pytest.raises(GpuSpecError, match="--gpu-spec"):
        GpuSpecMode.parse(text)


def test_a_spec_cell_is_models_in_order() -> None:
    assert split_spec("V100M32|G2") == ("V100M32", "G2")
    assert split_spec(" T4 | | T4|P100 ") == ("T4", "P100")
    assert split_spec("") == ()


def _trace(d: Path, specs: list[str]) -> Path:
    """Nodes: 2 × G2 × 8, 2 × T4 × 2, 1 × P100 × 2 (22 GPUs). One pod per spec, 1 GPU,
    except the last, 8 GPUs."""
    (d / "nodes.csv").write_text(
        "sn,cpu_milli,memory_mib,gpu,model\n"
        "g-0,1,1,8,G2\ng-1,1,1,8,G2\nt-0,1,1,2,T4\nt-1,1,1,2,T4\np-0,1,1,2,P100\n")
    rows = []
    for i, spec in enumerate(specs):
        gpus = 8 if i == len(specs) - 1 else 1
        rows.append(f"pod-{i},1,1,{gpus},1000,{spec},BE,Running,{i * 100},{i * 100 + 500},"
                    f"{i * 100}")
    (d / "pods.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time\n" + "\n".join(rows) + "\n")
    return d


def test_trace_specs_are_read_filtered_to_the_cluster_and_ordered(tmp_path: Path) -> None:
    d = _trace(tmp_path, ["", "T4|G2", "A100", "V100M16|P100", "T4"])
    w = load_openb(d, rho=1.0, gpus=22, gpu_spec=GpuSpecMode("trace"))
    assert {n.gpu_type for n in w.scenario.nodes} == {"G2", "T4", "P100"}
    got = {j.submit: j.accepted_types for j in w.jobs}
    types = [got[k] for k in sorted(got)]
    assert types == [
        ("G2", "T4", "P100"),  # no spec: every model, largest pool first, then by name
        ("T4", "G2"),          # the spec's own order
        # pod-2 asks only for A100, which the cluster lacks: left out (counted)
        ("P100",),             # V100M16 is not in the cluster
        # pod-4: 8 GPUs on T4 only, and no T4 node has 8: left out
    ]
    assert w.source["dropped_no_node"] == 2 and w.source["restricted_jobs"] == 2
    assert all(j.gpu_type == j.accepted_types[0] for j in w.jobs)
    # Quotas per GPU type, by weight within each.
    assert sum(q.nominal for (_, gt), q in w.scenario.quotas.items() if gt == "G2") == 16
    off = load_openb(d, rho=1.0, gpus=22)
    assert {n.gpu_type for n in off.scenario.nodes} == {"openb"}
    assert all(j.accepted_types == ("openb",) for j in off.jobs) and len(off.jobs) == 5


def test_generated_specs_on_the_real_trace(trace_dir: Path) -> None:
    w = load_openb(trace_dir, rho=1.2, seed=11, gpu_spec=GpuSpecMode.parse("gen:0.3"))
    again = load_openb(trace_dir, rho=1.2, seed=11, gpu_spec=GpuSpecMode.parse("gen:0.3"))
    other = load_openb(trace_dir, rho=1.2, seed=12, gpu_spec=GpuSpecMode.parse("gen:0.3"))
    assert [j.accepted_types for j in w.jobs] == [j.accepted_types for j in again.jobs]
    assert [j.accepted_types for j in w.jobs] != [j.accepted_types for j in other.jobs]
    models = {n.gpu_type for n in w.scenario.nodes}
    largest = Counter[str]()
    for n in w.scenario.nodes:
        largest[n.gpu_type] = max(largest[n.gpu_type], n.gpus)
    restricted = [j for j in w.jobs if len(j.accepted_types) < len(
        [m for m in models if largest[m] >= j.gpus_per_replica])]
    restricted_jobs = w.source["restricted_jobs"]
    assert isinstance(restricted_jobs, int)
    assert 0.27 <= restricted_jobs / len(w.jobs) <= 0.33
    assert len(restricted) <= restricted_jobs
    for j in w.jobs:
        assert 1 <= len(j.accepted_types) <= len(models)
        assert set(j.accepted_types) <= models
        assert all(largest[t] >= j.gpus_per_replica for t in j.accepted_types)
    # Generated specs name one or two models.
    assert {len(j.accepted_types) for j in restricted} <= {1, 2}


def _two_types() -> Workload:
    """One 4-GPU a100 node and one 4-GPU t4 node. Job 1 (a100 only, 4 GPUs) runs 0-100;
    job 2 (a100 only, 2 GPUs) must wait for it though the t4 node is idle; job 3 (t4 or
    a100) takes the t4 node; job 4 (a100, then t4) takes what is left of t4."""
    sc = Scenario(nodes=(NodeSpec("a-0", "a100", 4), NodeSpec("t-0", "t4", 4)),
                  teams=(TeamSpec("t", 1.0),), tiers=(TierSpec("normal", 10),))
    return Workload(sc, (
        SimJob(1, "t", "normal", "a100", 4, 1, 0, 100, 100),
        SimJob(2, "t", "normal", "a100", 2, 1, 1, 50, 50),
        SimJob(3, "t", "normal", "t4", 2, 1, 2, 50, 50, gpu_types=("t4", "a100")),
        SimJob(4, "t", "normal", "a100", 2, 1, 3, 50, 50, gpu_types=("a100", "t4"))),
        horizon=200)


@pytest.mark.parametrize("policy", BASELINES)
def test_baselines_place_a_job_only_on_its_accepted_types(policy: str) -> None:
    result = run_baseline(policy, _two_types())
    got = {r.job.id: (r.attempts[0].start, r.attempts[0].gpu_type) for r in result.records}
    if policy == "fifo":
        # Job 2 blocks the queue until job 1 ends: jobs 3 and 4 wait behind it.
        assert got == {1: (0, "a100"), 2: (100, "a100"), 3: (100, "t4"), 4: (100, "a100")}
    else:
        # Job 2 waits for the a100 node, never the idle t4 one; 3 and 4 share t4.
        assert got == {1: (0, "a100"), 2: (100, "a100"), 3: (2, "t4"), 4: (3, "t4")}


def test_fairq_is_given_every_accepted_type(trace_dir: Path) -> None:
    w = load_openb(trace_dir, rho=1.2, seed=11, limit=300,
                   gpu_spec=GpuSpecMode.parse("gen:0.5"))
    by_id = {j.id: j for j in w.jobs}
    seen: dict[int, tuple[str, tuple[str, ...]]] = {}

    def look(s: Snapshot) -> None:
        for q in s.queued:
            seen[q.id] = (q.gpu_type, q.accepted_types)

    result = run_fairq(w, on_snapshot=look)
    assert seen
    for job_id, (first, accepted) in seen.items():
        assert accepted == by_id[job_id].accepted_types and first == accepted[0]
    assert any(len(a) > 1 for _, a in seen.values())
    for r in result.records:
        for a in r.attempts:  # the type the plan chose, one the job accepts
            assert a.gpu_type in r.job.accepted_types
    for policy in BASELINES:
        for r in run_baseline(policy, w).records:
            assert all(a.gpu_type in r.job.accepted_types for a in r.attempts)


def test_the_spec_goal_is_checked_only_with_specs() -> None:
    g = {"delivered_vs_greedy_pct": 99.5, "lost_pct_of_delivered": 0.2,
         "max_preemptions_per_job": 1, "fairness_max_deviation_points": 1.0}
    assert "delivered_vs_greedy_spec" not in [c[0] for c in goal_checks(g)]
    checks = {c[0]: c[3] for c in goal_checks({**g, "with_gpu_spec": 1.0})}
    assert checks["delivered_vs_greedy"] is True
    assert checks["delivered_vs_greedy_spec"] is False  # 99.5 % < greedy's


def test_the_cli_refuses_a_bad_spec_and_spec_options_on_a_scenario(
        capsys: pytest.CaptureFixture[str], trace_dir: Path) -> None:
    assert main(["--trace", str(trace_dir), "--gpu-spec", "gen:2", "--quiet"]) == 2
    assert "--gpu-spec 'gen:2': gen:SHARE with 0 < SHARE <= 1" in capsys.readouterr().err
    demo = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "demo.yaml"
    assert main(["--scenario", str(demo), "--gpu-spec", "trace", "--quiet"]) == 2
    assert "apply to the trace" in capsys.readouterr().err
