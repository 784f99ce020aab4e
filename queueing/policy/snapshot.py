"""The immutable picture of the world a scheduling decision is made on."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from .bookings import Booking
from .dependencies import Counts, Dependency
from .fairshare import FairShareState
from .priority import PriorityWeights
from .settings import DEFAULTS, PreemptionPolicy


@dataclass(frozen=True, slots=True)
class NodeState:
    """A schedulable node: `free` GPUs of `gpu_type` out of `capacity`; `cpu_free`
    millicores and `memory_free` bytes of what it can allocate (rule A6; None = not known,
    no constraint); `topology` its domain per topology level (rule A7: level name ->
    domain; a level absent = the node is in no domain of it)."""

    name: str
    gpu_type: str
    capacity: int
    free: int
    cpu_free: int | None = None
    memory_free: int | None = None
    topology: Mapping[str, str] = field(default_factory=dict)
    # What it can allocate when empty (rule A4's "never fits"); None = not known.
    cpu_allocatable: int | None = None
    memory_allocatable: int | None = None
    # Rules K1-K6: the cluster it belongs to ("" = the only one) and whether it is spot
    # (interruptible) capacity.
    cluster: str = ""
    spot: bool = False
    # Rule C4: its `NodePool`'s name ("" = none); the plan does not read it, the cycle
    # records the pools a spot admission's nodes are in (`Job.spot_pools`).
    pool: str = ""
    # Shared GPUs (docs/scheduling.md, "Shared GPUs"): a node of a time-sliced or MPS
    # type counts `capacity` and `free` in slices, `slices_per_gpu` per GPU, and
    # `gpu_free` gives the free slices of each of its GPUs (index = the GPU's; len =
    # capacity // slices_per_gpu). slices_per_gpu = 1 and gpu_free = () everywhere else
    # (an exclusive GPU or a MIG instance is one unit; no per-GPU packing).
    slices_per_gpu: int = 1
    gpu_free: tuple[int, ...] = ()


class TopologyMode(StrEnum):
    """Rule A7: `required` = all replicas in one domain of the level or wait;
    `preferred` = as few domains as there is room for."""

    REQUIRED = "required"
    PREFERRED = "preferred"


@dataclass(frozen=True, slots=True)
class Topology:
    """A job's topology request (rule A7): its replicas packed by `level`."""

    level: str
    mode: TopologyMode = TopologyMode.REQUIRED


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


class FlavorFallback(StrEnum):
    """What a job accepting several GPU types does when its preferred type has room for
    it only by borrowing (Kueue's whenCanBorrow): `borrow` there first, or try the next
    type's nominal quota first (`next_type`)."""

    BORROW = "borrow"
    NEXT_TYPE = "next_type"


