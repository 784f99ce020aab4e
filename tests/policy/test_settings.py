"""One settings object with one set of defaults: the policy's
dataclasses carry the product's defaults, and every reader of them agrees."""

from __future__ import annotations

from datetime import UTC, datetime

from queueing.policy.settings import DEFAULTS, PolicySettings, PreemptionPolicy
from queueing.policy.snapshot import PreemptionSettings, Snapshot


def test_the_defaults_are_the_products() -> None:
    assert PolicySettings() == DEFAULTS
    assert DEFAULTS.preemption.max_per_team == 20
    assert DEFAULTS.preemption.window_seconds == 600
    assert DEFAULTS.interval_seconds == DEFAULTS.cycle_seconds == 3.0
    # Rule R9's ratio: docs/simulator.md, "The goals in conflict".
    assert DEFAULTS.preemption.lost_per_wait == 0.4


def test_a_plans_preemption_settings_default_to_the_policy() -> None:
    pre = PreemptionSettings()
    d = DEFAULTS.preemption
    assert (pre.enabled, pre.max_per_team, pre.max_searches, pre.max_preemptions_per_job) == (
        d.enabled, d.max_per_team, d.max_searches, d.max_preemptions_per_job)
    assert pre.left("a") == 20
    assert PreemptionSettings.of(d, used={"a": 5}).left("a") == 15
    assert PreemptionSettings.of(PreemptionPolicy(max_per_team=None), used={}).left("a") is None


def test_a_snapshot_charges_the_default_entry_penalty_interval() -> None:
    snap = Snapshot(now=datetime(2026, 1, 1, tzinfo=UTC), nodes=(), queued=())
    assert snap.interval_seconds == DEFAULTS.interval_seconds
    assert snap.preemption == PreemptionSettings()
