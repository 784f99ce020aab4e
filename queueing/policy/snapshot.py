"""The immutable picture of the world a scheduling decision is made on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, slots=True)
class NodeState:
    """A schedulable node: `free` GPUs of `gpu_type` out of `capacity`."""

    name: str
    gpu_type: str
    capacity: int
    free: int


@dataclass(frozen=True, slots=True)
class QuotaLimit:
    """Rule Q1: nominal GPUs guaranteed; borrowing beyond them up to a limit (None = no
    limit); lending: how much of the unused nominal others may borrow (None = all)."""

    nominal: int
    borrowing_limit: int | None = None
    lending_limit: int | None = None

    @property
    def ceiling(self) -> int | None:
        """The most GPUs the team may hold of this type (None = no ceiling)."""
        if self.borrowing_limit is None:
            return None
        return self.nominal + self.borrowing_limit


# A team with no quota row for a GPU type is guaranteed nothing but may borrow idle GPUs.
NO_QUOTA = QuotaLimit(nominal=0, borrowing_limit=None, lending_limit=None)


@dataclass(frozen=True, slots=True)
class QueuedJob:
    id: int
    team: str
    gpu_type: str
    gpus_per_replica: int
    replicas: int
    tier_rank: int
    submitted_at: datetime

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_replica * self.replicas


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs (admitted or running)."""

    id: int
    team: str
    gpu_type: str
    gpus_per_replica: int
    replicas: int
    tier_rank: int
    preemptible: bool = True
    started_at: datetime | None = None
    min_runtime_seconds: int = 0
    nodes: tuple[str, ...] = ()

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_replica * self.replicas


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: datetime
    nodes: tuple[NodeState, ...]
    queued: tuple[QueuedJob, ...]
    running: tuple[RunningJob, ...] = ()
    quotas: Mapping[tuple[str, str], QuotaLimit] = field(default_factory=dict)
    # Fair-share factor F per team (rule F3); teams absent count as 1.0 (no usage).
    fair_share: Mapping[str, float] = field(default_factory=dict)

    def quota(self, team: str, gpu_type: str) -> QuotaLimit:
        return self.quotas.get((team, gpu_type), NO_QUOTA)
