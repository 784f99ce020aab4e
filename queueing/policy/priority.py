"""Multifactor job priority (docs/scheduling.md, rule P1), like Slurm's priority/multifactor.

priority = Σ weight_i × factor_i, every factor in [0, 1]. The fair-share term is the only
one that depends on the team's standing, so the sum is additive: ordering code may keep
`total - weights.fair_share × fair_share` per job and add the team's current factor.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from .snapshot import QueuedJob


@dataclass(frozen=True, slots=True)
class PriorityWeights:
    fair_share: float = 10_000.0
    age: float = 1_000.0
    size: float = 0.0
    max_age_seconds: float = 7 * 24 * 3600.0


@dataclass(frozen=True, slots=True)
class PriorityBreakdown:
    """Each factor in [0, 1] and the weights that scale it (what `sprio` prints)."""

    fair_share: float
    age: float
    size: float
    weights: PriorityWeights

    @property
    def job_part(self) -> float:
        """The part of the total that does not depend on the team's standing."""
        w = self.weights
        return w.age * self.age + w.size * self.size

    @property
    def total(self) -> float:
        return self.weights.fair_share * self.fair_share + self.job_part


def job_priority(
    job: QueuedJob,
    *,
    now: datetime,
    fair_share_factor: float,
    weights: PriorityWeights,
    cluster_gpus: int,
) -> PriorityBreakdown:
    """Rule P1 for one queued job."""
    waited = max(0.0, (now - job.submitted_at).total_seconds())
    age = min(1.0, waited / weights.max_age_seconds) if weights.max_age_seconds > 0 else 0.0
    size = min(1.0, job.total_gpus / cluster_gpus) if cluster_gpus > 0 else 0.0
    return PriorityBreakdown(fair_share=fair_share_factor, age=age, size=size, weights=weights)
