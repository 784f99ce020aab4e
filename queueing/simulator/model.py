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
    that has run less than `min_runtime_seconds`; its victims hold their GPUs for
    `grace_seconds` after a preemption."""

    name: str
    rank: int
    preemptible: bool = True
    min_runtime_seconds: int = 0
    # A victim's termination grace (rule R10): how long it keeps its GPUs after the
    # preemption; None = the preemption settings' `termination_grace_seconds`.
    grace_seconds: float | None = None
    # Rule R9's ratio for its preemptors (None = the settings' `lost_per_wait`; -1 = no
    # R9 check), and whether its owed claims preempt at once (rule R11).
    lost_per_wait: float | None = None
    owed_preempts_at_once: bool = True


@dataclass(frozen=True, slots=True)
class BookingSpec:
    """A booking of the scenario (docs/simulator.md, "Quotas in a tree and bookings"):
    `gpus` of `gpu_type` for `team` from `start` seconds for `duration` seconds, repeated
    by the RFC 5545 rule `recurrence` ("" = once) in the wall-clock time of `timezone`;
    `lend`: its unused GPUs may run other teams' preemptible jobs (rule W4)."""

    team: str
    gpu_type: str
    gpus: int
    start: float
    duration: float
    recurrence: str = ""
    timezone: str = "UTC"
    lend: bool = True


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
    # How long a checkpointing job's save on the stop signal takes: it saves when its
    # grace is at least this (docs/simulator.md, "Checkpoints, grace and owed claims").
    save_seconds: float = 0.0
    # Shared GPUs (docs/simulator.md, "Fractional GPUs"): the time-sliced GPU types and
    # their slices per GPU S (a type absent: exclusive, whole GPUs). Nodes and quotas
    # stay in GPUs; the policy sees a time-sliced type in slices (S per GPU).
    slices: Mapping[str, int] = field(default_factory=dict)
    # Booked GPUs (docs/scheduling.md, "Booked GPUs"): the reservations, each expanded
    # into its occurrences within the measuring window by the engine.
    bookings: tuple[BookingSpec, ...] = ()

    @property
    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes)

    def slices_per_gpu(self, gpu_type: str) -> int:
        """S of a time-sliced type; 1 for an exclusive one (its unit is the GPU)."""
        return self.slices.get(gpu_type, 1)

    def tier(self, name: str) -> TierSpec:
        for t in self.tiers:
            if t.name == name:
                return t
        raise KeyError(name)

    def grace(self, tier: str) -> float:
        """Seconds a victim of `tier` keeps its GPUs after its preemption."""
        g = self.tier(tier).grace_seconds
        return self.settings.preemption.termination_grace_seconds if g is None else g


@dataclass(frozen=True, slots=True)
class SimJob:
    """One job of the workload. `runtime` is how long it runs once started (preempted, it
    resumes from its last saved checkpoint, or starts over without one); `estimate` the
    runtime a backfilling scheduler is told (max_runtime_seconds), never below `runtime`.
    `gpu_types`: every GPU type it accepts, in order of preference (() = only
    `gpu_type`; when given, its first is `gpu_type`), as `QueuedJob.gpu_types`.
    `checkpoint_interval`: it checkpoints every so many seconds of an attempt (what its
    user declares; None = never).

    Shared GPUs (docs/simulator.md, "Fractional GPUs"): on a time-sliced type of
    `slices_per_gpu` S, `gpu_slices` k >= 1 asks k slices of ONE GPU per replica (a
    fraction k / S, k < S; `gpus_per_replica` is then 1); 0 asks `gpus_per_replica`
    whole GPUs (S slices each). `asked`: per replica, the fraction of a GPU the task
    itself asked (the trace's gpu_milli / 1000) when it asked less than a whole GPU,
    kept when the job is made to take whole GPUs; None = it asked what it holds."""

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
    checkpoint_interval: float | None = None
    gpu_slices: int = 0
    slices_per_gpu: int = 1
    asked: float | None = None

    @property
    def gpus(self) -> int:
        """Devices it holds (a fraction: the one GPU its slices are on, per replica)."""
        return self.gpus_per_replica * self.replicas

    @property
    def units_per_replica(self) -> int:
        """Per replica, in its type's units as the policy counts them: its slices when a
        fraction, else its GPUs x S (S = 1 on an exclusive type)."""
        return self.gpu_slices or self.gpus_per_replica * self.slices_per_gpu

    @property
    def share(self) -> float:
        """GPU-equivalents it holds while running (fair share, charging, delivered
        GPU-hours): k / S per replica for a fraction, else its GPUs."""
        if self.gpu_slices:
            return self.gpu_slices * self.replicas / self.slices_per_gpu
        return float(self.gpus)

    @property
    def useful(self) -> float:
        """GPU-equivalents of what it asked (`asked` x replicas when it asked a fraction,
        else `share`): held minus useful is what rounding or a whole GPU wastes."""
        if self.asked is None:
            return self.share
        return self.asked * self.replicas

    @property
    def size(self) -> str:
        """Its size as the reports group it: the GPU-equivalents, "0.25" for a quarter."""
        return f"{self.share:g}"

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
    `gpu_type` on which of its accepted GPU types ("" = not recorded; not compared).
    A requeued attempt's work up to `saved` is kept (its last checkpoint, or the save on
    the stop signal; None = nothing: lost from `start`), and it held its GPUs until
    `released` (the end of its grace; None = at `end`). Neither is compared."""

    start: float
    end: float
    preempted: bool
    reclaimed: bool = False
    cluster: str = ""
    gpu_type: str = field(default="", compare=False)
    saved: float | None = field(default=None, compare=False)
    released: float | None = field(default=None, compare=False)

    @property
    def requeued(self) -> bool:
        return self.preempted or self.reclaimed

    @property
    def kept_until(self) -> float:
        """Up to when the attempt's work counts: its end, or for a requeued attempt its
        last save (its start when none)."""
        if not self.requeued:
            return self.end
        return self.start if self.saved is None else max(self.start, min(self.saved, self.end))

    @property
    def held_until(self) -> float:
        return self.end if self.released is None else max(self.end, self.released)


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
    # Rule R11: the jobs owed their GPUs when submitted (`owed_claim` on the snapshot of
    # their first cycle; fairq's loop only) ...
    owed: frozenset[int] = frozenset()
    # ... and the victim grace the owed goal allows ("owed p95 <= 1 min + grace").
    grace_seconds: float = 0.0
