"""Checkpoints, grace and owed claims in the replay (queueing/simulator/checkpoints.py,
engine.py, metrics.py; docs/simulator.md "Checkpoints, grace and owed claims"): a victim
resumes from its last save (rule R4's measure of lost work), keeps its GPUs for its grace
(rule R10), its lost GPU-hours are the time since its last save, and the jobs owed their
GPUs when submitted (rule R11) are reported apart. Tiny scenarios whose answer is known
by hand."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from queueing.policy.snapshot import Snapshot
from queueing.simulator.checkpoints import (
    DEFAULT_CHECKPOINT,
    CheckpointError,
    CheckpointModel,
    parse_grace,
    with_checkpoints,
)
from queueing.simulator.cli import main
from queueing.simulator.engine import EPOCH, run_fairq
from queueing.simulator.metrics import goal_checks, goals, summarize
from queueing.simulator.model import SimJob
from queueing.simulator.scenario import parse_scenario
from tests.simulator.test_clusters_spot import _doc as spot_doc

H = 3600.0


def _doc(*, interval: float | None = 1800, low: dict[str, Any] | None = None,
         **over: Any) -> dict[str, Any]:
    """One node of 4 GPUs. Team b (nominal 0: all it holds is borrowed) runs a 3 h low job
    from 0 that checkpoints every `interval` s; team a (nominal 4) submits a 10 min high
    job at 4200 s (70 min). Rule R9 off: the high job preempts at once on main's rules
    and R11's alike."""
    job: dict[str, Any] = {"team": "b", "tier": "low", "gpu_type": "gpu", "gpus_per_replica": 4,
                           "submit_seconds": 0, "runtime_seconds": 3 * H}
    if interval is not None:
        job["checkpoint_interval_seconds"] = interval
    doc: dict[str, Any] = {
        "cluster": {"node_pools": [{"name": "n", "gpu_type": "gpu", "nodes": 1,
                                    "gpus_per_node": 4}]},
        "teams": [{"name": "a", "weight": 1}, {"name": "b", "weight": 1}],
        "tiers": [{"name": "high", "rank": 30, "preemptible": False},
                  {"name": "low", "rank": 10, "preemptible": True, **(low or {})}],
        "quotas": [{"team": "a", "gpu_type": "gpu", "nominal": 4},
                   {"team": "b", "gpu_type": "gpu", "nominal": 0}],
        "horizon_seconds": 20000,
        "preemption": {"lost_per_wait": None},
        "jobs": [job, {"team": "a", "tier": "high", "gpu_type": "gpu", "gpus_per_replica": 4,
                       "submit_seconds": 4200, "runtime_seconds": 600}],
    }
    doc.update(over)
    return doc


def test_rule_r4_a_checkpointing_victim_saves_on_the_signal_and_resumes_where_it_stopped() -> None:
    w = parse_scenario(_doc())
    result = run_fairq(w)
    low, high = result.records
    first, second = low.attempts
    # Preempted at 4200; it saves on the stop signal (its 30 s grace allows a save of 0 s):
    # nothing lost, 3 h - 4200 s left, run from the high job's end.
    assert (first.start, first.end, first.preempted, first.saved) == (0, 4200, True, 4200)
    assert high.attempts[0].start == 4230 and high.attempts[0].end == 4830
    assert (second.start, second.end) == (4830, 4830 + 3 * H - 4200)
    s: dict[str, Any] = summarize(result, w)
    assert s["overall"]["lost_gpu_hours"] == 0
    assert s["overall"]["preemptions"] == 1 and s["overall"]["preemptions_no_loss"] == 1
    # Every GPU-second of work is delivered once: 3 h and 10 min of 4 GPUs.
    assert s["overall"]["delivered_gpu_hours"] == pytest.approx(4 * (3 * H + 600) / H)


