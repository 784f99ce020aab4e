"""The fairq replay (queueing/simulator/engine.py) on tiny scenarios whose answer is
known by hand: preemption accounting (rules R1, R3, R6, R8 as the loop applies them)."""

from __future__ import annotations

from typing import Any

import pytest

from queueing.simulator.engine import run_fairq
from queueing.simulator.metrics import summarize
from queueing.simulator.model import Attempt
from queueing.simulator.scenario import parse_scenario


def _doc(**over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "cluster": {"node_pools": [{"name": "n", "gpu_type": "gpu", "nodes": 1, "gpus_per_node": 4}]},
        "teams": [{"name": "a", "weight": 1}, {"name": "b", "weight": 1}],
        "tiers": [{"name": "high", "rank": 30, "preemptible": False},
                  {"name": "low", "rank": 10, "preemptible": True}],
        "horizon_seconds": 10000,
        # Rule R9 off: these tests preempt for jobs that have just arrived.
        "preemption": {"lost_per_wait": None},
        "jobs": [
            {"team": "b", "tier": "low", "gpu_type": "gpu", "gpus_per_replica": 4,
             "submit_seconds": 0, "runtime_seconds": 3600},
            {"team": "a", "tier": "high", "gpu_type": "gpu", "gpus_per_replica": 4,
             "submit_seconds": 1800, "runtime_seconds": 600},
        ],
    }
    doc.update(over)
    return doc


def test_rule_r6_a_victim_loses_its_run_and_the_lost_gpu_hours_are_exact() -> None:
    w = parse_scenario(_doc())
    result = run_fairq(w)
    low, high = result.records
    # R1: the high job preempts the low one at 1800; R8, R10: it is admitted once the
    # victim's 30 s grace is over (the default termination grace), at 1830; R6: the
    # victim, which does not checkpoint, requeues and runs again in full.
    assert low.attempts == (Attempt(0, 1800, preempted=True), Attempt(2430, 6030, preempted=False))
    assert low.attempts[0].released == 1830 and low.attempts[0].saved is None
    assert high.attempts == (Attempt(1830, 2430, preempted=False),)
    s = summarize(result, w)
    overall = s["overall"]
    assert overall["lost_gpu_hours"] == pytest.approx(4 * 1800 / 3600)  # 2.0 exactly
    assert overall["delivered_gpu_hours"] == pytest.approx(4 * 600 / 3600 + 4 * 3600 / 3600)
    assert overall["grace_gpu_hours"] == pytest.approx(4 * 30 / 3600)
    assert overall["preemptions"] == 1 and overall["max_preemptions_per_job"] == 1
    assert overall["preemptions_no_loss"] == 0
    assert s["tiers"]["high"]["wait_p95_min"] == pytest.approx(30 / 60)
    # The victim waited from its preemption to its restart: 630 s.
    assert s["tiers"]["low"]["wait_p95_min"] == pytest.approx(630 / 60)


def test_rule_r3_a_job_within_its_minimum_runtime_is_preempted_only_once_it_ends() -> None:
    doc = _doc()
    doc["tiers"][1]["min_runtime_seconds"] = 2400
    result = run_fairq(parse_scenario(doc))
    low, high = result.records
    # Protected until 2400 (the loop wakes up then, as the service's periodic cycle would);
    # the victim's 30 s grace follows.
    assert low.attempts[0] == Attempt(0, 2400, preempted=True)
    assert high.attempts == (Attempt(2430, 3030, preempted=False),)


def test_without_preemption_the_high_job_waits_for_the_low_one() -> None:
    result = run_fairq(parse_scenario(_doc(preemption={"enabled": False})))
    low, high = result.records
    assert low.attempts == (Attempt(0, 3600, preempted=False),)
    assert high.attempts == (Attempt(3600, 4200, preempted=False),)


def test_rule_r5_the_rate_limit_holds_preemptions_until_the_window_moves() -> None:
    jobs = [{"team": "b", "tier": "low", "gpu_type": "gpu", "gpus_per_replica": 1,
             "count": 4, "runtime_seconds": 36000}]
    jobs += [{"team": "a", "tier": "high", "gpu_type": "gpu", "gpus_per_replica": 1,
              "count": 4, "submit_seconds": 100, "runtime_seconds": 36000}]
    # b is guaranteed nothing: all its GPUs are borrowed (rule Q2 lets them go).
    doc = _doc(jobs=jobs, preemption={"max_per_team": 1, "window_seconds": 1000,
                           "lost_per_wait": None},
               quotas=[{"team": "a", "gpu_type": "gpu", "nominal": 4},
                       {"team": "b", "gpu_type": "gpu", "nominal": 0}])
    # Team a's jobs are owed (rule R11): R5 does not hold them back ...
    result = run_fairq(parse_scenario(doc))
    preempted_at = sorted(a.end for r in result.records for a in r.attempts if a.preempted)
    assert preempted_at == [100, 100, 100, 100]
    assert result.owed == frozenset({5, 6, 7, 8})
    # ... unless their tier's owed claims wait by the ordinary rules (R11's opt-out): one
    # preemption per 1000 s window for team a.
    doc["tiers"][0]["owed_preempts_at_once"] = False
    result = run_fairq(parse_scenario(doc))
    preempted_at = sorted(a.end for r in result.records for a in r.attempts if a.preempted)
    assert preempted_at == [100, 1100, 2100, 3100]


def _gang_behind_small_jobs(**over: Any) -> dict[str, Any]:
    """Two 8-GPU nodes filled by sixteen one-GPU jobs of 30 min (their estimate too)
    started a second apart; an 8-GPU job of the same tier and team at 30 s; from 60 s
    one more one-GPU job every minute for an hour."""
    small = {"team": "a", "tier": "low", "gpu_type": "gpu", "gpus_per_replica": 1,
             "runtime_seconds": 1800}
    return _doc(**{
        "cluster": {"node_pools": [{"name": "n", "gpu_type": "gpu", "nodes": 2,
                                    "gpus_per_node": 8}]},
        "teams": [{"name": "a", "weight": 1}],
        "jobs": [
            {**small, "submit_seconds": 0, "count": 16, "every_seconds": 1},
            {"team": "a", "tier": "low", "gpu_type": "gpu", "gpus_per_replica": 8,
             "submit_seconds": 30, "runtime_seconds": 600},
            {**small, "submit_seconds": 60, "count": 60, "every_seconds": 60},
        ],
        **over,
    })


def test_rule_a9_a_large_gang_starts_at_its_shadow_time_not_after_the_small_jobs() -> None:
    result = run_fairq(parse_scenario(_gang_behind_small_jobs()))
    gang = next(r for r in result.records if r.job.gpus == 8)
    # Best fit put the first eight one-GPU jobs on n-000: their ends by estimate, the
    # last at 1807 s, are the gang's shadow time. The one-GPU jobs waiting since 60 s
    # would still run then: they may not take n-000's GPUs as these free one by one.
    assert gang.attempts[0].start == 1807


def test_rule_a9_off_the_large_gang_starves_until_the_small_jobs_stop() -> None:
    result = run_fairq(parse_scenario(_gang_behind_small_jobs(reservation=False)))
    gang = next(r for r in result.records if r.job.gpus == 8)
    # Every GPU freed goes to the next one-GPU job (rule A4): no node empties while
    # they keep coming.
    assert gang.attempts[0].start > 3600
