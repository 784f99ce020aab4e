"""The cycle's bookkeeping rules as pure functions (queueing/policy/cycle.py): F2, F6,
R5, R6, A5/R8."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from queueing.policy.cycle import (
    Holding,
    Nomination,
    active_teams,
    nominated_preemptors,
    preemptions_in_window,
    requeue_victim,
    standings_running_and_penalty,
)
from queueing.policy.fairshare import Accumulator

NOW = datetime(2026, 1, 15, tzinfo=UTC)


def s(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def test_rule_f2_active_means_usage_or_work() -> None:
    assert active_teams(usage={"a": 1.0, "b": 0.0, "c": 0.0}, with_work=["c"]) == {"a", "c"}


def test_rule_f6_admitted_not_running_keeps_its_entry_penalty() -> None:
    running, penalty = standings_running_and_penalty(
        [Holding("a", 8, 2.0, None), Holding("a", 4, 1.0, s(-60)), Holding("b", 2, 1.0, s(60))],
        now=NOW, interval_seconds=3)
    assert running == {"a": [(4.0, s(-60))]}
    # 8 GPUs × 2.0 × 3 s; b's start is in the future: not running yet either.
    assert penalty == pytest.approx({"a": 8 * 2 * 3 / 3600, "b": 2 * 3 / 3600})


def test_rule_r5_counts_the_victims_of_the_window_per_preemptor_team() -> None:
    made = [(s(-700), "a"), (s(-599), "a"), (s(-10), "a"), (s(0), "b")]
    assert preemptions_in_window(made, now=NOW, window_seconds=600) == {"a": 2, "b": 1}


def test_rule_r8_victims_hold_their_gpus_for_the_grace_then_as_listed() -> None:
    noms = [Nomination(1, 0, s(-10), ("fq-7-0", "fq-8-0")),
            Nomination(2, 0, s(-100), ("fq-9-0", "fq-10-0")),
            Nomination(3, 0, s(-100), ("fq-11-0",)),       # its attempt moved on
            Nomination(4, 0, s(-1000), ("fq-12-0",))]      # past the nomination window
    got = nominated_preemptors(noms, now=NOW, queued_attempts={1: 0, 2: 0, 3: 1, 4: 0},
                               live_workloads={"fq-10-0"}, grace_seconds=30,
                               nomination_seconds=600)
    assert got == {1: 2, 2: 1}


def test_rule_r6_the_victim_keeps_its_submit_time_and_its_run_is_charged() -> None:
    acc = Accumulator(0.0, s(-3600))
    r = requeue_victim(attempt=2, submitted_at=s(-7200), started_at=s(-1800), now=NOW, gpus=4,
                       billing_weight=2.0, accumulator=acc, half_life_hours=168)
    assert r.attempt == 3 and r.submitted_at == s(-7200)
    assert r.charged_gpu_hours == pytest.approx(4 * 2.0 * 0.5)
    # Decayed over half an hour of a 168 h half-life: a hair below 4.
    assert r.accumulator is not None
    assert r.accumulator.as_of == NOW and 3.99 < r.accumulator.value < 4.0
    never = requeue_victim(attempt=0, submitted_at=s(-10), started_at=None, now=NOW, gpus=4,
                           billing_weight=1.0, accumulator=acc, half_life_hours=168)
    assert never.charged_gpu_hours == 0 and never.accumulator == acc


def test_rule_e2_the_placement_of_the_latest_nomination_whose_victims_still_hold_gpus() -> None:
    from queueing.policy.cycle import nominated_placements

    noms = [Nomination(1, 0, NOW - timedelta(seconds=9), ("fq-9-1",), ("n1", "n2")),
            Nomination(1, 0, NOW - timedelta(seconds=2), ("fq-8-1",), ("n3", "n3")),
            Nomination(2, 0, NOW - timedelta(seconds=2), ("fq-7-1",), ("n4",)),
            Nomination(3, 0, NOW - timedelta(seconds=2), ("fq-6-1",))]
    assert nominated_placements(noms, {1: 1, 2: 0, 3: 1}) == {1: ("n3", "n3")}
