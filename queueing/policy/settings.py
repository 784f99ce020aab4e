"""The policy's settings, with the product's defaults (docs/scheduling.md).

One object for every caller that runs cycles: the scheduler service builds it from the
Django settings (`FAIRQ_*`, which only override these defaults: config/settings/policy.py
reads its defaults from `DEFAULTS`), the trace simulator from a scenario's sections
(queueing/simulator/scenario.py). Pure: no Django, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .priority import PriorityWeights


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    """Rules R1-R8: on or off; at most `max_per_team` preemptions per preemptor team per
    `window_seconds` (R5; None = no limit); the termination grace and the nomination
    (A5, R8); at most `max_searches` victim searches per pass (R4); a job already
    preempted `max_preemptions_per_job` times is no longer a victim (R3; None = no such
    protection); a preemption is made only when its victims lose at most
    `lost_per_wait` GPU-seconds per GPU-second its preemptor has waited (R9; None = no
    such check). The default ratio 0.4 is the largest of those measured that keeps the
    GPU-hours lost to preemption ≤ 1 % of delivered and delivered ≥ 99 % of greedy
    backfill's on all nine openb replays (docs/simulator.md, "The goals in
    conflict")."""

    enabled: bool = True
    max_per_team: int | None = 20
    window_seconds: float = 600.0
    termination_grace_seconds: float = 30.0
    nomination_seconds: float = 600.0
    max_searches: int = 32
    max_preemptions_per_job: int | None = 3
    lost_per_wait: float | None = 0.4


@dataclass(frozen=True, slots=True)
class PolicySettings:
    """The policy's knobs: half-life H (rule F1), the entry penalty's recompute interval
    (F6; the product uses the cycle interval), the cycle interval (a preemptor is admitted
    by the cycle after the one that preempted, R8), priority weights (P1), billing weights
    per GPU type (F1; absent = 1.0), preemption (R1-R9) and the backfill reservation (A9:
    off, smaller jobs start wherever they fit)."""

    half_life_hours: float = 168.0
    interval_seconds: float = 3.0
    cycle_seconds: float = 3.0
    priority: PriorityWeights = field(default_factory=PriorityWeights)
    billing_weights: Mapping[str, float] = field(default_factory=dict)
    preemption: PreemptionPolicy = field(default_factory=PreemptionPolicy)
    reservation: bool = True


# The product's defaults, read by config/settings/policy.py for every FAIRQ_* it maps.
DEFAULTS = PolicySettings()
