"""What a simulation runs on (docs/simulator.md): a scenario (cluster, teams, tiers,
quotas, settings) and a workload (jobs with submit times and true runtimes), and what
each policy's run gives back (one record per job). Plain frozen dataclasses; times are
seconds from the start of the simulation."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from queueing.policy.settings import PolicySettings
from queueing.policy.snapshot import QuotaLimit


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """A node; with `clusters:` in the scenario, of a cluster (rules K1-K7), spot or not,
    a spot node interrupted `interruptions_per_hour` times an hour on average (a Poisson
    process) and replaced `replacement_seconds` later."""

    name: str
    gpu_type: str
    gpus: int
    cluster: str = ""
    spot: bool = False
    interruptions_per_hour: float = 0.0
    replacement_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A cluster of the scenario: rule K2's `cost_rank` (lower first) and its labels."""

    name: str
    cost_rank: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TeamSpec:
    name: str
    weight: float
    parent: str | None = None


@dataclass(frozen=True, slots=True)
class TierSpec:
    """A tier: higher `rank` first; `preemptible` False never a victim (rule R3), nor one
    that has run less than `min_runtime_seconds`."""

    name: str
    rank: int
    preemptible: bool = True
    min_runtime_seconds: int = 0


@dataclass(frozen=True, slots=True)
class Scenario:
    nodes: tuple[NodeSpec, ...]
    teams: tuple[TeamSpec, ...]
    tiers: tuple[TierSpec, ...]
    # (team, GPU type) -> quota (rule Q1); absent: nominal 0, borrowing unlimited.
    quotas: Mapping[tuple[str, str], QuotaLimit] = field(default_factory=dict)
    settings: PolicySettings = field(default_factory=PolicySettings)
    # Rules K1-K7: the clusters (none: one implicit cluster, "") and the seed of the spot
    # interruptions.
    clusters: tuple[ClusterSpec, ...] = ()
    seed: int = 0

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def tier(self, name: str) -> TierSpec:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job of the workload. `runtime` is how long it runs once started (it loses its
    run when preempted and starts over); `estimate` the runtime a backfilling scheduler
    is told (max_runtime_seconds), never below `runtime`. `gpu_types`: every GPU type it
    accepts, in order of preference (() = only `gpu_type`; when given, its first is
    `gpu_type`), as `QueuedJob.gpu_types`."""

    id: int
    team: str
    tier: str
    gpu_type: str
    gpus_per_replica: int
    replicas: int
    submit: float
    runtime: float
    estimate: float
    cluster: str | None = None  # rule K3: its pin (None = any cluster)
    allow_spot: bool = False  # rule K4: spot nodes for a non-preemptible tier too
    gpu_types: tuple[str, ...] = ()

    @property
    def gpus(self) -> int:
        return self.gpus_per_replica * self.replicas

    @property
    def accepted_types(self) -> tuple[str, ...]:
        """The GPU types it may run on, most preferred first (never empty)."""
        return self.gpu_types or (self.gpu_type,)


@dataclass(frozen=True, slots=True)
class Workload:
    scenario: Scenario
    jobs: tuple[SimJob, ...]
    # The measuring window [0, horizon] (delivered GPU-hours count inside it).
    horizon: float
    source: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Attempt:
    """One run of a job: `preempted` (rule R6) or `reclaimed` (its spot node was
    interrupted, rule K6) ends it early and requeues the job; `cluster` where it ran,
    `gpu_type` on which of its accepted GPU types ("" = not recorded; not compared)."""

    start: float
    end: float
    preempted: bool
    reclaimed: bool = False
    cluster: str = ""
    gpu_type: str = field(default="", compare=False)

    @property
    def requeued(self) -> bool:
        return self.preempted or self.reclaimed


@dataclass(frozen=True, slots=True)
class JobRecord:
    """What happened to one job in one policy's run: its attempts in order; `finished`
    is the end of the attempt that completed (None if the run stopped first)."""

    job: SimJob
    attempts: tuple[Attempt, ...]
    finished: float | None

    @property
    def preemptions(self) -> int:
        return sum(1 for a in self.attempts if a.preempted)


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    records: tuple[JobRecord, ...]
    cycles: int
    end: float
    seconds: float
    # Rule K6: spot node interruptions during the run (fairq's loop only).
    interruptions: int = 0