@dataclass(frozen=True, slots=True)
class QueuedJob:
    id: int
    team: str
    gpu_type: str
    gpus_per_replica: int
    replicas: int
    tier_rank: int
    submitted_at: datetime
    # Rule A6: per replica; None = not asked (fits anywhere the GPUs fit).
    cpu_millicores: int | None = None
    memory_bytes: int | None = None
    topology: Topology | None = None  # rule A7
    # When the current attempt entered the queue (a requeued victim: its preemption);
    # None = `submitted_at`. Rule R9 counts the wait from here.
    queued_at: datetime | None = None
    # Rules D1-D2: what it waits for (all must be met); rule A8: its array, if any.
    dependencies: tuple[Dependency, ...] = ()
    array_id: int | None = None
    # Rule A9: its runtime estimate (the job's `max_runtime_seconds`); None = unknown, so
    # it never counts as ending before a reservation.
    max_runtime_seconds: int | None = None
    # Rule K3: the clusters it may run in (its pin or cluster selector resolved by the
    # caller; None = any); rule K4: whether it may use spot nodes.
    clusters: frozenset[str] | None = None
    spot_ok: bool = False
    # Every GPU type it accepts, in order of preference (docs/scheduling.md, "Several GPU
    # types"); () = only `gpu_type`. When given, its first is `gpu_type`.
    gpu_types: tuple[str, ...] = ()
    # Shared GPUs: `gpus_per_replica` is in the units of its type - slices on a
    # time-sliced or MPS type (a fraction: fewer than the type's slices_per_gpu, on one
    # GPU; whole GPUs: a multiple of it, whole free GPUs), devices elsewhere. A job on a
    # slice-packed type accepts only that type.

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_replica * self.replicas

    @property
    def accepted_types(self) -> tuple[str, ...]:
        """The GPU types it may run on, most preferred first (never empty)."""
        return self.gpu_types or (self.gpu_type,)


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
    # Rule A6: per replica, given back to its nodes when it is removed (preemption).
    cpu_millicores: int | None = None
    memory_bytes: int | None = None
    # Rule R3: how many times the job was preempted before this attempt.
    preemptions: int = 0
    array_id: int | None = None  # rule A8
    # Rule A9: its runtime estimate; None = unknown (its GPUs never count as freed).
    max_runtime_seconds: int | None = None
    cluster: str = ""  # rule K1: where it runs ("" = the only cluster)
    # Rule R4: when the current attempt last reported a checkpoint (None: none yet); the
    # work a preemption loses is counted from it, not from the attempt's start.
    checkpointed_at: datetime | None = None
    # Its pods' termination grace in seconds (rules R8, R11: how long a preemptor waits
    # for it); None = the backend's default.
    grace_seconds: int | None = None
    # Shared GPUs (rule H1): its GPU indexes on its nodes, replica after replica (as
    # `nodes`; one per fraction, each whole GPU's on a packed type), so its slices go
    # back to those GPUs when it is removed (rule H6); () = another type.
    gpu_slots: tuple[int, ...] = ()

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_replica * self.replicas

    def estimated_end(self, now: datetime) -> datetime | None:
        """Rule A9: when its GPUs are expected free - the attempt's start (`now` while
        admitted, not started) plus its estimate, never before `now`; None when it has no
        estimate."""
        if self.max_runtime_seconds is None:
            return None
        start = self.started_at if self.started_at is not None else now
        return max(now, start + timedelta(seconds=self.max_runtime_seconds))

    def ran_seconds(self, now: datetime) -> float:
        """How long the current attempt has run (0 while admitted, not started)."""
        if self.started_at is None:
            return 0.0
        return max(0.0, (now - self.started_at).total_seconds())

    def lost_seconds(self, now: datetime) -> float:
        """Rule R4: how much of the current attempt a preemption at `now` throws away, in
        seconds - the time since its last checkpoint (`checkpointed_at`), or since its
        start when it reported none (0 while admitted, not started). A checkpoint older
        than the start (an earlier attempt's) does not count."""
        start = self.started_at
        if start is None:
            return 0.0
        ckpt = self.checkpointed_at
        if ckpt is not None and ckpt > start:
            start = ckpt
        return max(0.0, (now - start).total_seconds())


_PRE = DEFAULTS.preemption


