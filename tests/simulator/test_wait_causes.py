"""Why a tier waited (queueing/simulator/waits.py, docs/simulator.md "Why a tier
waited"): the wait cause of every cycle, attributed until the next one, adds up to each
job's wait; each cause shows up where its rule holds the job back; the floors of the
non-preemptible tier's wait on hand-computed examples; the JSON and text report carry
them."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from queueing.policy.settings import DEFAULTS
from queueing.policy.snapshot import QuotaLimit
from queueing.simulator.cli import main, simulate
from queueing.simulator.engine import run_fairq
from queueing.simulator.metrics import wait_seconds
from queueing.simulator.model import NodeSpec, Scenario, SimJob, TeamSpec, TierSpec, Workload
from queueing.simulator.report import text_report
from queueing.simulator.scenario import parse_scenario
from queueing.simulator.waits import (
    REQUEUED,
    WaitCauses,
    breakdown,
    non_preemptible_floors,
)


def _doc(**over: Any) -> dict[str, Any]:
    """One node of 4 GPUs; team b's low job (nominal 0: all borrowed) runs from 0 to 3600,
    team a's high job (nominal 4) arrives at 1800. A victim's grace is 0 (its GPUs free at
    once, as on the simulated cluster): the causes of the grace are tested apart."""
    doc: dict[str, Any] = {
        "cluster": {"node_pools": [{"name": "n", "gpu_type": "gpu", "nodes": 1,
                                    "gpus_per_node": 4}]},
        "teams": [{"name": "a", "weight": 1}, {"name": "b", "weight": 1}],
        # The high tier's owed claims wait by the ordinary rules (R11's opt-out), so R3,
        # R5 and R9 show as causes; an owed claim is tested in test_checkpoints.py.
        "tiers": [{"name": "high", "rank": 30, "preemptible": False,
                   "owed_preempts_at_once": False},
                  {"name": "low", "rank": 10, "preemptible": True, "grace_seconds": 0}],
        "quotas": [{"team": "a", "gpu_type": "gpu", "nominal": 4},
                   {"team": "b", "gpu_type": "gpu", "nominal": 0}],
        "horizon_seconds": 10000,
        "jobs": [
            {"team": "b", "tier": "low", "gpu_type": "gpu", "gpus_per_replica": 4,
             "submit_seconds": 0, "runtime_seconds": 3600},
            {"team": "a", "tier": "high", "gpu_type": "gpu", "gpus_per_replica": 4,
             "submit_seconds": 1800, "runtime_seconds": 600},
        ],
    }
    doc.update(over)
    return doc


def _causes(w: Workload) -> tuple[Any, WaitCauses]:
    causes = WaitCauses()
    result = run_fairq(w, on_cycle=causes.on_cycle)
    causes.finish(result.end)
    return result, causes


def _by_job(causes: WaitCauses, job_id: int) -> dict[str, float]:
    return {k: v for k, v in causes.seconds.get(job_id, {}).items() if v > 0}


def test_rule_r9_a_refused_preemption_is_the_cause_not_worth_it() -> None:
    # R9 (ratio 1): the victim has run 1800 s when the high job arrives and runs on as the
    # job waits, so taking it never becomes worth it: the job waits for its finish.
    result, causes = _causes(parse_scenario(_doc()))
    assert result.records[1].attempts[0].start == 3600
    assert _by_job(causes, 2) == {"capacity:not_worth_it": 1800.0}


def test_rule_r8_a_preemptor_waits_preempting_and_its_victim_requeued() -> None:
    result, causes = _causes(parse_scenario(_doc(preemption={"lost_per_wait": None})))
    # The preemption at 1800; the preemptor is admitted by the next cycle, 3 s later.
    assert _by_job(causes, 2) == {"preempting": 3.0}
    low = _by_job(causes, 1)
    # The victim: back in the queue at 1800; at 1803 the pass admits the preemptor on the
    # GPUs it holds for it (rule A5), so the victim is told those are held until the next
    # cycle (the grace's end, 1830); then no victim it may take (the high job is of a
    # higher tier) until the high job ends at 2403.
    assert low == {REQUEUED: 3.0, "held_for_preemptor": 27.0, "capacity:no_victim": 573.0}
    assert sum(low.values()) == wait_seconds(result.records[0], result.end)


def test_rule_r3_candidates_in_their_minimum_runtime_are_the_cause_protected() -> None:
    doc = _doc(preemption={"lost_per_wait": None})
    doc["tiers"][1]["min_runtime_seconds"] = 2400
    _, causes = _causes(parse_scenario(doc))
    assert _by_job(causes, 2) == {"capacity:protected": 600.0, "preempting": 3.0}


def test_without_preemption_the_cause_is_no_search() -> None:
    _, causes = _causes(parse_scenario(_doc(preemption={"enabled": False})))
    assert _by_job(causes, 2) == {"capacity:no_search": 1800.0}


def test_rule_r5_a_rate_limited_team_waits_with_that_cause() -> None:
    jobs = [{"team": "b", "tier": "low", "gpu_type": "gpu", "gpus_per_replica": 1,
             "count": 4, "runtime_seconds": 36000},
            {"team": "a", "tier": "high", "gpu_type": "gpu", "gpus_per_replica": 1,
             "count": 2, "submit_seconds": 100, "runtime_seconds": 36000}]
    doc = _doc(jobs=jobs, preemption={"max_per_team": 1, "window_seconds": 1000,
                                      "lost_per_wait": None})
    _, causes = _causes(parse_scenario(doc))
    # The first high job preempts at once; the second waits for the window to move (1100).
    second = _by_job(causes, 6)
    assert second["preemption_rate_limited"] == pytest.approx(1000.0)
    assert set(second) == {"preemption_rate_limited", "preempting"}


def _random_workload(seed: int) -> Workload:
    rng = random.Random(seed)
    teams = (TeamSpec("ada", 1.0), TeamSpec("bob", 2.0), TeamSpec("cyd", 1.0))
    tiers = (TierSpec("x-high", 30, preemptible=False), TierSpec("x-normal", 20, True, 120),
             TierSpec("x-low", 10, True, 0))
    nodes = (NodeSpec("node-0", "h100", 8), NodeSpec("node-1", "h100", 8),
             NodeSpec("node-2", "h100", 4))
    quotas = {("ada", "h100"): QuotaLimit(5), ("bob", "h100"): QuotaLimit(10),
              ("cyd", "h100"): QuotaLimit(5)}
    sc = Scenario(nodes=nodes, teams=teams, tiers=tiers, quotas=quotas, settings=DEFAULTS)
    jobs, t = [], 0.0
    for i in range(60):
        t += rng.choice((0, 20, 45, 90, 180))
        g, reps = rng.choice(((1, 1), (1, 1), (2, 1), (4, 1), (4, 2), (8, 1)))
        runtime = float(rng.choice((60, 300, 900, 1800)))
        jobs.append(SimJob(i + 1, rng.choice(teams).name,
                           rng.choices([x.name for x in tiers], weights=(2, 3, 5))[0],
                           "h100", g, reps, t, runtime, runtime * rng.choice((1, 2))))
    return Workload(sc, tuple(jobs), horizon=t)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_causes_of_every_job_add_up_to_its_wait(seed: int) -> None:
    w = _random_workload(seed)
    result, causes = _causes(w)
    waited = 0.0
    for rec in result.records:
        total = sum(causes.seconds.get(rec.job.id, {}).values())
        assert total == pytest.approx(wait_seconds(rec, result.end), abs=1e-6)
        waited += total
    assert waited > 0  # the workload does make jobs wait
    out = breakdown(result, causes, w)
    assert list(out) == ["x-high", "x-normal", "x-low"]
    for tier, t in out.items():
        assert sum(c["share_pct"] for c in t["causes"].values()) == pytest.approx(
            100.0 if t["wait_hours"] > 0 else 0.0)
        assert sum(c["main_jobs"] for c in t["causes"].values()) == sum(
            1 for r in result.records if r.job.tier == tier and wait_seconds(r, result.end) > 0)


def _floor_workload(jobs: list[SimJob]) -> Workload:
    sc = Scenario(nodes=(NodeSpec("n0", "g", 4),),
                  teams=(TeamSpec("a", 1.0), TeamSpec("b", 1.0)),
                  tiers=(TierSpec("high", 30, preemptible=False), TierSpec("low", 10)),
                  quotas={("a", "g"): QuotaLimit(2), ("b", "g"): QuotaLimit(2)})
    return Workload(sc, tuple(jobs), horizon=1000)


def test_the_nominal_floor_waits_for_the_teams_nominal_and_the_cluster_floor_for_all() -> None:
    jobs = [SimJob(i, "a", "high", "g", 1, 1, 0.0, 100.0, 100.0) for i in (1, 2, 3)]
    jobs.append(SimJob(4, "b", "high", "g", 1, 1, 10.0, 100.0, 100.0))
    jobs.append(SimJob(5, "a", "low", "g", 4, 1, 0.0, 900.0, 900.0))  # preemptible: ignored
    f = non_preemptible_floors(_floor_workload(jobs))
    assert f["tiers"] == ["high"]
    # Team a's nominal is 2: its third job waits for the first to end (100 s); b's waits 0.
    assert f["nominal"]["jobs"] == 4
    assert f["nominal"]["wait_p99_min"] == pytest.approx(100 / 60)
    assert f["nominal"]["over_goal"] == 1
    # The whole cluster (4 GPUs) holds all four at once.
    assert f["cluster"]["wait_p99_min"] == 0.0 and f["cluster"]["over_goal"] == 0


def test_a_job_larger_than_its_teams_nominal_never_fits_the_nominal_floor() -> None:
    jobs = [SimJob(1, "a", "high", "g", 3, 1, 0.0, 100.0, 100.0)]
    f = non_preemptible_floors(_floor_workload(jobs))
    assert f["nominal"]["never_fit"] == 1 and f["nominal"]["wait_p95_min"] == float("inf")
    assert f["cluster"]["never_fit"] == 0


def test_the_json_and_the_text_report_carry_the_causes_and_floors(tmp_path: Any) -> None:
    w = parse_scenario(_doc())
    doc = simulate(w, ["fairq", "greedy"])
    high = doc["policies"]["fairq"]["wait_causes"]["high"]
    assert high["causes"]["capacity:not_worth_it"]["wait_hours"] == pytest.approx(0.5)
    assert high["over_goal"] == 1
    assert "wait_causes" not in doc["policies"]["greedy"]
    assert doc["wait_floors"]["nominal"]["wait_p95_min"] == 0.0
    text = text_report(doc)
    assert "why each tier waited" in text and "capacity:not_worth_it" in text
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(_doc()))
    out = tmp_path / "out.json"
    assert main(["--scenario", str(scenario), "--policies", "fairq", "--json", str(out),
                 "--quiet"]) == 0
    assert json.loads(out.read_text())["policies"]["fairq"]["wait_causes"]["high"]["jobs"] == 1
