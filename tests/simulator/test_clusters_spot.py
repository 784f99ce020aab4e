"""The simulator with several clusters and spot pools (docs/simulator.md, "Several
clusters and spot capacity"): rules K1-K4 as the loop applies them, rule K6's spot
interruptions (seeded, deterministic), and their cost in the report."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from queueing.simulator.cli import main
from queueing.simulator.engine import interruption_clock, run_fairq
from queueing.simulator.metrics import summarize
from queueing.simulator.model import Attempt
from queueing.simulator.scenario import ScenarioError, load_scenario, parse_scenario

EXAMPLE = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "multicluster_spot.yaml"


def _doc(rate: float = 0.0, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "clusters": [
            {"name": "onprem", "cost_rank": 0, "node_pools": [
                {"name": "gpu", "gpu_type": "gpu", "nodes": 1, "gpus_per_node": 4}]},
            {"name": "cloud", "cost_rank": 1, "node_pools": [
                {"name": "spot", "gpu_type": "gpu", "nodes": 1, "gpus_per_node": 4,
                 "spot": True, "interruptions_per_hour": rate, "replacement_minutes": 30}]},
        ],
        "teams": [{"name": "a", "weight": 1}],
        "tiers": [{"name": "high", "rank": 30, "preemptible": False},
                  {"name": "low", "rank": 10, "preemptible": True}],
        "horizon_seconds": 10000,
        "jobs": [
            # Both low jobs prefer nothing but the cheaper cluster (rule K2): the first
            # takes on-prem, the second the cloud's spot node (rule K4: preemptible).
            {"team": "a", "tier": "low", "gpu_type": "gpu", "gpus_per_replica": 4,
             "submit_seconds": 0, "runtime_seconds": 7200},
            {"team": "a", "tier": "low", "gpu_type": "gpu", "gpus_per_replica": 4,
             "submit_seconds": 10, "runtime_seconds": 7200},
        ],
    }
    doc.update(over)
    return doc


def test_rule_k2_k4_the_cheaper_cluster_first_then_spot_for_a_preemptible_job() -> None:
    result = run_fairq(parse_scenario(_doc()))
    first, second = result.records
    assert first.attempts == (Attempt(0, 7200, preempted=False, cluster="onprem"),)
    assert second.attempts == (Attempt(10, 7210, preempted=False, cluster="cloud"),)
    assert result.interruptions == 0


def test_rule_k4_a_non_preemptible_job_waits_rather_than_use_spot() -> None:
    doc = _doc()
    doc["jobs"][1]["tier"] = "high"
    result = run_fairq(parse_scenario(doc))
    low, high = result.records
    # On-prem is busy; the spot node is free all along but not for it. Owed its GPUs
    # (rule R11: its team's nominal is every GPU), it preempts the low job on-prem at
    # its arrival and starts when the victim's 30 s grace is over.
    assert high.attempts == (Attempt(40, 7240, preempted=False, cluster="onprem"),)
    assert low.attempts[0] == Attempt(0, 10, preempted=True, cluster="onprem")


def test_allow_spot_lets_a_non_preemptible_job_use_spot() -> None:
    doc = _doc()
    doc["jobs"][1].update(tier="high", allow_spot=True)
    _, high = run_fairq(parse_scenario(doc)).records
    assert high.attempts[0].cluster == "cloud"


def test_rule_k6_an_interrupted_spot_node_requeues_its_job_and_the_loss_is_counted() -> None:
    w = parse_scenario(_doc(rate=2.0, seed=3))
    result = run_fairq(w)
    _, spot_job = result.records
    reclaimed = [a for a in spot_job.attempts if a.reclaimed]
    assert reclaimed, "at 2 interruptions an hour, a 2-hour run on spot is interrupted"
    # The attempt ends at the interruption; the job runs again and finishes.
    first = spot_job.attempts[0]
    clock = interruption_clock(3, "cloud/spot-000", 2.0)
    assert first == Attempt(10, clock.expovariate(2.0 / 3600.0), preempted=False,
                            reclaimed=True, cluster="cloud")
    assert spot_job.finished is not None and not spot_job.attempts[-1].requeued
    assert spot_job.preemptions == 0  # not a preemption (rule K6: not a failure either)
    doc = summarize(result, w)
    lost = sum(4 * (a.end - a.start) / 3600.0 for a in reclaimed)
    assert doc["overall"]["lost_to_spot_gpu_hours"] == pytest.approx(lost)  # type: ignore[index]
    assert doc["spot"]["interruptions"] == result.interruptions  # type: ignore[index]
    assert doc["spot"]["lost_gpu_hours"] == pytest.approx(lost)  # type: ignore[index]
    clusters = doc["clusters"]
    assert clusters["cloud"]["lost_to_spot_gpu_hours"] == pytest.approx(lost)  # type: ignore[index]
    assert clusters["onprem"]["lost_to_spot_gpu_hours"] == 0.0  # type: ignore[index]


def test_rule_k6_the_waiting_time_after_an_interruption_counts_as_a_wait() -> None:
    w = parse_scenario(_doc(rate=2.0, seed=3))
    result = run_fairq(w)
    _, spot_job = result.records
    first, again = spot_job.attempts[0], spot_job.attempts[1]
    # Requeued at the interruption; the node is down 30 min, on-prem busy: it waits.
    assert again.start > first.end
    assert summarize(result, w)["teams"]["a"]["wait_p99_min"] > 0  # type: ignore[index]


def test_interruptions_are_deterministic_by_seed() -> None:
    def run(seed: int) -> tuple[Any, ...]:
        return run_fairq(parse_scenario(_doc(rate=1.0, seed=seed))).records

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_no_interruption_at_rate_zero_and_the_run_is_the_same_as_without_spot_rate() -> None:
    a = run_fairq(parse_scenario(_doc(rate=0.0, seed=1)))
    b = run_fairq(parse_scenario(_doc(rate=0.0, seed=2)))
    assert a.records == b.records and a.interruptions == 0


def test_a_run_without_clusters_reports_no_cluster_figures() -> None:
    doc = {"cluster": {"node_pools": [{"gpu_type": "gpu", "nodes": 1, "gpus_per_node": 4}]},
           "teams": [{"name": "a"}], "tiers": [{"name": "low", "rank": 1}],
           "jobs": [{"team": "a", "tier": "low", "gpu_type": "gpu", "runtime_seconds": 60}]}
    w = parse_scenario(doc)
    out = summarize(run_fairq(w), w)
    assert "clusters" not in out and "spot" not in out
    assert "lost_to_spot_gpu_hours" not in out["overall"]  # type: ignore[operator]


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["clusters"][0]["node_pools"][0].update(interruptions_per_hour=1.0),
     "clusters[0].node_pools[0].interruptions_per_hour: only a spot pool"),
    (lambda d: d["jobs"][0].update(cluster="mars"), "jobs[0].cluster: no cluster 'mars'"),
    (lambda d: d.update(cluster={"node_pools": []}), "clusters: give either cluster"),
    (lambda d: d["clusters"][1].update(name="onprem"), "clusters: two clusters"),
    (lambda d: d["clusters"][0].update(name="On Prem"), "clusters[0].name: lowercase"),
    # Rule K1: 2 × 4 GPUs fit the two clusters together, never one.
    (lambda d: d["jobs"][0].update(replicas=2), "jobs[0].replicas: 2 replicas of 4 GPUs never "
     "fit the gpu nodes of one cluster it may use"),
])
def test_bad_cluster_sections_are_refused_with_the_field(change: Any, message: str) -> None:
    doc = copy.deepcopy(_doc())
    change(doc)
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(doc)
    assert str(exc.value).startswith(message)


def test_the_example_scenario_runs_and_reports_per_cluster(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str],
                                                           ) -> None:
    w = load_scenario(EXAMPLE)
    assert {n.cluster for n in w.scenario.nodes} == {"onprem", "cloud"}
    out = tmp_path / "run.json"
    png = tmp_path / "run.png"
    assert main(["--scenario", str(EXAMPLE), "--policies", "fairq", "--json", str(out),
                 "--report", str(png)]) == 0
    doc = json.loads(out.read_text())["policies"]["fairq"]
    assert set(doc["clusters"]) == {"onprem", "cloud"}
    assert doc["spot"]["interruptions"] > 0
    assert (tmp_path / "run-clusters.png").stat().st_size > 0
    text = capsys.readouterr().out
    assert "GPU-hours lost to spot" in text
    assert main(["--scenario", str(EXAMPLE), "--policies", "fairq", "--quiet",
                 "--spot-interruptions-per-hour", "0", "--json", str(out)]) == 0
    none = json.loads(out.read_text())["policies"]["fairq"]
    assert none["spot"]["interruptions"] == 0
    assert none["spot"]["lost_gpu_hours"] == 0.0