@dataclass(frozen=True, slots=True)
class PreemptionSettings:
    """Rules R1-R5 as one plan sees them, with the product's defaults (policy/settings.py).
    `max_per_team` preemptions per preemptor team in the rate-limit window (None = no
    limit); `used` counts the ones already made in the window. `max_searches` bounds the
    victim searches of one plan so a long queue of jobs that cannot fit does not make a
    cycle slow. A job preempted `max_preemptions_per_job` times is no longer a victim
    (rule R3; None = no such protection)."""

    enabled: bool = _PRE.enabled
    max_per_team: int | None = _PRE.max_per_team
    used: Mapping[str, int] = field(default_factory=dict)
    max_searches: int = _PRE.max_searches
    max_preemptions_per_job: int | None = _PRE.max_preemptions_per_job
    lost_per_wait: float | None = _PRE.lost_per_wait
    # Rule E4: the rate-limit window and, per team, when each preemption counted in
    # `used` was made (oldest first); empty = not known (no "until" is said).
    window_seconds: float = _PRE.window_seconds
    made_at: Mapping[str, tuple[datetime, ...]] = field(default_factory=dict)
    # Per tier rank, how eager the tier is to preempt: its own rule-R9 ratio (a rank
    # absent: `lost_per_wait`; None: no R9 check for that tier) ...
    lost_per_wait_by_tier: Mapping[int, float | None] = field(default_factory=dict)
    # ... and the ranks whose owed claims (rule R11) do NOT preempt at once but wait by
    # the ordinary rules, R9 included (empty: every tier's owed claims preempt at once).
    owed_waits_tiers: frozenset[int] = frozenset()

    @classmethod
    def of(cls, policy: PreemptionPolicy, *, used: Mapping[str, int],
           made_at: Mapping[str, tuple[datetime, ...]] | None = None,
           lost_per_wait_by_tier: Mapping[int, float | None] | None = None,
           owed_waits_tiers: frozenset[int] = frozenset()) -> PreemptionSettings:
        """The settings of one plan: `policy` with the counts of the current window (and
        when each was made, for rule E4), and the tiers' own R9 ratios and the tiers
        whose owed claims wait (rule R11), as the caller read them from the tiers."""
        return cls(enabled=policy.enabled, max_per_team=policy.max_per_team, used=used,
                   max_searches=policy.max_searches,
                   max_preemptions_per_job=policy.max_preemptions_per_job,
                   lost_per_wait=policy.lost_per_wait, window_seconds=policy.window_seconds,
                   made_at=made_at or {},
                   lost_per_wait_by_tier=lost_per_wait_by_tier or {},
                   owed_waits_tiers=owed_waits_tiers)

    def lost_per_wait_of(self, tier_rank: int) -> float | None:
        """Rule R9's ratio for a preemptor of `tier_rank`: its tier's own when it has one
        (None: no R9 check for the tier), else `lost_per_wait`."""
        by_tier = self.lost_per_wait_by_tier
        if not by_tier:
            return self.lost_per_wait
        return by_tier.get(tier_rank, self.lost_per_wait)

    def left(self, team: str) -> int | None:
        if self.max_per_team is None:
            return None
        return max(0, self.max_per_team - self.used.get(team, 0))

    def free_again_at(self, team: str, *, needed: int, made_in_pass: int,
                      now: datetime) -> datetime | None:
        """Rule E4: when `team` may make `needed` more preemptions, the `made_in_pass`
        ones of this plan counted too (they leave the window at `now` + window): the
        instant enough of its preemptions have left the window. None when there is no
        limit, it may already, or the instants are not known."""
        if self.max_per_team is None or needed > self.max_per_team:
            return None
        made = sorted(self.made_at.get(team, ()))
        must_leave = self.used.get(team, 0) + made_in_pass + needed - self.max_per_team
        if must_leave <= 0 or (not made and made_in_pass == 0):
            return None
        window = timedelta(seconds=self.window_seconds)
        if must_leave <= len(made):
            return made[must_leave - 1] + window
        return now + window


