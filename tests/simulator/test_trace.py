"""The openb trace mapping (queueing/simulator/trace.py; docs/simulator.md, "The openb
trace"): tenants, tiers, the cluster draw, filters and the load compression."""

from __future__ import annotations

import zlib
from collections import Counter
from pathlib import Path

import pytest

from queueing.simulator.model import NodeSpec
from queueing.simulator.trace import (
    TraceError,
    _NodeRow,
    draw_nodes,
    estimate_of,
    load_openb,
    nominal_by_weight,
    team_of,
    tier_of,
)


def test_tenant_is_crc32_of_the_pod_name_modulo_four() -> None:
    for name in ("openb-pod-0000", "openb-pod-0001", "openb-pod-7777"):
        assert team_of(name) == f"team-{zlib.crc32(name.encode()) % 4}"
    assert zlib.crc32(b"openb-pod-0000") == 0xF3BC3908
    assert team_of("openb-pod-0000") == "team-0"


def test_qos_maps_to_tiers() -> None:
    assert [tier_of(q) for q in ("LS", "Guaranteed", "Burstable", "BE")] == [
        "high", "high", "normal", "low"]
    with pytest.raises(TraceError, match="unknown QoS"):
        tier_of("Platinum")


def test_estimates_round_up_to_a_bucket() -> None:
    assert estimate_of(1) == 600
    assert estimate_of(600) == 600
    assert estimate_of(601) == 1800
    assert estimate_of(5 * 3600) == 8 * 3600


def test_nominal_quotas_follow_the_weights_and_sum_to_the_cluster() -> None:
    assert nominal_by_weight(429, [1, 1, 2, 4]) == [54, 54, 107, 214]


def _mix(nodes: tuple[NodeSpec, ...]) -> Counter[tuple[str, int]]:
    return Counter((n.name.split("-")[0], n.gpus) for n in nodes)


def test_each_seed_draws_another_cluster_of_the_same_gpu_total() -> None:
    rows = [_NodeRow(f"big-{i:02d}", "G2", 8) for i in range(50)]
    rows += [_NodeRow(f"small-{i:02d}", "T4", 2) for i in range(50)]
    rows += [_NodeRow(f"cpu-{i:02d}", "", 0) for i in range(5)]  # no GPU: never drawn
    draws = {seed: draw_nodes(rows, gpus=56, seed=seed) for seed in range(8)}
    for seed, nodes in draws.items():
        assert sum(n.gpus for n in nodes) == 56
        assert nodes == draw_nodes(rows, gpus=56, seed=seed)  # deterministic
        assert all(n.gpu_type == "openb" and n.gpus > 0 for n in nodes)
    # Another mix of node types (not only other names) across seeds, so the node count
    # differs too: 56 GPUs are 7 × 8, or 6 × 8 + 4 × 2, ...
    assert len({tuple(sorted(_mix(n).items())) for n in draws.values()}) > 1
    assert len({len(n) for n in draws.values()}) > 1
    typed = draw_nodes(rows, gpus=56, seed=1, typed=True)
    assert {n.gpu_type for n in typed} <= {"G2", "T4"}
    assert [n.name for n in typed] == [n.name for n in draws[1]]
    with pytest.raises(TraceError, match="asked for 1000 GPUs"):
        draw_nodes(rows, gpus=1000, seed=0)


def _write(d: Path, pods: list[str]) -> Path:
    (d / "nodes.csv").write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                                 + "".join(f"node-{i},1,1,8,G2\n" for i in range(4)))
    (d / "pods.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
        "deletion_time,scheduled_time\n" + "".join(p + "\n" for p in pods))
    return d


def test_the_filters_and_the_load_compression(tmp_path: Path) -> None:
    d = _write(tmp_path, [
        "p-frac,1,1,1,300,,LS,Running,1000,2000,1000",       # fractional: a whole GPU
        "p-two,1,1,2,1000,,BE,Succeeded,2000,5000,2200",      # 2 GPUs, 2800 s
        "p-cpu,1,1,0,0,,BE,Running,2000,5000,2000",           # no GPU: out
        "p-pending,1,1,1,1000,,LS,Pending,2500,5000,",        # never scheduled: out
        "p-long,1,1,1,1000,,Burstable,Running,3000,100000,3000",  # over 24 h: out
        "p-old,1,1,1,1000,,LS,Running,0,100,0",              # ran 100 s
    ])
    w = load_openb(d, rho=0.5, days=30, gpus=32)
    assert [j.gpus for j in w.jobs] == [1, 1, 2]
    assert [j.tier for j in w.jobs] == ["high", "high", "low"]
    assert [j.runtime for j in w.jobs] == [100, 1000, 2800]
    demand = 100 + 1000 + 2 * 2800
    assert w.horizon == pytest.approx(demand / (32 * 0.5))
    # Arrivals keep their spacing, scaled: created at 0, 1000, 2000.
    assert [j.submit for j in w.jobs] == pytest.approx([0, w.horizon / 2, w.horizon])
    assert w.scenario.total_gpus == 32
    with pytest.raises(TraceError, match="does not exist"):
        load_openb(tmp_path / "nowhere")


def test_the_real_trace_gives_429_gpus_and_a_different_cluster_per_seed(
        trace_dir: Path) -> None:
    mixes = set()
    for seed in (11, 12, 13, 14, 15):
        w = load_openb(trace_dir, rho=1.2, seed=seed, limit=50)
        assert w.scenario.total_gpus == 429
        mixes.add(tuple(sorted(Counter(n.gpus for n in w.scenario.nodes).items())))
    assert len(mixes) == 5
    w = load_openb(trace_dir, rho=1.2)
    assert w.scenario.total_gpus == 429
    assert all(0 < j.runtime <= 86400 for j in w.jobs)
    offered = sum(j.gpus * j.runtime for j in w.jobs) / (429 * w.horizon)
    assert offered == pytest.approx(1.2)
