"""Runtime estimate models (queueing/simulator/estimates.py; docs/simulator.md, "Runtime
estimates"): what a user asks for, not the true runtime; EASY backfill and fairq plan on
the same figure."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from queueing.simulator.baselines import run_baseline
from queueing.simulator.cli import main
from queueing.simulator.engine import estimate_seconds
from queueing.simulator.estimates import (
    DEFAULT_ESTIMATE,
    EstimateError,
    EstimateModel,
    parse_duration,
    with_estimates,
)
from queueing.simulator.model import NodeSpec, Scenario, SimJob, TeamSpec, TierSpec, Workload
from queueing.simulator.trace import load_openb

CAP = 24 * 3600.0


@pytest.mark.parametrize(("text", "model"), [
    ("user", EstimateModel("user", 2.0, 10.0)),
    ("USER:3-5", EstimateModel("user", 3.0, 5.0)),
    ("user:4", EstimateModel("user", 4.0, 4.0)),
    ("oracle", EstimateModel("oracle")),
    ("fixed:24h", EstimateModel("fixed", seconds=86400.0)),
    ("fixed:90m", EstimateModel("fixed", seconds=5400.0)),
    ("fixed:3600", EstimateModel("fixed", seconds=3600.0)),
    ("fixed:1.5d", EstimateModel("fixed", seconds=129600.0)),
])
def test_estimate_models_parse(text: str, model: EstimateModel) -> None:
    assert EstimateModel.parse(text) == model


@pytest.mark.parametrize(("text", "message"), [
    ("guess", "one of user"),
    ("user:0.5-2", "1 <= LO <= HI"),
    ("user:5-3", "1 <= LO <= HI"),
    ("user:a-b", "user:LO-HI with numbers"),
    ("fixed:", "not a duration"),
    ("fixed:-1h", "not a duration"),
    ("fixed:0", "not a duration"),
    ("fixed:3w", "not a duration"),
])
def test_bad_estimate_models_are_refused_with_a_reason(text: str, message: str) -> None:
    with pytest.raises(EstimateError, match=message):
        EstimateModel.parse(text)


@pytest.mark.parametrize(("model", "runtime", "estimate"), [
    ("oracle", 1, 600),
    ("oracle", 601, 1800),
    ("oracle", 5 * 3600, 8 * 3600),
    ("fixed:24h", 60, 86400),
    ("fixed:1h", 3 * 3600, 3 * 3600),  # below the runtime: raised to it (no kill)
    ("user:3", 1000, 3000),
    ("user:3", 10 * 3600, CAP),  # capped at the job's maximum
    ("user:3", 30 * 3600, 30 * 3600),  # over the cap: never below the runtime
])
def test_estimate_of_a_runtime_per_model(model: str, runtime: float, estimate: float) -> None:
    got = EstimateModel.parse(model).estimate(runtime, cap=CAP, seed=0, key="job")
    assert got == estimate


def test_user_factors_are_seeded_per_job_and_spread_over_2_to_10() -> None:
    m = DEFAULT_ESTIMATE
    factors = [m.factor(0, f"pod-{i}") for i in range(2000)]
    assert all(2.0 <= f <= 10.0 for f in factors)
    assert min(factors) < 2.1 and max(factors) > 9.5
    # Log-uniform: the median is the geometric mean of the bounds, √20 ≈ 4.47.
    assert statistics.median(factors) == pytest.approx(20 ** 0.5, rel=0.05)
    assert factors == [m.factor(0, f"pod-{i}") for i in range(2000)]  # same seed: same
    assert factors != [m.factor(1, f"pod-{i}") for i in range(2000)]  # another seed
    # Whole seconds, at least the runtime.
    e = m.estimate(1234.5, cap=CAP, seed=0, key="pod-7")
    assert e == int(e) and 2 * 1234.5 <= e <= 10 * 1234.5 + 1


def test_parse_duration_units() -> None:
    assert [parse_duration(t) for t in ("30s", "2m", "1h", "1d", "45")] == [
        30, 120, 3600, 86400, 45]


def _one_node(estimates: list[float]) -> Workload:
    """One 4-GPU node. A (2 GPUs, 100 s) runs; B (4 GPUs) reserves at A's estimated
    end; C (2 GPUs, 50 s, estimate `estimates[2]`) arrives while B waits."""
    sc = Scenario(nodes=(NodeSpec("n1", "gpu", 4),), teams=(TeamSpec("t", 1.0),),
                  tiers=(TierSpec("normal", 10),))
    return Workload(sc, (
        SimJob(1, "t", "normal", "gpu", 2, 1, 0, 100, estimates[0]),
        SimJob(2, "t", "normal", "gpu", 4, 1, 1, 100, estimates[1]),
        SimJob(3, "t", "normal", "gpu", 2, 1, 2, 50, estimates[2])), horizon=300)


def test_easy_backfill_plans_with_the_estimate_not_the_runtime() -> None:
    # C runs 50 s either way; whether it may start beside A depends only on what its
    # user asked: 60 s ends before B's shadow time (100), 600 s does not.
    short = run_baseline("easy", _one_node([100, 100, 60]))
    long = run_baseline("easy", _one_node([100, 100, 600]))
    assert short.records[2].attempts[0].start == 2
    assert long.records[2].attempts[0].start == 200
    # And the shadow time itself is A's estimated end: asked 300 s, B is reserved at
    # 300, so C (ends by 62) starts at once and B starts when A really ends.
    late = run_baseline("easy", _one_node([300, 100, 60]))
    assert [r.attempts[0].start for r in late.records] == [0, 100, 2]


def test_the_trace_loader_and_the_history_apply_the_model(trace_dir: Path) -> None:
    user = load_openb(trace_dir, rho=1.2, seed=11, limit=400)
    oracle = load_openb(trace_dir, rho=1.2, seed=11, limit=400,
                        estimate=EstimateModel.parse("oracle"))
    fixed = load_openb(trace_dir, rho=1.2, seed=11, limit=400,
                       estimate=EstimateModel.parse("fixed:24h"))
    assert user.source["estimate"] == "user:2-10"
    assert [j.runtime for j in user.jobs] == [j.runtime for j in oracle.jobs]
    uncapped = [j for j in user.jobs if j.runtime * 10 <= CAP]
    assert uncapped and all(2 * j.runtime <= j.estimate <= math.ceil(10 * j.runtime)
                            for j in uncapped)
    assert all(j.runtime <= j.estimate <= max(CAP, j.runtime) for j in user.jobs)
    assert all(j.estimate == 86400 for j in fixed.jobs)
    assert [j.estimate for j in user.jobs] != [j.estimate for j in oracle.jobs]
    # fairq is given the same figure as EASY (rule A9's max_runtime_seconds).
    assert all(estimate_seconds(j) == j.estimate for j in user.jobs)
    again = with_estimates(oracle.jobs, EstimateModel.parse("user:3"), seed=0)
    assert [j.estimate for j in again] == [min(3 * j.runtime, CAP) for j in oracle.jobs]


def test_the_cli_refuses_a_bad_estimate(capsys: pytest.CaptureFixture[str],
                                        trace_dir: Path) -> None:
    assert main(["--trace", str(trace_dir), "--estimate", "user:9-3", "--quiet"]) == 2
    assert "--estimate 'user:9-3': need 1 <= LO <= HI" in capsys.readouterr().err