@dataclass(frozen=True, slots=True)
class Snapshot:
    now: datetime
    nodes: tuple[NodeState, ...]
    queued: tuple[QueuedJob, ...]
    running: tuple[RunningJob, ...] = ()
    quotas: Mapping[tuple[str, str], QuotaLimit] = field(default_factory=dict)
    # Fair-share factor F per team (rule F3) at snapshot time; teams absent count as 1.0.
    # Used for ordering only when `fair_share_state` is None (static factors, no F6).
    fair_share: Mapping[str, float] = field(default_factory=dict)
    # The live standings (rules F3, F6): the plan works on a copy and charges each
    # admission's entry penalty, so a team's later jobs see its new factor (rule O1).
    fair_share_state: FairShareState | None = None
    # Rule P1 weights; None = the defaults of `PriorityWeights`.
    priority_weights: PriorityWeights | None = None
    # Billing weight per GPU type (rule F1); absent types weigh 1.0.
    billing_weights: Mapping[str, float] = field(default_factory=dict)
    # The recompute interval of the entry penalty (rule F6), seconds; 0 = no penalty.
    interval_seconds: float = DEFAULTS.interval_seconds
    # Rules A5, R8: queued jobs that preempted in an earlier cycle and are not admitted yet,
    # with how many of their victims' workloads still hold GPUs in the cluster.
    nominated: Mapping[int, int] = field(default_factory=dict)
    # Rule E2: for those whose victims may still hold GPUs, the placement their preemption
    # planned (one node per replica); the plan holds what is free of it for them.
    nominated_placement: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    preemption: PreemptionSettings = field(default_factory=PreemptionSettings)
    # Rules D1-D2: the states of every job or array a queued job depends on
    # (("job", id) or ("array", id) -> count per state; absent = no such job).
    dependency_counts: Mapping[tuple[str, int], Counts] = field(default_factory=dict)
    # Rule A8: the concurrency limit of each array that has one.
    array_limits: Mapping[int, int] = field(default_factory=dict)
    # Rule A9: the first job waiting for capacity reserves GPUs at its shadow time.
    reservation: bool = DEFAULTS.reservation
    # Rule K2: each cluster's cost rank (lower first); a cluster absent ranks 0.
    cluster_ranks: Mapping[str, int] = field(default_factory=dict)
    # Rule K8: the clusters that take no new work (disabled; draining while jobs still
    # run there). Their nodes are offered to no queued job (`open_nodes`) and a job whose
    # clusters are all closed waits saying so; their running jobs are the snapshot's
    # like any other (they hold their quota and fair share).
    closed_clusters: frozenset[str] = frozenset()
    # Jobs accepting several GPU types (docs/scheduling.md, "Several GPU types"): per
    # (team, tier rank), whether a preferred type is borrowed in before the next type is
    # tried; absent = `flavor_fallback_default`. The caller resolves team over tier.
    flavor_fallback: Mapping[tuple[str, int], FlavorFallback] = field(default_factory=dict)
    flavor_fallback_default: FlavorFallback = FlavorFallback.BORROW

    def fallback(self, team: str, tier_rank: int) -> FlavorFallback:
        return self.flavor_fallback.get((team, tier_rank), self.flavor_fallback_default)

    def quota(self, team: str, gpu_type: str) -> QuotaLimit:
        return self.quotas.get((team, gpu_type), NO_QUOTA)

    def open_nodes(self) -> tuple[NodeState, ...]:
        """Rule K8: the nodes a queued job may be placed on - every node but those of a
        closed cluster (the plan's capacity, rule P1's cluster size)."""
        closed = self.closed_clusters
        if not closed:
            return self.nodes
        return tuple(n for n in self.nodes if n.cluster not in closed)

    # Shared GPUs: per GPU type, how many of its units make one GPU (its
    # slices_per_gpu; a type absent: 1). Quotas, running and queued jobs and nodes are
    # in units; what is said or charged in GPUs divides by this.
    units_per_gpu: Mapping[str, int] = field(default_factory=dict)
    # Quotas in a tree (docs/scheduling.md, "Quotas in a tree"): each team's parent
    # (its department), None or absent = top level. The same forest as rule F4's; a
    # department is a team, and its quota rows in `quotas` are its subtree's nominal.
    team_parent: Mapping[str, str | None] = field(default_factory=dict)
    # Booked GPUs (docs/scheduling.md, "Booked GPUs"): the occurrences of reservations
    # that end after `now` and start before now + the booking horizon, by start.
    bookings: tuple[Booking, ...] = ()
    # Rule W4: the tier ranks whose jobs may run on another team's unused booked GPUs
    # (the preemptible tiers; the caller reads them from the tiers). Empty: none.
    lend_tiers: frozenset[int] = frozenset()

    def billing_weight(self, gpu_type: str) -> float:
        return self.billing_weights.get(gpu_type, 1.0)

    def gpus_of(self, gpu_type: str, units: float) -> float:
        """`units` of `gpu_type` in GPU-equivalents (shared GPUs)."""
        return units / self.units_per_gpu.get(gpu_type, 1)
