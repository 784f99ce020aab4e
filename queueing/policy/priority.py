"""Multifactor job priority (docs/scheduling.md, rule P1), like Slurm's
priority/multifactor, and its breakdown per factor (rule P3).

priority = Σ weight_i × factor_i, every factor in [0, 1]. The fair-share term is the only
one that depends on the team's standing, so the sum is additive: the queue order (rules
P2 and O1, `stages/heads.py::QueueOrder`, the only implementation of the order) keeps
`job_part` per job and adds `weights.fair_share × F` with the team's current factor.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # snapshot.py imports this module (through settings.py) at run time
    from .snapshot import QueuedJob


@dataclass(frozen=True, slots=True)
class PriorityWeights:
    """Rule P1: the weight of each factor, and the knobs of the age and size factors."""

    fair_share: float = 10_000.0
    age: float = 1_000.0
    size: float = 0.0
    max_age_seconds: float = 7 * 24 * 3600.0
    # Rule P1, size: False favours large gangs (share of the cluster), True small jobs.
    favor_small: bool = False


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

    def as_dict(self) -> dict[str, object]:
        """Factor, weight and weighted term per factor, and the total (rule P1)."""
        w = self.weights
        return {
            "total": self.total,
            "factors": {
                "fair_share": {"factor": self.fair_share, "weight": w.fair_share,
                               "value": w.fair_share * self.fair_share},
                "age": {"factor": self.age, "weight": w.age, "value": w.age * self.age},
                "size": {"factor": self.size, "weight": w.size, "value": w.size * self.size},
            },
        }


def age_factor(*, submitted_at: datetime, now: datetime, max_age_seconds: float) -> float:
    """Rule P1, age: time queued / max age, capped at 1 (0 when max age is 0)."""
    if max_age_seconds <= 0:
        return 0.0
    # Conditionals, not min()/max(): the admission pass calls this once per queued job.
    waited = (now - submitted_at).total_seconds()
    age = (waited if waited > 0.0 else 0.0) / max_age_seconds
    return age if age < 1.0 else 1.0


def size_factor(*, total_gpus: float, cluster_gpus: float,
                favor_small: bool = False) -> float:
    """Rule P1, size: the job's share of the cluster's GPUs (capped at 1), or one minus
    it when small jobs are favoured; 0 for an empty cluster."""
    if cluster_gpus <= 0:
        return 0.0
    frac = min(1.0, max(0, total_gpus) / cluster_gpus)
    return 1.0 - frac if favor_small else frac


def job_priority(
    job: QueuedJob,
    *,
    now: datetime,
    fair_share_factor: float,
    weights: PriorityWeights,
    cluster_gpus: float,
    units_per_gpu: int = 1,
) -> PriorityBreakdown:
    """Rule P1 for one queued job: each factor in [0, 1] (the fair-share factor F of the
    job's team is clamped into it)."""
    return PriorityBreakdown(
        fair_share=min(1.0, max(0.0, fair_share_factor)),
        age=age_factor(submitted_at=job.submitted_at, now=now,
                       max_age_seconds=weights.max_age_seconds),
        size=size_factor(total_gpus=job.total_gpus / units_per_gpu, cluster_gpus=cluster_gpus,
                         favor_small=weights.favor_small),
        weights=weights,
    )