def test_rule_r4_a_victim_that_cannot_save_in_its_grace_keeps_its_last_checkpoint() -> None:
    doc = _doc()
    w = parse_scenario(doc)
    w = replace(w, scenario=replace(w.scenario, save_seconds=60.0))  # longer than 30 s
    result = run_fairq(w)
    low = result.records[0]
    first, second = low.attempts
    # The last periodic checkpoint was at 3600: 600 s of 4 GPUs lost, 2 h left.
    assert first.saved == 3600
    assert second.end - second.start == 3 * H - 3600
    s: dict[str, Any] = summarize(result, w)
    assert s["overall"]["lost_gpu_hours"] == pytest.approx(4 * 600 / H)
    assert s["overall"]["preemptions_no_loss"] == 0
    # Lost per tier and per team: the victim's.
    assert s["tiers"]["low"]["lost_gpu_hours"] == pytest.approx(4 * 600 / H)
    assert s["teams"]["b"]["lost_gpu_hours"] == pytest.approx(4 * 600 / H)
    assert s["teams"]["a"]["lost_gpu_hours"] == 0
    assert s["overall"]["delivered_gpu_hours"] == pytest.approx(4 * (3 * H + 600) / H)


def test_rule_r6_a_victim_without_checkpoints_starts_over_and_loses_its_attempt() -> None:
    w = parse_scenario(_doc(interval=None))
    result = run_fairq(w)
    first, second = result.records[0].attempts
    assert first.saved is None and second.end - second.start == 3 * H
    s: dict[str, Any] = summarize(result, w)
    assert s["overall"]["lost_gpu_hours"] == pytest.approx(4 * 4200 / H)


def test_rule_r4_the_policy_sees_the_attempts_last_checkpoint_and_its_grace() -> None:
    seen: dict[float, Snapshot] = {}

    def keep(s: Snapshot) -> None:
        seen[(s.now - EPOCH).total_seconds()] = s

    run_fairq(parse_scenario(_doc(low={"grace_seconds": 120})), on_snapshot=keep)
    job = next(r for r in seen[4200].running if r.id == 1)
    # 4200 s into the attempt, checkpoints every 1800 s: the last one at 3600.
    assert job.checkpointed_at == EPOCH + timedelta(seconds=3600)
    assert job.grace_seconds == 120
    # The resumed attempt (from 4320 + 600) reports none yet when the high job ends.
    resumed = [s for t, s in seen.items() if t > 4200 and any(r.id == 1 for r in s.running)]
    assert all(r.checkpointed_at is None for s in resumed for r in s.running if r.id == 1)


def test_rule_r10_a_victim_keeps_its_gpus_for_its_tiers_grace() -> None:
    result = run_fairq(parse_scenario(_doc(low={"grace_seconds": 120})))
    low, high = result.records
    assert low.attempts[0].released == 4320
    # The preemptor starts once the victim's GPUs are free, not before.
    assert high.attempts[0].start == 4320
    w = parse_scenario(_doc(low={"grace_seconds": 0}))
    # Grace 0: free at once; the next periodic cycle (3 s) admits the preemptor.
    assert run_fairq(w).records[1].attempts[0].start == 4203


def test_rule_r11_a_job_owed_when_submitted_is_reported_apart_with_its_goal() -> None:
    w = parse_scenario(_doc())
    result = run_fairq(w)
    # Team a's high job: nothing of a held, 4 + 0 <= its nominal 4: owed. Team b's low job:
    # nominal 0, not owed.
    assert result.owed == frozenset({2})
    s: dict[str, Any] = summarize(result, w)
    owed = s["owed"]
    assert owed["goal_min"] == pytest.approx(1.5)  # 1 min + the 30 s grace
    assert owed["overall"]["jobs"] == 1
    assert owed["tiers"]["high"]["wait_p95_min"] == pytest.approx(0.5)  # the grace
    g = goals({"fairq": s})
    assert g["owed_p95_wait_min"] == pytest.approx(0.5) and g["owed_high_jobs"] == 1
    assert {k: ok for k, _, _, ok, _ in goal_checks(g)}["owed_p95"] is True


