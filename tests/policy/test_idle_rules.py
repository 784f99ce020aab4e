"""Rules U1-U4 (docs/scheduling.md, "Idle GPUs"), table-driven, no database."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest

from queueing.policy.idle import (
    IdleRule,
    IdleState,
    Verdict,
    idle_step,
    percentile_from_histogram,
)

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
REQUEUE = IdleRule(threshold_percent=5, window_minutes=10, action="requeue", grace_minutes=5)


def run(readings: Sequence[float | None], rule: IdleRule = REQUEUE) -> list[Verdict]:
    """One reading a minute from T0 (None: no reading that minute)."""
    state, out = IdleState(), []
    for i, sm in enumerate(readings):
        if sm is None:
            out.append(Verdict.NONE)
            continue
        state, verdict = idle_step(state, minute=T0 + timedelta(minutes=i), sm_percent=sm,
                                   rule=rule)
        out.append(verdict)
    return out


def test_rule_U2_flags_once_the_run_below_lasts_the_window() -> None:
    verdicts = run([2.0] * 12, IdleRule(5, 10, "flag", 5))
    assert verdicts.index(Verdict.FLAG) == 10  # minute 10: 10 minutes after the first
    assert verdicts.count(Verdict.FLAG) == 1


def test_rule_U1_a_busy_minute_restarts_the_run() -> None:
    verdicts = run([2.0] * 9 + [50.0] + [2.0] * 10)
    assert Verdict.FLAG not in verdicts
    assert run([2.0] * 9 + [50.0] + [2.0] * 11)[-1] == Verdict.FLAG


def test_rule_U1_no_data_is_not_idle_a_gap_restarts_the_run() -> None:
    verdicts = run([2.0] * 6 + [None] * 3 + [2.0] * 8)
    assert Verdict.FLAG not in verdicts  # 6 + 8 minutes below, but not one run


def test_rule_U1_a_threshold_of_zero_turns_the_rule_off() -> None:
    assert set(run([0.0] * 60, IdleRule(0, 1, "fail", 0))) == {Verdict.NONE}


@pytest.mark.parametrize(("action", "expected"), [
    ("requeue", Verdict.REQUEUE), ("fail", Verdict.FAIL), ("flag", None)])
def test_rule_U3_reclaims_after_the_grace_only_when_the_tier_says_so(
        action: str, expected: Verdict | None) -> None:
    verdicts = run([1.0] * 20, IdleRule(5, 10, action, 5))
    assert verdicts[10] == Verdict.FLAG
    assert verdicts[11:15] == [Verdict.NONE] * 4
    if expected is None:
        assert set(verdicts[15:]) == {Verdict.NONE}
    else:
        assert verdicts[15] == expected


def test_rule_U4_a_flagged_job_busy_again_is_cleared_and_needs_a_whole_window_again() -> None:
    verdicts = run([1.0] * 12 + [80.0] + [1.0] * 11)
    assert verdicts[10] == Verdict.FLAG and verdicts[12] == Verdict.BUSY_AGAIN
    assert Verdict.REQUEUE not in verdicts[12:]  # the grace runs from a new flag
    assert verdicts[23] == Verdict.FLAG


def test_rule_U5_p95_from_the_per_percent_histogram() -> None:
    hist = {str(sm): 1 for sm in range(100)}
    assert percentile_from_histogram(hist, 0.95) == 94.0
    assert percentile_from_histogram({}, 0.95) == 0.0
    assert percentile_from_histogram({"3": 7}, 0.95) == 3.0
    assert percentile_from_histogram({"90": 5, "2": 95}, 0.95) == 2.0
    assert percentile_from_histogram({"90": 6, "2": 94}, 0.95) == 90.0
