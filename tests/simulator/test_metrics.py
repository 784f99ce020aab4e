"""Rule M1 (docs/scheduling.md, "Measuring: the simulator") and the wait and GPU-hour
accounting, on hand-computed examples."""

from __future__ import annotations

import pytest

from queueing.simulator.metrics import (
    fairness,
    goal_checks,
    percentile,
    queued_intervals,
    summarize,
    weighted_max_min,
)
from queueing.simulator.model import (
    Attempt,
    JobRecord,
    NodeSpec,
    RunResult,
    Scenario,
    SimJob,
    TeamSpec,
    TierSpec,
    Workload,
)


def test_rule_m1_weighted_max_min_fills_the_small_demand_then_splits_by_weight() -> None:
    # 100 GPU-h, weights 1:1:2. Level 25 per weight: a (10) is satisfied; the 90 left go
    # 1:2 to b and c.
    alloc = weighted_max_min({"a": 10, "b": 100, "c": 100}, {"a": 1, "b": 1, "c": 2}, 100)
    assert alloc == pytest.approx({"a": 10, "b": 30, "c": 60})
    # Demand below capacity: everyone gets its demand.
    assert weighted_max_min({"a": 1, "b": 2}, {"a": 1, "b": 5}, 100) == pytest.approx(
        {"a": 1, "b": 2})
    assert weighted_max_min({"a": 0, "b": 8}, {"a": 3, "b": 1}, 4) == pytest.approx(
        {"a": 0, "b": 4})


def _job(i: int, team: str, gpus: int, submit: float, runtime: float) -> SimJob:
    return SimJob(i, team, "normal", "gpu", gpus, 1, submit, runtime, runtime)


def _two_team_world() -> tuple[Workload, RunResult]:
    """4 GPUs, one hour. x (weight 1) runs 4 GPUs all hour; y (weight 3) asks 4 GPUs from
    0 and waits all hour. Demands 4 and 4 GPU-h; fair: x 1, y 3 (shares 25 % and 75 %);
    delivered: x 100 %, y 0 %. y waited in hour 0: −75 points; x never waited."""
    sc = Scenario(nodes=(NodeSpec("n", "gpu", 4),), teams=(TeamSpec("x", 1), TeamSpec("y", 3)),
                  tiers=(TierSpec("normal", 10),))
    x, y = _job(1, "x", 4, 0, 3600), _job(2, "y", 4, 0, 600)
    w = Workload(sc, (x, y), horizon=3600)
    recs = (JobRecord(x, (Attempt(0, 3600, False),), 3600),
            JobRecord(y, (Attempt(3600, 4200, False),), 4200))
    return w, RunResult("test", recs, cycles=2, end=4200, seconds=0)


def test_rule_m1_fairness_counts_only_the_hours_a_team_had_work_waiting() -> None:
    w, result = _two_team_world()
    f = fairness(result, w)
    teams = f["teams"]
    assert isinstance(teams, dict)
    assert teams["y"]["hours_waiting"] == 1
    assert teams["y"]["fair_share"] == pytest.approx(0.75)
    assert teams["y"]["delivered_share"] == pytest.approx(0.0)
    assert teams["y"]["deviation_points"] == pytest.approx(-75.0)
    assert teams["x"]["hours_waiting"] == 0 and teams["x"]["deviation_points"] == 0.0
    assert f["max_deviation_points"] == pytest.approx(75.0)


def test_delivered_counts_inside_the_horizon_and_waits_cover_every_queued_stretch() -> None:
    w, result = _two_team_world()
    s = summarize(result, w)
    # y ran after the horizon: only x's 4 GPU-h are delivered inside it.
    assert s["overall"]["delivered_gpu_hours"] == pytest.approx(4.0)
    assert s["teams"]["y"]["wait_p50_min"] == pytest.approx(60.0)
    rec = JobRecord(_job(3, "x", 1, 10, 100),
                    (Attempt(20, 50, True), Attempt(80, 180, False)), 180)
    assert queued_intervals(rec, 1000) == [(10, 20), (50, 80)]
    assert s["utilization"]["series"][:6] == pytest.approx([1.0] * 6)


def test_percentile_is_nearest_rank() -> None:
    assert percentile([5, 1, 4, 2, 3], 50) == 3
    assert percentile(list(range(1, 101)), 95) == 95
    assert percentile([], 95) == 0.0


def test_goal_checks_hold_each_replay_goal_to_its_bound() -> None:
    goals = {"delivered_vs_greedy_pct": 99.0, "delivered_vs_easy_pct": 99.9,
             "lost_pct_of_delivered": 1.2, "max_preemptions_per_job": 3.0,
             "high_p95_wait_min": 0.9, "gpus8_p95_wait_min": 100.0,
             "gpus8_p95_wait_greedy_min": 120.0, "gpus8_p95_wait_easy_min": 90.0,
             "fairness_max_deviation_points": 5.1, "owed_p95_wait_min": 1.6,
             "owed_goal_min": 1.5}
    met = {key: ok for key, _, _, ok, _ in goal_checks(goals)}
    # Rule R11's decision: the owed jobs' p95 (<= 1 min + grace) is the goal, not the high
    # tier's; "delivered >= EASY backfill's" is withdrawn (EASY never preempts).
    assert met == {"delivered_vs_greedy": True, "lost": False, "max_preemptions": True,
                   "owed_p95": False, "gpus8_p95_vs_greedy": True,
                   "gpus8_p95_vs_easy": False, "fairness": False}
    # A run without the baselines checks only fairq's own goals.
    assert [k for k, *_ in goal_checks({"lost_pct_of_delivered": 0.5})] == ["lost"]