def test_rule_r11_a_job_beyond_its_teams_nominal_is_not_owed() -> None:
    doc = _doc()
    doc["quotas"][0]["nominal"] = 2  # team a asks 4 GPUs of a nominal 2
    result = run_fairq(parse_scenario(doc))
    assert result.owed == frozenset()


def test_checkpoint_model_parses_describes_and_draws_by_seed() -> None:
    assert CheckpointModel.parse("off").describe() == "off"
    assert CheckpointModel.parse("1:1h:30m") == DEFAULT_CHECKPOINT
    m = CheckpointModel.parse("0.5:0:30m:20s")
    assert (m.share, m.min_runtime, m.interval, m.save_seconds) == (0.5, 0, 1800, 20)
    for bad in ("2:1h:30m", "x:1h:30m", "1:1h", "1:1h:0"):
        with pytest.raises(CheckpointError, match="--checkpoint"):
            CheckpointModel.parse(bad)
    jobs = [SimJob(i, "a", "low", "gpu", 1, 1, 0.0, 600.0 if i % 2 else 7200.0, 7200.0)
            for i in range(1, 401)]
    # The default: every job over 1 h, none of the others (the runtime picks, nothing more).
    out = with_checkpoints(jobs, DEFAULT_CHECKPOINT, seed=11)
    assert all((j.checkpoint_interval == 1800) == (j.runtime > H) for j in out)
    assert all(j.estimate == 7200.0 for j in out)
    half = with_checkpoints(jobs, CheckpointModel.parse("0.5:0:30m"), seed=11)
    n = sum(1 for j in half if j.checkpoint_interval)
    assert 160 <= n <= 240
    assert half == with_checkpoints(jobs, CheckpointModel.parse("0.5:0:30m"), seed=11)
    assert half != with_checkpoints(jobs, CheckpointModel.parse("0.5:0:30m"), seed=12)


def test_grace_is_given_for_every_tier_or_per_tier() -> None:
    assert parse_grace("30", ["high", "low"]) == {"high": 30, "low": 30}
    assert parse_grace("low=2m", ["high", "low"]) == {"low": 120}
    with pytest.raises(CheckpointError, match="--grace"):
        parse_grace("mid=30", ["high", "low"])


def test_the_command_line_takes_checkpoint_and_grace(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump(_doc(interval=None)))
    assert main(["--scenario", str(f), "--checkpoint", "nonsense", "--quiet"]) == 2
    assert "--checkpoint" in capsys.readouterr().err
    assert main(["--scenario", str(f), "--checkpoint", "1:0:30m", "--grace", "low=60",
                 "--policies", "fairq", "--quiet", "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["source"]["checkpoint"] == "1:0s:1800s"
    assert doc["source"]["grace"] == {"low": 60}
    fq = doc["policies"]["fairq"]
    assert fq["overall"]["lost_gpu_hours"] == 0 and fq["overall"]["preemptions_no_loss"] == 1
    assert fq["owed"]["goal_min"] == 2.0


def test_rule_k6_an_interrupted_spot_job_keeps_its_last_periodic_checkpoint() -> None:
    doc = spot_doc(rate=2.0, seed=3)
    doc["jobs"][1]["checkpoint_interval_seconds"] = 600
    w = parse_scenario(doc)
    result = run_fairq(w)
    spot_job = result.records[1]
    first = spot_job.attempts[0]
    assert first.reclaimed
    # No time to save at an interruption: the last checkpoint every 600 s is kept.
    kept = 10 + (first.end - 10) // 600 * 600
    assert first.saved == (kept if kept > 10 else None)
    s: dict[str, Any] = summarize(result, w)
    lost = sum(4 * (a.end - a.kept_until) / H for a in spot_job.attempts if a.reclaimed)
    assert s["overall"]["lost_to_spot_gpu_hours"] == pytest.approx(lost)
    # The job's work is done once: 2 h of 4 GPUs delivered, however often interrupted.
    assert sum(a.kept_until - a.start for a in spot_job.attempts) == pytest.approx(7200)
