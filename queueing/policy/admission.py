"""Ordering, admission and preemption on a snapshot (docs/scheduling.md, rules Q1, O1,
A1-A9, R1-R9, Q2, D1-D2, and K1-K4, K7, K8 across clusters and spot nodes)."""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Protocol

from .dependencies import Verdict, array_limit_reached, dependencies_verdict
from .fairshare import entry_penalty_gpu_hours
from .preemption import Preemption, find_victims, work_lost_gpu_hours
from .priority import PriorityWeights, size_factor
from .snapshot import QueuedJob, RunningJob, Snapshot, Topology, TopologyMode
from .workspace import Capacity, Workspace

__all__ = [
    "Admission", "Capacity", "Plan", "Preemption", "Topology", "TopologyMode", "Wait",
    "WaitReason", "plan_admissions",
]


class WaitReason(StrEnum):
    QUOTA = "quota"
    CAPACITY = "capacity"
    NO_FIT = "gang_does_not_fit"
    LENDING = "lending_limit"
    PREEMPTING = "preempting"
    RATE_LIMITED = "preemption_rate_limited"
    CPU_MEMORY = "cpu_memory"  # rule A6: the GPUs are free, CPU or memory beside them not
    TOPOLOGY = "topology"  # rule A7: no domain of the level holds the gang now
    DEPENDENCY = "dependency"  # rule D1: a job or array it depends on has not ended so
    DEPENDENCY_NEVER = "dependency_never_met"  # rule D2: the cycle fails it
    ARRAY_LIMIT = "array_limit"  # rule A8: its array's concurrency limit is reached
    # Rule E2: it would fit on GPUs this pass holds for a preemptor (rule A5).
    HELD_FOR_PREEMPTOR = "held_for_preemptor"
    # Rule E6: more GPUs than its team may ever hold (a quota lowered after the submit).
    NEVER_FITS = "never_fits"
    RESERVED = "reserved"  # rule A9: it fits, but on GPUs reserved for an earlier job
    # Rule K3: no cluster it may use can hold it (or has room now, while one it may not
    # use has).
    CLUSTER = "cluster"


@dataclass(frozen=True, slots=True)
class Admission:
    job_id: int
    team: str
    gpu_type: str
    # One node name per replica, in replica order (rule A3).
    placement: tuple[str, ...]
    cluster: str = ""  # rule K1: the one cluster of its nodes ("" = the only cluster)
    spot: bool = False  # rules K1, K4, C4: its nodes are spot nodes (all or none)


@dataclass(frozen=True, slots=True)
class Wait:
    job_id: int
    reason: WaitReason
    message: str
    until: datetime | None = None  # rule E4: when the wait ends, when the plan knows it


@dataclass(frozen=True, slots=True)
class Plan:
    admissions: tuple[Admission, ...]
    waits: Mapping[int, Wait]
    # Rules R1-R8: victims to preempt now; each preemptor is admitted in a later cycle.
    preemptions: tuple[Preemption, ...] = ()
    # Every queued job id in the order the pass considered it (rule O1): queue position.
    order: tuple[int, ...] = ()
    # Rule F6: the standings after every admission's entry penalty.
    fair_share_after: Mapping[str, float] = field(default_factory=dict)
    # Rule D2: queued jobs whose dependencies can never be met -> why; the cycle fails them.
    never_met: Mapping[int, str] = field(default_factory=dict)
    # Rule A9: per GPU type, the job holding the pass's reservation and its shadow time.
    reservations: Mapping[str, tuple[int, datetime]] = field(default_factory=dict)

    def wait_causes(self) -> Iterator[tuple[int, str]]:
        """Every waiting job with its *wait cause*: its reason's code, and for a
        `capacity` wait what became of its preemption search (`capacity:not_worth_it`,
        rule R9 refused the victims found; `capacity:protected`, the search found none and
        some candidates are protected by rule R3's minimum runtime; `capacity:no_victim`,
        the search found no victim set; `capacity:no_search`, no search ran: preemption
        off or this pass's R4 search budget spent). No message is formatted: the
        simulator's wait-cause report reads it every cycle (docs/simulator.md)."""
        waits = self.waits
        if isinstance(waits, _Waits):
            yield from waits.causes()
        else:
            for job_id, w in waits.items():
                yield job_id, w.reason.value


# A wait not formatted yet: (reason code, index of the job in `_Waits.jobs`, GPUs held,
# ceiling). Only ints, so the garbage collector stops tracking the tuple at once (a long
# queue makes ~100,000 of them; tuples holding a job would make every collection slower).
_Raw = tuple[int, int, int, int]
_REASONS: tuple[WaitReason, ...] = tuple(WaitReason)
_CODE = {r: i for i, r in enumerate(_REASONS)}
# `Plan.wait_causes`: a `capacity` wait split by what its preemption search gave.
_CAUSE_NAMES = {r: r.value for r in _REASONS}
_NOT_WORTH = "capacity:not_worth_it"  # rule R9 refused the victims found
_PROTECTED = "capacity:protected"  # no victim set; candidates protected (rule R3)
_NO_VICTIM = "capacity:no_victim"  # the search (or an equal one this pass) found none
_NO_SEARCH = "capacity:no_search"  # preemption off, or no search left in the pass (R4)


class _Waits(Mapping[int, Wait]):
    """`Plan.waits`, built lazily: most of a long queue waits, and a wait's message is
    only formatted when someone reads it. Reads give equal `Wait` values every time."""

    __slots__ = ("_raw", "blocks", "elsewhere", "jobs", "now", "pool_info", "protected",
                 "refused", "reservations", "several")

    def __init__(self, jobs: list[QueuedJob] | None = None,
                 now: datetime | None = None) -> None:
        self._raw: dict[int, Wait | _Raw] = {}
        self.jobs: list[QueuedJob] = jobs if jobs is not None else []
        self.now = now
        # Rule E3: (largest free block, its node, free GPUs of the type, the block's
        # cluster) as a `capacity` wait saw them; its `_Raw` holds the index + 1 here.
        self.blocks: list[tuple[int, str, int, str]] = []
        # Rule K3: job id -> the pool it would fit in now but may not use; the pools'
        # (GPU type, cluster, spot); whether the snapshot has several clusters (rule E3
        # then names the block's cluster, rule A4 says "in one cluster").
        self.elsewhere: dict[int, str] = {}
        self.pool_info: Mapping[str, tuple[str, str, bool]] = {}
        self.several = False
        # Rule E4: job id -> (when the first protection of its candidates ends, how many
        # of them are protected), for a `capacity` wait whose victim search found none.
        self.protected: dict[int, tuple[datetime, int]] = {}
        # Rule A9: GPU type -> (the job holding the reservation, its shadow time).
        self.reservations: dict[str, tuple[int, datetime]] = {}
        # `Plan.wait_causes`: job id -> what its preemption search gave (`_NOT_WORTH`,
        # `_NO_VICTIM`), for the jobs whose search ran (or was skipped as failed before).
        self.refused: dict[int, str] = {}

    def causes(self) -> Iterator[tuple[int, str]]:
        """`Plan.wait_causes`, from the raw waits."""
        refused, protected, names = self.refused, self.protected, _CAUSE_NAMES
        capacity = WaitReason.CAPACITY
        for job_id, raw in self._raw.items():
            reason = raw.reason if isinstance(raw, Wait) else _REASONS[raw[0]]
            if reason is not capacity:
                yield job_id, names[reason]
            elif job_id in protected:
                yield job_id, _PROTECTED
            else:
                yield job_id, refused.get(job_id, _NO_SEARCH)

    def __getitem__(self, job_id: int) -> Wait:
        raw = self._raw[job_id]
        if isinstance(raw, Wait):
            return raw
        code, index, held, ceiling = raw
        reason, job = _REASONS[code], self.jobs[index]
        gt = job.gpu_type
        level = job.topology.level if job.topology is not None else ""
        if reason is WaitReason.NEVER_FITS:
            msg = (f"team {job.team} may hold at most {ceiling} {gt} GPUs (its quota's "
                   f"nominal + borrowing limit); this job asks {job.total_gpus}: it can never "
                   "run unless the quota is raised")
        elif reason is WaitReason.QUOTA:
            msg = (f"team {job.team} holds {held} {gt} GPUs; {job.total_gpus} more would "
                   f"pass its limit of {ceiling}")
        elif reason is WaitReason.NO_FIT and ceiling == _IN_ONE_DOMAIN:
            msg = (f"even empty, one {level} of {gt} nodes holds at most {held} replicas of "
                   f"{_replica_size(job)}; this gang needs {job.replicas} in one {level} "
                   f"(topology {level}: required)")
        elif reason is WaitReason.CLUSTER:
            msg = self._cluster_words(job, ceiling)
        elif reason is WaitReason.NO_FIT and held == 0:
            msg = f"no {gt} node has {_replica_size(job)} for one replica"
        elif reason is WaitReason.CPU_MEMORY:
            msg = (f"no {gt} node has {_cpu_memory(job)} free beside "
                   f"{job.gpus_per_replica} GPUs for each of {job.replicas} replica(s): "
                   "the GPUs are free, the CPU or memory next to them is not")
        elif reason is WaitReason.TOPOLOGY:
            msg = (f"no {level} has room for all {job.replicas} replicas of "
                   f"{_replica_size(job)} of {gt} (topology {level}: required); waiting "
                   f"for one {level} to free up")
        elif reason is WaitReason.NO_FIT and ceiling == 0 and _cpu_memory(job):
            msg = (f"even empty, the {gt} nodes{self._one_cluster} hold at most {held} "
                   f"replicas of {_replica_size(job)}; this gang needs {job.replicas}")
        elif reason is WaitReason.NO_FIT:
            msg = (f"even empty, the {gt} nodes{self._one_cluster} hold at most {held} "
                   f"replicas of {job.gpus_per_replica} GPUs; this gang needs {job.replicas}")
        elif reason is WaitReason.LENDING:
            msg = (f"the idle {gt} GPUs are other teams' nominal quota beyond their lending "
                   f"limits; team {job.team} may not borrow them")
        elif reason is WaitReason.HELD_FOR_PREEMPTOR:
            msg = (f"the free {gt} GPUs it would fit on are held for job #{held}, which "
                   f"preempted to run there ({ceiling} GPUs held; rule A5)")
        elif reason is WaitReason.RESERVED:
            holder, at = self.reservations[gt]
            why = ("it has no max_runtime_seconds" if job.max_runtime_seconds is None
                   else f"its max_runtime_seconds ({job.max_runtime_seconds}) runs past that")
            msg = (f"reserved for job {holder} until {_when(at)}: the free {gt} GPUs it "
                   f"fits on are the ones job {holder} needs then, and {why} (rule A9)")
            return Wait(job_id, reason, msg, at)  # rule E4: the wait ends at a known instant
        else:
            msg = f"waiting for {job.replicas} × {job.gpus_per_replica} free {gt} GPUs on nodes"
            if held > 0:
                largest_block, node, free, cluster = self.blocks[held - 1]
                if self.several and node:
                    node += f" (cluster {cluster})"
                msg += _block_words(job, largest_block, node, free)
            held_for = self.reservations.get(gt)
            if reason is WaitReason.CAPACITY and held_for is not None and held_for[0] == job_id:
                msg += f"; GPUs are reserved for it from {_when(held_for[1])} (rule A9)"
        until = None
        if job_id in self.protected and reason in (WaitReason.CAPACITY, WaitReason.QUOTA):
            until, n = self.protected[job_id]
            msg += (f"; {n} running job{'s' if n != 1 else ''} it could preempt "
                    f"{'are' if n != 1 else 'is'} protected by the minimum runtime of "
                    f"{'their' if n != 1 else 'its'} tier (rule R3), the first until "
                    f"{_until_words(until, self.now)}")
        return Wait(job_id, reason, msg, until)

    @property
    def _one_cluster(self) -> str:
        """Rules K1, K4 in words when there are several clusters or spot nodes: a gang's
        nodes are of one cluster and one kind."""
        spot = any(info[2] for info in self.pool_info.values())
        if self.several and spot:
            return " of one cluster and one kind, spot or not (rules K1, K4)"
        if self.several:
            return " of one cluster (rule K1)"
        return " of one kind, spot or not (rule K4)" if spot else ""

    def _cluster_words(self, job: QueuedJob, now_elsewhere: int) -> str:
        """Rule K3's wait in words: the clusters it may use (and spot nodes when it may
        not, rule K4); with `now_elsewhere`, where it would fit now."""
        gt = job.gpu_type
        if job.clusters is None:
            where = "any cluster"
        elif not job.clusters:
            where = "the clusters its pin or selector allows (none)"
        else:
            where = "its cluster" + ("s " if len(job.clusters) != 1 else " ") + ", ".join(
                c or '""' for c in sorted(job.clusters))
        has_spot = any(info[0] == gt and info[2] for info in self.pool_info.values())
        if has_spot and not job.spot_ok:
            where += (" (not spot nodes: a non-preemptible tier uses them only with "
                      "allow_spot, rule K4)")
        gang = f"{job.replicas} × {_replica_size(job)} of {gt}"
        if not now_elsewhere:
            return f"no node of {where} can hold {gang}, even empty (rules K1, K3)"
        other = self.pool_info.get(self.elsewhere.get(job.id, ""))
        there = ""
        if other is not None:
            there = ("on spot nodes of " if other[2] else "in ") + (
                f"cluster {other[1]}" if other[1] else "the cluster")
        return (f"waiting for {gang} in {where}; it would fit now {there}, which it "
                "may not use (rule K3)")

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._raw

    def __iter__(self) -> Iterator[int]:
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw)

    def __repr__(self) -> str:
        return f"_Waits({dict(self)!r})"


# `_Raw`'s last field for a `gang_does_not_fit` of rule A7: no one domain holds the gang.
_IN_ONE_DOMAIN = 1
# A queued job's GPU type, allowed clusters, spot_ok and shape (GPUs, replicas, CPU,
# memory, topology): what decides its pools and whether they hold it.
_StaticKey = tuple[str, frozenset[str] | None, bool, int, int, int, int, Topology | None]
# False: every job through the whole pass, the reference the tests hold the replay of
# waits (`plan_admissions`'s `lane`) to.
_REPLAY = True
# How many misses the replay of waits may have before it is judged (`plan_admissions`).
_LANE_TRIAL = 2048
# A queued job's team, GPU type, shape (GPUs, replicas, CPU, memory, topology), allowed
# clusters and spot_ok: all that its wait depends on once the pass searches no more.
_LaneKey = tuple[str, str, int, int, int | None, int | None, Topology | None,
                 frozenset[str] | None, bool]
# `_Raw`'s last field for a `cluster` wait (rule K3): it would fit now in another pool.
_ELSEWHERE = 1


def _closed_words(clusters: frozenset[str]) -> str:
    """Rule K8's wait in words: every cluster the job may use is disabled."""
    names = ", ".join(sorted(clusters))
    if len(clusters) == 1:
        return (f"its cluster {names} is disabled: it takes no new work (rule K8); this "
                "job waits until it is enabled again")
    return (f"its clusters {names} are disabled: they take no new work (rule K8); this "
            "job waits until one is enabled again")


def _block_words(job: QueuedJob, largest: int, node: str, free: int) -> str:
    """Rule E3: the largest free block of the job's GPU type, in words."""
    gt, g = job.gpu_type, job.gpus_per_replica
    if free == 0:
        return f"; no {gt} GPU is free"
    if largest < g:
        return (f"; largest free block: {largest} GPU{'s' if largest != 1 else ''} on {node}; "
                f"needs {g} on one node ({free} {gt} GPUs free in all)")
    return (f"; largest free block: {largest} GPUs on {node}; needs {job.replicas} blocks "
            f"of {g} ({free} {gt} GPUs free in all)")


def _until_words(until: datetime, now: datetime | None) -> str:
    """Rule E4: an instant as an ISO 8601 time and the seconds until it."""
    words = until.isoformat(timespec="seconds")
    if now is not None:
        words += f" (in {max(0, round((until - now).total_seconds()))} s)"
    return words


def _when(at: datetime) -> str:
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def _cpus(millicores: int) -> str:
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores / 1000:g}"


def _size(n: int) -> str:
    """Bytes in the largest binary unit that holds them to a tenth: 2**38 → "256Gi"."""
    for suffix, unit in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n >= unit:
            return f"{n / unit:.1f}".removesuffix(".0") + suffix
    return f"{n} bytes"


def _cpu_memory(job: QueuedJob) -> str:
    """Rule A6's request of one replica in words: "32 CPUs and 256Gi memory"."""
    parts = []
    if job.cpu_millicores:
        parts.append(f"{_cpus(job.cpu_millicores)} CPUs")
    if job.memory_bytes:
        parts.append(f"{_size(job.memory_bytes)} memory")
    return " and ".join(parts)


def _replica_size(job: QueuedJob) -> str:
    """One replica in words: "8 GPUs" or "8 GPUs, 32 CPUs and 256Gi memory"."""
    extra = _cpu_memory(job)
    gpus = f"{job.gpus_per_replica} GPUs"
    if not extra:
        return gpus
    return f"{gpus} and {extra}" if " and " not in extra else f"{gpus}, {extra}"


class _Factors(Protocol):
    def factor(self, team: str) -> float: ...
    def charge(self, team: str, gpu_hours: float) -> None: ...


class _StaticFactors:
    """Fixed factors for a snapshot without live standings (no entry penalty)."""

    def __init__(self, factors: Mapping[str, float]) -> None:
        self._factors = factors

    def factor(self, team: str) -> float:
        return self._factors.get(team, 1.0)

    def charge(self, team: str, gpu_hours: float) -> None:
        return None


class _Charges:
    """The live factors with a running count of what was charged (rule F6)."""

    def __init__(self, inner: _Factors) -> None:
        self._inner = inner
        self._cache: dict[str, float] = {}
        self.charged = 0.0
        self.count = 0  # how many charges: one may leave `charged` as it was (rounding)

    def factor(self, team: str) -> float:
        """The exact current factor."""
        return self._inner.factor(team)

    def cached(self, team: str) -> float:
        """The factor as of the team's last charge or the last `refresh` (rule O1)."""
        f = self._cache.get(team)
        if f is None:
            f = self._cache[team] = self._inner.factor(team)
        return f

    def refresh(self) -> None:
        self._cache.clear()

    def charge(self, team: str, gpu_hours: float) -> None:
        if gpu_hours:
            self._inner.charge(team, gpu_hours)
            self._cache.pop(team, None)
            self.charged += gpu_hours
            self.count += 1


# Rule O1: every team's key is recomputed once the usage charged since the last refresh
# exceeds this fraction of the total, so a key is never staler than that.
REFRESH_FRACTION = 0.01


# One job of a team's run in `_QueueOrder`: (−job part, submitted, id, index in `jobs`).
_Keyed = tuple[float, datetime, int, int]


class _QueueOrder:
    """Rule O1 as an iterator whose keys follow the live standings.

    Higher tier first; within a tier the higher priority (rule P1: weights.fair_share ×
    the team's current F + the job part), then earlier submit time, then lower id.
    A team's jobs share its F, so each (tier, team) list is sorted once by job part; a
    heap over the teams of a tier holds each team's head. After the consumer charges a
    team (rule F6) that team's next head is keyed with its new F. A charge also moves the
    total, and so every other team's F a little: all keys of the tier are recomputed once
    the charges since the last refresh pass `REFRESH_FRACTION` of the total usage.
    O(n log n) to build, O(log teams) per job plus the refreshes.

    While no team has been charged, every key holds the factor of the pass's start, and
    the heap merges the teams' runs by those fixed keys: one sort of the tier gives that
    order (`_tier_sorted`) with no heap operation per job - a long queue's common pass,
    where little or nothing fits. At the first charge the heap takes over where the sort
    was. The runs and the heap are only built for a tier that needs them.
    """

    # False: every tier through the heap, the reference the tests hold the sort to.
    fast = True

    def __init__(self, jobs: Iterable[QueuedJob], *, factors: _Charges, weights: PriorityWeights,
                 now: datetime, cluster_gpus: int, first: Iterable[int] = (),
                 usage_total: float = 0.0) -> None:
        self._factors = factors
        self._w = w = weights.fair_share
        self._base = usage_total
        firsts = set(first)
        # Every job once; the iterator yields indices into this list. The sort keys below
        # hold the index, not the job: tuples of numbers and datetimes only, which the
        # garbage collector stops tracking (100,000 tuples holding jobs made every
        # collection of the pass walk them all).
        self.jobs: list[QueuedJob] = list(jobs)
        first_idx: list[int] = []
        # Per job (by index) its −job part; per tier its jobs (indices) and their keys'
        # first term with their team's factor of now (`factors.factor`: no cache is
        # filled before the heap would fill it).
        self._neg: list[float] = [0.0] * len(self.jobs)
        neg = self._neg
        by_tier: defaultdict[int, tuple[list[float], list[int]]] = defaultdict(
            lambda: ([], []))
        # Per tier, per team: `w` × its factor of now, the key's fair-share term.
        offsets: defaultdict[int, dict[str, float]] = defaultdict(dict)
        # Rule P1 without the fair-share term: `job_priority(...).job_part` (its factor
        # functions without the breakdown, the size factor cached per GPU count).
        w_age, w_size, max_age = weights.age, weights.size, weights.max_age_seconds
        sizes: dict[int, float] = {}
        for index, job in enumerate(self.jobs):
            if firsts and job.id in firsts:
                first_idx.append(index)
                continue
            submitted = job.submitted_at
            # `age_factor(submitted_at=submitted, now=now, max_age_seconds=max_age)`,
            # inlined: one call per queued job.
            if max_age > 0:
                waited = (now - submitted).total_seconds()
                age = (waited if waited > 0.0 else 0.0) / max_age
                if age > 1.0:
                    age = 1.0
            else:
                age = 0.0
            total = job.gpus_per_replica * job.replicas
            size = sizes.get(total)
            if size is None:
                size = sizes[total] = size_factor(total_gpus=total, cluster_gpus=cluster_gpus,
                                                  favor_small=weights.favor_small)
            neg[index] = neg_part = -(w_age * age + w_size * size)
            team, tier = job.team, job.tier_rank
            offset = offsets[tier]
            c = offset.get(team)
            if c is None:
                c = offset[team] = w * factors.factor(team)
            keys, indices = by_tier[tier]
            keys.append(neg_part - c)
            indices.append(index)
        js = self.jobs
        first_idx.sort(key=lambda i: (-js[i].tier_rank, js[i].submitted_at, js[i].id))
        self.first = first_idx
        self._count = factors.count
        self._tiers = [(*by_tier[t], offsets[t]) for t in sorted(by_tier, reverse=True)]
        # Every offset a number: a NaN or an infinity would not sort as the heap orders.
        self._finite = all(math.isfinite(c) for o in offsets.values() for c in o.values())

    def __iter__(self) -> Iterator[int]:
        """Indices into `jobs`, in queue order."""
        yield from self.first
        charges = self._factors
        for keys, indices, offset in self._tiers:
            if self.fast and self._finite and charges.count == self._count:
                yield from self._tier_sorted(keys, indices, offset)
            else:
                yield from self._tier_heap_from_start(self._runs(indices))

    def _runs(self, indices: list[int]) -> dict[str, list[_Keyed]]:
        """A tier's jobs per team, each list (−job part, submitted, id, index) sorted."""
        runs: dict[str, list[_Keyed]] = {}
        js, neg = self.jobs, self._neg
        for index in indices:
            job = js[index]
            items = runs.get(job.team)
            if items is None:
                items = runs[job.team] = []
            items.append((neg[index], job.submitted_at, job.id, index))
        for items in runs.values():
            items.sort()
        return runs

    def _tier_heap_from_start(self, by_team: dict[str, list[_Keyed]]) -> Iterator[int]:
        head = dict.fromkeys(by_team, 0)
        heap = [self._key(team, by_team[team], 0) for team in by_team]
        heapq.heapify(heap)
        return self._tier_heap(by_team, head, heap, self._factors.charged)

    def _tier_sorted(self, keys: list[float], indices: list[int],
                     offset: dict[str, float]) -> Iterator[int]:
        """A tier (`indices`, their `keys`' first terms) in `_tier_heap`'s order while no
        team is charged: the keys of the pass's start, sorted - by the first term alone
        when no two are equal (then nothing else is ever compared). Exact when each
        team's run stays sorted once keyed: two equal keys whose job parts were not
        (rounding) send the tier to the heap at once (so does any tie of keys with
        parts unequal, to be safe)."""
        charges = self._factors
        order = sorted(range(len(keys)), key=keys.__getitem__)
        firsts = [keys[i] for i in order]
        seq = [indices[i] for i in order]
        if any(map(operator.eq, firsts, itertools.islice(firsts, 1, None))):
            # Equal first terms: each run of them by (submitted, id), the key's rest.
            js, neg = self.jobs, self._neg
            ties = [p for p, same in enumerate(map(
                operator.eq, firsts, itertools.islice(firsts, 1, None))) if same]
            t = 0
            while t < len(ties):
                start = end = ties[t]
                while t < len(ties) and ties[t] == end:
                    t += 1
                    end += 1
                block = seq[start:end + 1]
                if len({neg[i] for i in block}) > 1:
                    yield from self._tier_heap_from_start(self._runs(indices))
                    return
                block.sort(key=lambda i: (js[i].submitted_at, js[i].id))
                seq[start:end + 1] = block
        # What the heap fills at a tier's start: the factor of each of its teams.
        for team in offset:
            charges.cached(team)
        count, charged = charges.count, charges.charged
        for pos, index in enumerate(seq):
            yield index
            if charges.count != count:
                yield from self._heap_after(indices, seq, offset, pos, charged)
                return

    def _heap_after(self, indices: list[int], seq: list[int], offset: dict[str, float],
                    pos: int, seen_charged: float) -> Iterator[int]:
        """The rest of a sorted tier (`indices` in the order `seq`) after its job at `pos`
        was charged: the heap as it would be then (every team's head keyed with the
        factor of the pass's start, the charged team's next with its new factor) and on
        with it, its refresh counting the charges from `seen_charged`, the tier's start."""
        by_team = self._runs(indices)
        js = self.jobs
        head = dict.fromkeys(by_team, 0)
        for done in itertools.islice(seq, pos + 1):
            head[js[done].team] += 1
        team = js[seq[pos]].team
        heap = [(items[i][0] - offset[t], items[i][1], items[i][2], t, i)
                for t, i in head.items() if t != team and i < len(items := by_team[t])]
        if head[team] < len(by_team[team]):
            heap.append(self._key(team, by_team[team], head[team]))
        heapq.heapify(heap)
        return self._tier_heap(by_team, head, heap, seen_charged)

    def _tier_heap(self, by_team: dict[str, list[_Keyed]], head: dict[str, int],
                   heap: list[tuple[float, datetime, int, str, int]],
                   seen_charged: float) -> Iterator[int]:
        """A tier from `head` (per team, the index of its next job) on: a heap over the
        teams' next jobs, `heap`; a team's next keyed again after each job (its charge,
        rule F6), and every key again once the charges since `seen_charged` pass
        `REFRESH_FRACTION` of the total."""
        charges, w = self._factors, self._w
        cached, cache = charges.cached, charges._cache
        heapreplace, heappop = heapq.heapreplace, heapq.heappop
        while heap:
            if charges.charged != seen_charged:
                since = charges.charged - seen_charged
                if since > 0 and since > REFRESH_FRACTION * self._base:
                    self._base += since
                    seen_charged = charges.charged
                    charges.refresh()
                    heap = [self._key(t, by_team[t], i) for t, i in head.items()
                            if i < len(by_team[t])]
                    heapq.heapify(heap)
            top = heap[0]
            team, i = top[3], top[4]
            items = by_team[team]
            i += 1
            head[team] = i
            yield items[i - 1][3]
            # The consumer has charged the team by now (rule F6): key its next job
            # with the new factor; one sift instead of a pop and a push.
            if i < len(items):
                neg_part, submitted, job_id, _ = items[i]
                f = cache.get(team)  # `charges.cached(team)`, the lookup inlined
                if f is None:
                    f = cached(team)
                heapreplace(heap, (neg_part - w * f, submitted, job_id, team, i))
            else:
                heappop(heap)

    def _key(self, team: str, items: list[_Keyed],
             i: int) -> tuple[float, datetime, int, str, int]:
        neg_part, submitted, job_id, _ = items[i]
        return (neg_part - self._w * self._factors.cached(team), submitted, job_id, team, i)


def plan_admissions(snapshot: Snapshot) -> Plan:
    """One planning pass over the queue (rules Q1, Q2, O1, A1-A9, R1-R9, D1-D2, K1-K4, K7).

    In queue order (O1; nominated preemptors first, A5) each job is admitted when it fits
    its team's quota (Q1) and free node capacity as a whole gang (A1-A3); each admission
    charges its team's entry penalty (F6) so the team's later jobs move down. A job that
    does not fit may preempt (R1-R4, Q2; within the rate limit R5, when worth it R9);
    otherwise it waits with a reason and does not block smaller jobs behind it (A4) - but
    the first large gang waiting for capacity reserves GPUs at its shadow time, and a job
    behind it that would still run then only starts beside them (A9). With several
    clusters or spot nodes a gang is placed in one pool (one cluster, spot or not: K1, K4)
    of those it may use (K3), tried in rule K2's order; a preemption's victims are in the
    cluster it lands in (K7). The same snapshot always gives the same plan; the snapshot
    is not changed.
    """
    now = snapshot.now
    ws = Workspace(snapshot)
    cap, ledger = ws.capacity, ws.ledger
    state = snapshot.fair_share_state
    factors = _Charges(state.copy() if state is not None
                       else _StaticFactors(snapshot.fair_share))
    queued_teams = {j.team for j in snapshot.queued}
    usage_total = 0.0 if state is None else sum(state.usage(t) for t in queued_teams)
    weights = snapshot.priority_weights or PriorityWeights()
    cluster_gpus = sum(n.capacity for n in snapshot.open_nodes())  # rule K8
    order = _QueueOrder(snapshot.queued, factors=factors, weights=weights, now=now,
                        cluster_gpus=cluster_gpus, first=snapshot.nominated,
                        usage_total=usage_total)
    pre = snapshot.preemption
    searches = 0
    # Rule R9: per search key, the least work (GPU-seconds) victims found this pass would
    # have lost, for the searches R9 refused.
    r9_refused: dict[tuple[tuple[str, str, int, int, int, int, int, Topology | None],
                           frozenset[str] | None], float] = {}
    preempted_by_team: dict[str, int] = defaultdict(int)
    search_failed: set[tuple[str, str, int, int, int, int, int, Topology | None]] = set()
    # Rule R5: searches refused by the rate limit in this pass, with the victims they needed.
    rate_refused: dict[tuple[str, str, int, int, int, int, int, Topology | None], int] = {}
    # A gang shape that did not fit stays unfit until some node gains free GPUs, CPU or
    # memory: (`cap.grown` then, the wait reason code).
    unfit: dict[tuple[str, int, int, int, int, Topology | None], tuple[int, int]] = {}
    # Rule A6: a gang that asks at least the CPU and memory of one that did not fit (same
    # GPUs, replicas and topology, nothing grown since) does not fit either, for the same
    # reason (`capacity` or `cpu_memory`): (cpu, memory, grown, code) per size.
    unfit_by_size: dict[tuple[str, int, int, Topology | None],
                        list[tuple[int, int, int, int]]] = {}
    topology_code, cpu_memory_code = _CODE[WaitReason.TOPOLOGY], _CODE[WaitReason.CPU_MEMORY]
    held, ceilings = ledger.held, ledger.ceiling
    guarded_total, largest = ledger.guarded_total, cap.largest_node
    constrained = cap.constrained
    billing, interval = snapshot.billing_weight, snapshot.interval_seconds

    admissions: list[Admission] = []
    preemptions: list[Preemption] = []
    jobs = order.jobs
    waits = _Waits(jobs, now)
    waits.pool_info = cap.pool_info
    waits.several = len(cap.clusters) > 1
    raw = waits._raw
    # Rule E2: GPUs this pass holds for preemptors (rule A5: the placement of a preemption
    # found now and what its victims free beyond it; a nominated preemptor's admission),
    # per GPU type and node, and the preemptor they are held for (the latest).
    holds: dict[str, dict[str, int]] = {}
    holder: dict[str, int] = {}
    fits_held: dict[tuple[str, int, int], tuple[int, int]] = {}  # shape: (changes, GPUs held)
    held_code = _CODE[WaitReason.HELD_FOR_PREEMPTOR]
    # Rule E3: the largest free block per set of pools, memoized on the capacity's changes.
    block_seen: dict[tuple[str, ...], tuple[int, int]] = {}
    blocks = waits.blocks
    # Rule E4: per failed search, when the first protected candidate becomes a victim.
    protected_for: dict[tuple[tuple[str, str, int, int, int, int, int, Topology | None],
                              frozenset[str] | None], tuple[datetime, int] | None] = {}
    protected_of_type: dict[str, _Protected] = {}  # rule E4's candidates, per GPU type

    # Rule E2: every `_hold` of this pass, so a memo knows when the holds changed.
    hold_log: list[int] = []
    wait_seen: dict[_StaticKey, tuple[int, int, tuple[int, int, int, str]]] = {}

    def capacity_wait(code: int, index: int, job: QueuedJob, cpu: int, mem: int,
                      pools: tuple[str, ...], excluded: tuple[str, ...],
                      memo_key: _StaticKey) -> _Raw:
        """The raw wait of a job that did not fit in any of its `pools`: `capacity` with
        rule E3's largest free block, rule E2's `held_for_preemptor` when it would fit on
        the GPUs held for a preemptor, or rule K3's `cluster` when it would fit now in
        one of the `excluded` pools (a cluster or spot nodes it may not use); any other
        code as it is. `memo_key` is the job's static key (`_StaticKey`)."""
        if code != capacity:
            return (code, index, 0, 0)
        # The answer only changes with the capacity or the holds: a long queue asks it
        # for most of its jobs, of a few shapes.
        memo = wait_seen.get(memo_key)
        if memo is not None and memo[0] == cap.changes and memo[1] == len(hold_log):
            c, h, ce, where = memo[2]
            if where:
                waits.elsewhere[job.id] = where
            return (c, index, h, ce)
        c, h, ce, where = _capacity_wait(job, cpu, mem, pools, excluded)
        wait_seen[memo_key] = (cap.changes, len(hold_log), (c, h, ce, where))
        if where:
            waits.elsewhere[job.id] = where
        return (c, index, h, ce)

    def _capacity_wait(job: QueuedJob, cpu: int, mem: int, pools: tuple[str, ...],
                       excluded: tuple[str, ...]) -> tuple[int, int, int, str]:
        """`capacity_wait`'s answer as (code, held, ceiling, the pool it would fit in
        now but may not use or "")."""
        g, reps = job.gpus_per_replica, job.replicas
        for p in pools:
            held_here = holds.get(p)
            if held_here and not cpu and not mem and job.topology is None:
                # Memoized per shape until the capacity or the holds change: a long queue
                # asks it for most of its jobs, of a few shapes.
                shape = (p, g, reps)
                known = fits_held.get(shape)
                if known is None or known[0] != cap.changes:
                    fits = _fits_with(cap, p, g, reps, held_here)
                    known = fits_held[shape] = (cap.changes,
                                                sum(held_here.values()) if fits else 0)
                if known[1]:
                    return (held_code, holder[p], known[1], "")
        for p in excluded:
            shape6 = (p, g, reps, cpu, mem, job.topology)
            now_fits = fits_elsewhere.get(shape6)
            if now_fits is None or now_fits[0] != cap.changes:
                now_fits = fits_elsewhere[shape6] = (cap.changes, cap.fits(
                    p, g, reps, cpu=cpu, memory=mem, topology=job.topology))
            if now_fits[1]:
                return (cluster_code, 0, _ELSEWHERE, p)
        seen = block_seen.get(pools)
        if seen is None or seen[0] != cap.changes:
            if len(pools) == 1:
                largest_block, node, free = cap.largest_free_block(pools[0])
                blocks.append((largest_block, node, free, pool_info[pools[0]][1]))
            else:
                blocks.append(_largest_block_of(cap, pools))
            seen = block_seen[pools] = (cap.changes, len(blocks))
        return (capacity, seen[1], 0, "")
    seen: list[int] = []
    remember = seen.append
    nominated = snapshot.nominated
    may_search = pre.enabled and pre.max_searches > 0
    lost_per_wait = pre.lost_per_wait
    quota, no_fit = _CODE[WaitReason.QUOTA], _CODE[WaitReason.NO_FIT]
    never_fits = _CODE[WaitReason.NEVER_FITS]
    capacity, lending_code = _CODE[WaitReason.CAPACITY], _CODE[WaitReason.LENDING]
    lowest_tier = ws.lowest_tier
    dep_counts, array_limits = snapshot.dependency_counts, snapshot.array_limits
    closed = snapshot.closed_clusters  # rule K8
    never_met: dict[int, str] = {}
    array_active: dict[int, int] = defaultdict(int)  # rule A8: members holding GPUs
    if array_limits:
        for r in snapshot.running:
            if r.array_id is not None:
                array_active[r.array_id] += 1
    # Rule A9: per GPU type at most one reservation, for the first job in queue order that
    # waits for capacity (`decided` once it was looked for).
    reserve_on = snapshot.reservation
    reserved: dict[str, _Reservation] = {}
    decided: set[str] = set()
    # Jobs this pass admitted with an estimate, per GPU type: their GPUs free again too.
    admitted_ends: dict[str, list[tuple[datetime, int, tuple[str, ...], int]]] = {}
    # Shapes that fit now but found no room beside the reservation, at `cap.grown`.
    held_back: dict[tuple[str, int, int, int, int, Topology | None], int] = {}
    reserved_code = _CODE[WaitReason.RESERVED]
    cluster_code = _CODE[WaitReason.CLUSTER]
    # Rules K1-K4: the pools of nodes (one GPU type, one cluster, spot or not).
    pool_info = cap.pool_info
    pool_sets: dict[tuple[str, frozenset[str] | None, bool],
                    tuple[tuple[str, ...], tuple[str, ...]]] = {}
    # Rule K3: whether a shape fits now in a pool (at `cap.changes`).
    fits_elsewhere: dict[tuple[str, int, int, int, int, Topology | None], tuple[int, bool]] = {}
    ranks = snapshot.cluster_ranks
    # Per static key (GPU type, allowed clusters, spot_ok, shape): the pools it may use,
    # the others, the ones whose empty nodes hold the gang, and when none does the wait.
    statics: dict[_StaticKey, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...],
                                    tuple[int, int, int]]] = {}
    # Per static key: a job found unfit in all its pools at `cap.grown`, and the reason
    # said (rule K2's first pool's); never `cpu_memory`, which may turn into `capacity`.
    all_unfit: dict[_StaticKey, tuple[int, int]] = {}
    k2_seen: dict[tuple[str, ...], tuple[int, tuple[str, ...]]] = {}

    def pools_for(job: QueuedJob) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """Rules K3, K4: the pools of the job's GPU type it may use (its clusters; spot
        nodes only when `spot_ok`) and the others, each in pool-key order."""
        k = (job.gpu_type, job.clusters, job.spot_ok)
        sets = pool_sets.get(k)
        if sets is None:
            every = cap.pools_of_type.get(job.gpu_type, ())
            allowed = tuple(p for p in every
                            if (job.clusters is None or pool_info[p][1] in job.clusters)
                            and (job.spot_ok or not pool_info[p][2]))
            sets = pool_sets[k] = (allowed, tuple(p for p in every if p not in allowed))
        return sets

    def k2_order(pools: tuple[str, ...], job_id: int) -> tuple[str, ...]:
        """Rule K2: the lowest cluster rank first, then the cluster with the most free
        GPUs of the type, then its name; within a cluster spot nodes first (rule K4: a job
        that may use them prefers them). A nominated preemptor (rule A5) first tries the
        pool its preemption planned. Memoized until the capacity changes."""
        planned = snapshot.nominated_placement.get(job_id) if nominated else None
        if not planned:
            seen_order = k2_seen.get(pools)
            if seen_order is not None and seen_order[0] == cap.changes:
                return seen_order[1]
        first_pool = cap.node_pool.get(planned[0], "") if planned else ""
        free = {p: cap.cluster_free(p) for p in pools}
        ordered = tuple(sorted(pools, key=lambda p: (
            p != first_pool, ranks.get(pool_info[p][1], 0), -free[p], pool_info[p][1],
            not pool_info[p][2])))
        if not planned:
            k2_seen[pools] = (cap.changes, ordered)
        return ordered

    def reserve(job: QueuedJob, cpu: int, mem: int, pools: tuple[str, ...]) -> None:
        """Rule A9: `job` waits for capacity; if it is the first large gang of its GPU
        type to (at least a whole node of the type's largest, asking only GPUs), reserve
        GPUs for it at its shadow time - in the pool of its `pools` (rule K1: one
        cluster) where that comes first, ties by their order (rule K2)."""
        if cpu or mem or job.topology is not None or \
                job.gpus_per_replica * job.replicas < largest.get(job.gpu_type, 0):
            return
        decided.add(job.gpu_type)
        best = None
        for p in pools:
            r = _reserve(ws, job, now, admitted_ends.get(job.gpu_type, ()), p)
            if r is not None and (best is None or r.at < best.at):
                best = r
        if best is not None:
            reserved[job.gpu_type] = best
            waits.reservations[job.gpu_type] = (job.id, best.at)

    def unheld_anywhere(job: QueuedJob) -> tuple[int, int, int] | None:
        """Rules A4, K1, K3: the wait of a job no pool it may use holds even with its
        nodes empty (as the pass below finds it, memoized per static key), or None."""
        g, gt = job.gpus_per_replica, job.gpu_type
        if g > largest.get(gt, 0):
            return (no_fit, 0, 0)
        cpu = mem = 0
        if gt in constrained:
            cpu, mem = job.cpu_millicores or 0, job.memory_bytes or 0
        skey = (gt, job.clusters, job.spot_ok, g, job.replicas, cpu, mem, job.topology)
        static = statics.get(skey)
        if static is None:
            pools, excluded = pools_for(job)
            static = statics[skey] = (pools, excluded, *_holding(
                cap, job, pools, excluded, g, job.replicas, cpu, mem, job.topology))
        return None if static[2] else static[3]

    # The replay of a long queue's waits: once no search is left (rule R4) and
    # no preemptor is nominated, a job waits exactly as an earlier job of its team and
    # shape did when nothing has changed since - no capacity, hold or ledger move (every
    # counter in `stamp` only grows). Per `_LaneKey`: (stamp, reason code, held,
    # ceiling, rule K3's pool or "") as one of the branches below gave it. A queue of
    # many teams and shapes that keeps changing the state seldom replays: after
    # `_LANE_TRIAL` misses outnumbering the replays the pass stops looking.
    lane: dict[_LaneKey, tuple[int, int, int, int, str]] = {}
    lane_on = _REPLAY and not nominated
    stamp = replays = misses = 0

    for index in order:
        job = jobs[index]
        job_id = job.id
        remember(job_id)
        lkey: _LaneKey | None = None
        if lane_on and not may_search and not job.dependencies and job.array_id is None:
            lkey = (job.team, job.gpu_type, job.gpus_per_replica, job.replicas,
                    job.cpu_millicores, job.memory_bytes, job.topology, job.clusters,
                    job.spot_ok)
            stamp = cap.changes + cap.grown + len(hold_log) + ledger.moves
            replay = lane.get(lkey)
            if replay is not None and replay[0] == stamp:
                raw[job_id] = (replay[1], index, replay[2], replay[3])
                if replay[4]:
                    waits.elsewhere[job_id] = replay[4]
                replays += 1
                continue
            misses += 1
            if misses >= _LANE_TRIAL and misses > replays:
                lane_on = False
        if job.dependencies:  # rules D1-D2
            dep = dependencies_verdict(job.dependencies, dep_counts)
            if dep.verdict is not Verdict.MET:
                never = dep.verdict is Verdict.NEVER
                if never:
                    never_met[job_id] = dep.message
                raw[job_id] = Wait(job_id, WaitReason.DEPENDENCY_NEVER if never
                                   else WaitReason.DEPENDENCY, dep.message)
                continue
        if closed and job.clusters and job.clusters <= closed:  # rule K8
            raw[job_id] = Wait(job_id, WaitReason.CLUSTER, _closed_words(job.clusters))
            continue
        array_id = job.array_id
        if array_id is not None and array_limit_reached(active=array_active[array_id],
                                                        limit=array_limits.get(array_id)):
            raw[job_id] = Wait(job_id, WaitReason.ARRAY_LIMIT,
                               f"{array_active[array_id]} members of array {array_id} hold "
                               f"GPUs, its limit of {array_limits[array_id]} at once (rule A8)")
            continue
        gt, team, g, reps = job.gpu_type, job.team, job.gpus_per_replica, job.replicas
        total = g * reps
        key = (team, gt)
        ceiling = ceilings.get(key)
        over = ceiling is not None and held[key] + total > ceiling
        if over and not (may_search and lowest_tier.get(key, job.tier_rank) < job.tier_rank):
            # Rule E6: a job no pool it may use could hold even empty (a cluster disabled
            # or gone since its submit) says so, not "raise the quota", which cannot help.
            unheld = unheld_anywhere(job)
            if unheld is not None:
                raw[job_id] = (unheld[0], index, unheld[1], unheld[2])
                if lkey is not None:
                    lane[lkey] = (stamp, *unheld, "")
                continue
            code = quota if total <= (ceiling or 0) else never_fits
            raw[job_id] = (code, index, held[key], ceiling or 0)
            if lkey is not None:
                lane[lkey] = (stamp, code, held[key], ceiling or 0, "")
            continue
        if g > largest.get(gt, 0):
            raw[job_id] = (no_fit, index, 0, 0)
            if lkey is not None:
                lane[lkey] = (stamp, no_fit, 0, 0, "")
            continue
        # Rule A6 only where the nodes of the type report CPU or memory.
        cpu = mem = 0
        if gt in constrained:
            cpu, mem = job.cpu_millicores or 0, job.memory_bytes or 0
        topo = job.topology
        # Rules K1, K3, K4: the pools (one GPU type, one cluster, spot or not) it may use,
        # and of those the ones that hold the gang when empty (rules A4, A6, A7).
        # Static for the pass (what empty nodes hold): memoized per shape.
        skey = (gt, job.clusters, job.spot_ok, g, reps, cpu, mem, topo)
        static = statics.get(skey)
        if static is None:
            pools, excluded = pools_for(job)
            static = statics[skey] = (pools, excluded, *_holding(
                cap, job, pools, excluded, g, reps, cpu, mem, topo))
        pools, excluded, fitting, unheld = static
        if not fitting:
            raw[job_id] = (unheld[0], index, unheld[1], unheld[2])
            if lkey is not None:
                lane[lkey] = (stamp, *unheld, "")
            continue
        lending = not over and guarded_total.get(gt, 0) > 0 and \
            ledger.lending_blocks(team, gt, total)
        placement = None
        why_not = capacity
        pool = fitting[0]
        k2: tuple[str, ...] | None = None
        if not lending and not over and not nominated and (
                (seen_unfit := all_unfit.get(skey)) is not None
                and seen_unfit[0] == cap.grown):
            # Every pool was found unfit for this shape and nothing grew since (the memo
            # below, for all its pools at once): the common case of a long queue.
            why_not = seen_unfit[1]
            if not may_search:
                raw[job_id] = wait = capacity_wait(why_not, index, job, cpu, mem, fitting,
                                                   excluded, skey)
                # (`reserve` passes over a gang smaller than a node before the order of
                # its pools matters: most of a long queue.)
                if why_not == capacity and reserve_on and gt not in decided and \
                        total >= largest.get(gt, 0) and not (cpu or mem) and topo is None:
                    reserve(job, cpu, mem, k2_order(fitting, job_id))
                if lkey is not None:  # (`reserve` decides once per GPU type: never again)
                    lane[lkey] = (stamp, wait[0], wait[2], wait[3],
                                  waits.elsewhere.get(job_id, ""))
                continue
        elif not lending and not over:
            k2 = fitting if len(fitting) == 1 else k2_order(fitting, job_id)
            all_known = True
            saw_reserved = False
            first = True
            for p in k2:
                shape = (p, g, reps, cpu, mem, topo)
                known = unfit.get(shape)
                if (known is None or known[0] != cap.grown) and (cpu or mem):
                    known = _dominated(unfit_by_size.get((p, g, reps, topo)), cpu, mem,
                                       cap.grown)
                if known is not None and known[0] == cap.grown:
                    code = known[1]
                    if code == cpu_memory_code and not cap.fits(p, g, reps):
                        code = capacity  # its GPUs are taken too by now
                else:
                    all_known = False
                    code = -1
                    res = reserved.get(gt) if reserved else None
                    if res is not None and res.pool == p and not (
                            job.max_runtime_seconds is not None
                            and job.max_runtime_seconds <= res.seconds):
                        # Rule A9: a job that may still run at the shadow time only starts
                        # on GPUs the reservation leaves free then.
                        if held_back.get(shape) == cap.grown:
                            code = reserved_code
                        else:
                            placement = _place_beside(cap, res, p, g, reps, cpu, mem, topo)
                            if placement is None and cap.fits(p, g, reps, cpu=cpu, memory=mem,
                                                              topology=topo):
                                held_back[shape] = cap.grown
                                code = reserved_code
                    else:
                        placement = cap.place(p, g, reps, cpu=cpu, memory=mem, topology=topo)
                    if placement is not None:
                        pool = p
                        break
                    if code < 0:
                        code = _why_unplaced(cap, p, g, reps, cpu, mem, topo)
                        unfit[shape] = (cap.grown, code)
                        if code != topology_code:
                            _remember_unfit(unfit_by_size, (p, g, reps, topo), cpu, mem,
                                            cap.grown, code)
                if code == reserved_code:
                    saw_reserved = True
                if first:  # the reason said is the first cluster's in rule K2 order
                    why_not, first = code, False
            if placement is None:
                if saw_reserved:  # rule A9: it fits, but only on GPUs reserved for another
                    raw[job_id] = (reserved_code, index, 0, 0)
                    continue
                if why_not != cpu_memory_code:
                    all_unfit[skey] = (cap.grown, why_not)
                if all_known and not may_search and not nominated:
                    # The common case of a long queue.
                    raw[job_id] = capacity_wait(why_not, index, job, cpu, mem, fitting,
                                                excluded, skey)
                    if why_not == capacity and reserve_on and gt not in decided:
                        reserve(job, cpu, mem, k2)
                    continue
        if placement is not None:
            if nominated and job_id in nominated:  # rule A5: planned first, for its GPUs
                hold_log.append(job_id)
                _hold(holds, holder, pool, job_id, dict.fromkeys(placement, 0), placement, g)
            if reserve_on and gt not in decided and job.max_runtime_seconds is not None:
                admitted_ends.setdefault(gt, []).append(
                    (now + timedelta(seconds=job.max_runtime_seconds), job_id, placement, g))
            ledger.add(team, gt, total)
            factors.charge(team, entry_penalty_gpu_hours(total, billing(gt), interval))
            admissions.append(Admission(job_id, team, gt, placement, pool_info[pool][1],
                                        pool_info[pool][2]))
            if array_id is not None:
                array_active[array_id] += 1
            continue
        terminating = nominated.get(job_id, 0) if nominated else 0
        if terminating > 0:
            # Rule A5 (E2 names it): what is free of its planned placement is its, while
            # its victims' GPUs are still being released: no later job takes it first.
            planned = snapshot.nominated_placement.get(job_id)
            if planned:
                hold_log.append(job_id)
                _hold(holds, holder, cap.node_pool.get(planned[0], gt), job_id,
                      _hold_placement(cap, gt, planned, g), (), g)
            raw[job_id] = Wait(
                job_id, WaitReason.PREEMPTING,
                f"waiting for {terminating} preempted job(s) to release their {gt} GPUs",
            )
            continue
        # Rules R1-R4: only when preempting is the only way it fits. A search that failed
        # for a job of the same team, shape and tier (and cluster pool) fails again: skip it.
        result = None
        # Rule A9 applies if it ends up waiting for capacity (not quota, not preempting).
        may_reserve = (reserve_on and not over and not lending and why_not == capacity
                       and gt not in decided)
        if k2 is None:
            k2 = fitting if len(fitting) == 1 else k2_order(fitting, job_id)
        if may_search:
            search_key = (team, gt, job.tier_rank, g, reps, cpu, mem, topo)
            # Rule R5 before the search: a team with no preemption left in the window does
            # not search at all, and one whose search needed more victims than it has left
            # does not search again for the same shape in this pass (what it may still
            # preempt only shrinks within a pass).
            left = pre.left(team)
            if left is not None:
                left -= preempted_by_team[team]
                needed = rate_refused.get(search_key)
                if left <= 0 or (needed is not None and needed > left):
                    until = pre.free_again_at(team, needed=needed or 1,
                                              made_in_pass=preempted_by_team[team], now=now)
                    if may_reserve:
                        reserve(job, cpu, mem, k2)
                    raw[job_id] = Wait(
                        job_id, WaitReason.RATE_LIMITED,
                        f"team {team} may preempt {max(0, left)} more job(s) in the current "
                        "window" + (f"; it needs {needed}" if needed is not None else "")
                        + (f"; until {_until_words(until, now)}" if until else ""), until)
                    continue
            # Rule R9 (a refusal remembered): a search of this team, shape and tier that R9
            # refused in this pass found victims losing `lost` GPU-seconds; a job whose
            # wait allows less would be refused the same victims: it waits, no search.
            refused_lost = r9_refused.get((search_key, job.clusters))
            if refused_lost is not None and lost_per_wait is not None and refused_lost > \
                    lost_per_wait * total * max(0.0, (now - (job.queued_at
                                                              or job.submitted_at)).total_seconds()):
                if may_reserve:
                    reserve(job, cpu, mem, k2)
                waits.refused[job_id] = _NOT_WORTH
                raw[job_id] = Wait(
                    job_id, WaitReason.CAPACITY,
                    f"waiting for {reps} × {g} free {gt} GPUs on nodes; preempting now would "
                    f"lose about {refused_lost / 3600.0:.2f} GPU-hours of other jobs' work (the "
                    "victims found for an equal job of its team in this pass), more than its "
                    "wait so far is worth (rule R9)")
                continue
            # Rule K7: the victims in one cluster, the first in rule K2 order where a
            # victim set exists.
            for p in k2:
                pool_search = (team, p, job.tier_rank, g, reps, cpu, mem, topo)
                if pool_search in search_failed:
                    continue
                if not may_search:
                    break
                searches += 1
                may_search = searches < pre.max_searches
                result = find_victims(ws, job, now=now, factor=factors.factor, pool=p)
                if result is not None:
                    pool = p
                    break
                search_failed.add(pool_search)
                if (search_key, job.clusters) not in protected_for:
                    candidates = protected_of_type.get(gt)
                    if candidates is None:
                        candidates = protected_of_type[gt] = _protected_of_type(ws, gt, now)
                    protected_for[(search_key, job.clusters)] = _protected_among(
                        ws, job, candidates)
            if result is None:
                waits.refused[job_id] = _NO_VICTIM
            if result is None and (
                    protected := protected_for.get((search_key, job.clusters))) is not None:
                waits.protected[job_id] = protected
        if result is not None and lost_per_wait is not None:
            # Rule R9: preempt only when it is worth it - the work the victims lose is at
            # most `lost_per_wait` × what the job has waited, in GPU-seconds. Else it waits
            # for a finish (and searches again, its wait grown, in a later cycle).
            found, undo = result
            lost = sum(work_lost_gpu_hours(ws.running_by_id[v.job_id], now)
                       for v in found.victims) * 3600.0
            waited = max(0.0, (now - (job.queued_at or job.submitted_at)).total_seconds())
            allowed = lost_per_wait * total * waited
            if lost > allowed and may_reserve and not cpu and not mem \
                    and job.topology is None and total >= largest.get(gt, 0):
                # Rule R9.1: the large gang rule A9 reserves for also counts the wait this
                # preemption spares it - until its shadow time, at most as long again as it
                # has waited (shadow time without the victims found: they are restored).
                undo()
                spared = _spared_until_shadow(ws, job, now, admitted_ends.get(gt, ()), k2)
                result = find_victims(ws, job, now=now, factor=factors.factor, pool=pool)
                assert result is not None  # the same workspace as the search above
                found, undo = result
                allowed = lost_per_wait * total * (waited + min(spared, waited))
            if lost > allowed:
                undo()
                result = None
                waits.refused[job_id] = _NOT_WORTH
                refused_key = (search_key, job.clusters)
                r9_refused[refused_key] = min(lost, r9_refused.get(refused_key, lost))
                if may_reserve:
                    reserve(job, cpu, mem, k2)
                raw[job_id] = Wait(
                    job_id, WaitReason.CAPACITY,
                    f"waiting for {reps} × {g} free {gt} GPUs on nodes; preempting now would "
                    f"lose {lost / 3600.0:.2f} GPU-hours of other jobs' work, more than its "
                    "wait so far is worth (rule R9)")
                continue
        if result is not None:
            found, undo = result
            left = pre.left(team)
            if left is not None and len(found.victims) > left - preempted_by_team[team]:
                undo()
                rate_refused[search_key] = len(found.victims)
                until = pre.free_again_at(team, needed=len(found.victims),
                                          made_in_pass=preempted_by_team[team], now=now)
                if may_reserve:
                    reserve(job, cpu, mem, k2)
                raw[job_id] = Wait(
                    job_id, WaitReason.RATE_LIMITED,
                    f"needs {len(found.victims)} preemption(s) but team {team} may preempt "
                    f"{max(0, left - preempted_by_team[team])} more in the current window"
                    + (f"; until {_until_words(until, now)}" if until else ""), until)
                continue
            # The victims stay removed and the job's placement stays reserved for the rest
            # of this pass; what the victims free beyond it is held back too: they still
            # run until stopped, so no job of this pass may be placed there (rule A5).
            freed = _hold_freed(ws, found, g, cpu, mem)
            hold_log.append(job_id)
            _hold(holds, holder, pool, job_id, freed, found.placement, g)
            ledger.add(team, gt, total)
            preempted_by_team[team] += len(found.victims)
            preemptions.append(found)
            if array_id is not None:
                array_active[array_id] += 1
            raw[job_id] = Wait(
                job_id, WaitReason.PREEMPTING,
                f"preempting {len(found.victims)} job(s) "
                f"({', '.join('#' + str(v.job_id) for v in found.victims)}; "
                f"rule {', '.join(found.rules)}); admitted once their GPUs are free",
            )
            continue
        if over:
            raw[job_id] = (quota if total <= (ceiling or 0) else never_fits, index, held[key],
                           ceiling or 0)
        elif lending:
            raw[job_id] = (lending_code, index, 0, 0)
            if may_reserve:
                reserve(job, cpu, mem, k2)
        else:
            raw[job_id] = capacity_wait(why_not, index, job, cpu, mem, fitting, excluded, skey)
            if may_reserve:
                reserve(job, cpu, mem, k2)
    teams = sorted(queued_teams | set(snapshot.fair_share))
    standings = {t: factors.factor(t) for t in teams}
    return Plan(admissions=tuple(admissions), waits=waits, preemptions=tuple(preemptions),
                order=tuple(seen), fair_share_after=standings, never_met=never_met,
                reservations=dict(waits.reservations))


class _Reservation:
    """Rule A9: the GPUs of each node of the type that are free at the shadow time `at`
    once the reserved job's replicas are placed there (`room`); a job still running then
    may only use those."""

    __slots__ = ("at", "pool", "room", "seconds")

    def __init__(self, at: datetime, room: dict[str, int], now: datetime, pool: str) -> None:
        self.at = at
        self.room = room
        self.pool = pool  # rule K1: the nodes of one pool; the others are not reserved
        # A job started now ends before `at` when its estimate is at most this.
        self.seconds = (at - now).total_seconds()


def _reserve(ws: Workspace, job: QueuedJob, now: datetime,
             admitted: Iterable[tuple[datetime, int, tuple[str, ...], int]],
             pool: str) -> _Reservation | None:
    """Rule A9's shadow time for `job`: the earliest instant at which the jobs holding
    GPUs of its type, ended by their estimates (start + max_runtime_seconds; admitted in
    this pass: now + estimate) in order, free enough GPUs for the gang, and the nodes
    best fit (A3) gives it then. None when no such instant is known (the jobs in the way
    have no estimate). The victims of this pass's preemptions are not counted as freed.
    Only the nodes of `pool` count (rule K1: the gang runs in one cluster)."""
    cap = ws.capacity
    gt, g, reps = job.gpu_type, job.gpus_per_replica, job.replicas
    names = cap.nodes_of.get(pool, ())
    room = {n: cap.free[n] for n in names}
    slots = sum(f // g for f in room.values())
    ends: list[tuple[datetime, int, tuple[str, ...], int]] = list(admitted)
    for r in ws.running_by_type.get(gt, ()):
        if r.id in ws.removed:
            continue
        end = r.estimated_end(now)
        if end is not None:
            ends.append((end, r.id, r.nodes, r.gpus_per_replica))
    ends.sort()
    at = None
    for end, _, nodes, per in ends:
        for n in nodes:
            if n in room:
                old = room[n]
                room[n] = min(cap.capacity[n], old + per)
                slots += room[n] // g - old // g
        if slots >= reps:
            at = max(end, now)
            break
    if at is None:
        return None
    for _ in range(reps):  # best fit (A3) at the shadow time: the reserved job's nodes
        name = min((n for n in names if room[n] >= g), key=lambda n: (room[n], n))
        room[name] -= g
    return _Reservation(at, room, now, pool)


def _spared_until_shadow(ws: Workspace, job: QueuedJob, now: datetime,
                         admitted: Iterable[tuple[datetime, int, tuple[str, ...], int]],
                         pools: tuple[str, ...]) -> float:
    """Rule R9.1: the seconds from now to `job`'s shadow time (rule A9; the earliest of
    its pools), 0 when none is known."""
    at = None
    for p in pools:
        r = _reserve(ws, job, now, admitted, p)
        if r is not None and (at is None or r.at < at):
            at = r.at
    return 0.0 if at is None else max(0.0, (at - now).total_seconds())


def _place_beside(cap: Capacity, res: _Reservation, gpu_type: str, gpus: int, replicas: int,
                  cpu: int, memory: int, topology: Topology | None) -> tuple[str, ...] | None:
    """Rule A9: place a gang that may still run at the reservation's shadow time only on
    GPUs the reservation leaves free then, and take them from its `room`. GPUs alone: best
    fit (A3) among the nodes with room, both now and then. With CPU, memory or a topology
    (rules A6, A7): the usual placement, kept only if it leaves the reservation whole.
    None, changing nothing, when it cannot."""
    room = res.room
    if topology is None and (gpu_type not in cap.constrained or not (cpu or memory)):
        names = cap.nodes_of.get(gpu_type, ())
        free = cap.free
        if sum(min(free[n], room.get(n, 0)) // gpus for n in names) < replicas:
            return None
        taken: list[str] = []
        for _ in range(replicas):
            name = min((n for n in names if free[n] >= gpus and room.get(n, 0) >= gpus),
                       key=lambda n: (free[n], n))
            cap.set_free(name, free[name] - gpus)
            room[name] -= gpus
            taken.append(name)
        return tuple(taken)
    placement = cap.place(gpu_type, gpus, replicas, cpu=cpu, memory=memory, topology=topology)
    if placement is None:
        return None
    need: dict[str, int] = defaultdict(int)
    for n in placement:
        need[n] += gpus
    if any(room.get(n, 0) < k for n, k in need.items()):
        cap.release(placement, gpus, cpu=cpu, memory=memory)
        return None
    for n, k in need.items():
        room[n] -= k
    return placement


def _never_holds(cap: Capacity, pool: str, gpus: int, replicas: int, cpu: int, memory: int,
                 topology: Topology | None) -> tuple[int, int] | None:
    """Rules A4, A6, A7 on one pool (rule K1): None when its nodes, empty, hold the gang;
    else (the most replicas they hold, `_IN_ONE_DOMAIN` when it is one domain that
    cannot)."""
    if gpus > cap.pool_largest.get(pool, 0):
        return (0, 0)
    if (replicas > 1 or cpu or memory) and replicas > (
            slots := cap.slots_when_empty(pool, gpus, cpu, memory)):
        return (slots, 0)
    if topology is not None and topology.mode is TopologyMode.REQUIRED and replicas > (
            slots := cap.domain_slots_when_empty(pool, topology.level, gpus, cpu, memory)):
        return (slots, _IN_ONE_DOMAIN)
    return None


def _holding(cap: Capacity, job: QueuedJob, pools: tuple[str, ...], excluded: tuple[str, ...],
             gpus: int, replicas: int, cpu: int, memory: int, topology: Topology | None,
             ) -> tuple[tuple[str, ...], tuple[int, int, int]]:
    """Rules A4, K1, K3: the `pools` whose empty nodes hold the gang; when none does, the
    wait as (reason code, replicas held, flag): `cluster` when the job names clusters
    none of which has nodes of its type, or when an `excluded` pool would hold it; else
    `gang_does_not_fit`."""
    fitting, fail = _holding_pools(cap, pools, gpus, replicas, cpu, memory, topology)
    if fitting:
        return fitting, (0, 0, 0)
    if (job.clusters is not None and not pools) or any(
            _never_holds(cap, p, gpus, replicas, cpu, memory, topology) is None
            for p in excluded):
        return (), (_CODE[WaitReason.CLUSTER], 0, 0)
    if fail is None:
        return (), (_CODE[WaitReason.NO_FIT], 0, 0)
    return (), (_CODE[WaitReason.NO_FIT], fail[0], fail[1])


def _holding_pools(cap: Capacity, pools: tuple[str, ...], gpus: int, replicas: int, cpu: int,
                   memory: int, topology: Topology | None,
                   ) -> tuple[tuple[str, ...], tuple[int, int] | None]:
    """Rule K1: the `pools` whose nodes, empty, hold the whole gang, and for none the
    failure (`_never_holds`) of the one that holds the most replicas."""
    fitting: list[str] = []
    worst: tuple[int, int] | None = None
    for p in pools:
        fail = _never_holds(cap, p, gpus, replicas, cpu, memory, topology)
        if fail is None:
            fitting.append(p)
        elif worst is None or fail[0] > worst[0]:
            worst = fail
    return tuple(fitting), worst


def _largest_block_of(cap: Capacity, pools: tuple[str, ...]) -> tuple[int, str, int, str]:
    """Rule E3 over several pools: the largest free block of any (the first pool in key
    order among equals), its node, the free GPUs of all of them, the block's cluster."""
    best = (0, "", 0, "")
    total = 0
    for p in pools:
        largest, node, free = cap.largest_free_block(p)
        total += free
        if largest > best[0]:
            best = (largest, node, 0, cap.pool_info[p][1])
    return best[0], best[1], total, best[3]


def _dominated(failed: list[tuple[int, int, int, int]] | None, cpu: int, memory: int,
               grown: int) -> tuple[int, int] | None:
    """(grown, code) of a failure at `grown` that asked no more CPU and memory, or None."""
    for c, m, at, code in failed or ():
        if at == grown and cpu >= c and memory >= m:
            return at, code
    return None


def _remember_unfit(by_size: dict[tuple[str, int, int, Topology | None],
                                  list[tuple[int, int, int, int]]],
                    key: tuple[str, int, int, Topology | None], cpu: int, memory: int,
                    grown: int, code: int) -> None:
    """Keep the failures at `grown` of one size, at most 16 (a cache, not a record)."""
    kept = [f for f in by_size.get(key, ()) if f[2] == grown][-15:]
    kept.append((cpu, memory, grown, code))
    by_size[key] = kept


def _why_unplaced(cap: Capacity, gpu_type: str, gpus: int, replicas: int, cpu: int,
                  memory: int, topology: Topology | None) -> int:
    """The wait reason code of a gang `place` refused: `topology` when it would fit, CPU
    and memory included, but for its required domain (rule A7); `cpu_memory` when its
    GPUs alone would fit (rule A6); else `capacity`. Topology first: a gang that sets
    memory (every job has some, docs/kubernetes.md) and fits anywhere but in one domain
    waits for its domain, not for memory."""
    if topology is not None and cap.fits(gpu_type, gpus, replicas, cpu=cpu, memory=memory):
        return _CODE[WaitReason.TOPOLOGY]
    if (cpu or memory) and cap.fits(gpu_type, gpus, replicas):
        return _CODE[WaitReason.CPU_MEMORY]
    return _CODE[WaitReason.CAPACITY]


def _fits_with(cap: Capacity, gpu_type: str, gpus: int, replicas: int,
              held: Mapping[str, int]) -> bool:
    """Rule E2: would the gang fit (GPUs alone) if the GPUs `held` per node (of the pool
    `gpu_type`) were free? The slots now from the buckets, plus what the held GPUs add."""
    free = cap.free
    slots = cap.slots_now(gpu_type, gpus)
    for n, h in held.items():
        f = free[n]
        slots += (f + h) // gpus - f // gpus
    return slots >= replicas


def _hold(holds: dict[str, dict[str, int]], holder: dict[str, int], gpu_type: str,
          job_id: int, extra: Mapping[str, int], placement: Iterable[str], gpus: int) -> None:
    """Rule E2's record of rule A5: `job_id` holds `extra` GPUs per node beyond its
    `placement` of `gpus` per replica."""
    per_node = holds.setdefault(gpu_type, {})
    for name, n in extra.items():
        if n > 0:
            per_node[name] = per_node.get(name, 0) + n
    for name in placement:
        per_node[name] = per_node.get(name, 0) + gpus
    holder[gpu_type] = job_id


def _hold_placement(cap: Capacity, gpu_type: str, placement: Iterable[str],
                    gpus: int) -> dict[str, int]:
    """Rule A5 for a nominated preemptor still waiting for its victims: take what is free
    of `gpus` per replica on its planned nodes (of its type) out of this pass's capacity;
    returns the GPUs held per node."""
    want: dict[str, int] = defaultdict(int)
    for name in placement:
        if cap.node_type.get(name) == gpu_type:
            want[name] += gpus
    held: dict[str, int] = {}
    for name, n in sorted(want.items()):
        take = min(n, cap.free[name])
        if take > 0:
            cap.set_free(name, cap.free[name] - take)
            held[name] = take
    return held


def _protected_until(ws: Workspace, job: QueuedJob, now: datetime) -> tuple[datetime, int] | None:
    """Rule E4: of the running jobs of `job`'s GPU type it might preempt (preemptible, and
    of a lower tier or another team: rules R1, R2), those its tier's minimum runtime still
    protects (rule R3): when the first protection ends, and how many are protected. None
    when none is (or none has started: its protection has no known end). Only jobs of
    the clusters it may use count (rule K7: victims are in the preemptor's cluster).
    The reference for `_protected_among`, which the plan calls."""
    allowed = job.clusters
    ends = [r.started_at + timedelta(seconds=r.min_runtime_seconds)
            for r in ws.running_by_type.get(job.gpu_type, ())
            if r.preemptible and r.id not in ws.removed and r.started_at is not None
            and (allowed is None or ws.running_cluster[r.id] in allowed)
            and (r.tier_rank < job.tier_rank or r.team != job.team)
            and r.ran_seconds(now) < r.min_runtime_seconds]
    return (min(ends), len(ends)) if ends else None


# Rule E4's candidates of one GPU type: (job, the end of its protection) per running job
# that is preemptible, has started and is still protected by rule R3 at `now`.
_Protected = list[tuple[RunningJob, datetime]]


def _protected_of_type(ws: Workspace, gpu_type: str, now: datetime) -> _Protected:
    """The running jobs of `gpu_type` that rule R3 protects at `now` (preemptible and
    started), with when their protection ends: what `_protected_until` keeps of them
    before it looks at the job, the same for every search of a pass (no job starts or
    ages within it). A job with no minimum runtime is never protected (its run time is
    never negative)."""
    return [(r, r.started_at + timedelta(seconds=r.min_runtime_seconds))
            for r in ws.running_by_type.get(gpu_type, ())
            if r.min_runtime_seconds > 0 and r.preemptible and r.started_at is not None
            and r.ran_seconds(now) < r.min_runtime_seconds]


def _protected_among(ws: Workspace, job: QueuedJob,
                     candidates: _Protected) -> tuple[datetime, int] | None:
    """`_protected_until(ws, job, now)` from `_protected_of_type(ws, job.gpu_type, now)`:
    a long queue's failed searches (up to rule R4's budget per pass) each read the few
    protected jobs instead of every running job of the type."""
    allowed, removed, where = job.clusters, ws.removed, ws.running_cluster
    tier, team = job.tier_rank, job.team
    ends = [end for r, end in candidates
            if r.id not in removed and (allowed is None or where[r.id] in allowed)
            and (r.tier_rank < tier or r.team != team)]
    return (min(ends), len(ends)) if ends else None


def _hold_freed(ws: Workspace, found: Preemption, gpus_per_replica: int, cpu: int,
                memory: int) -> dict[str, int]:
    """Rule A5: GPUs (and CPU and memory, rule A6) a preemption frees beyond its
    preemptor's placement are not free during this pass (the victims are only stopped
    after it). Returns the GPUs held back per node (rule E2 names them)."""
    extra: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for v in found.victims:
        r = ws.running_by_id[v.job_id]
        for name in r.nodes:
            e = extra[name]
            e[0] += r.gpus_per_replica
            e[1] += r.cpu_millicores or 0
            e[2] += r.memory_bytes or 0
    for name in found.placement:
        e = extra[name]
        e[0] -= gpus_per_replica
        e[1] -= cpu
        e[2] -= memory
    cap = ws.capacity
    held: dict[str, int] = {}
    for name, (hold, hold_cpu, hold_memory) in sorted(extra.items()):
        if name not in cap.free:
            continue
        if hold > 0:
            held[name] = min(hold, cap.free[name])
            cap.set_free(name, max(0, cap.free[name] - hold))
        c, m = cap.cpu_free[name], cap.memory_free[name]
        cap.add_cpu_memory(name, -min(max(0, hold_cpu), c or 0),
                           -min(max(0, hold_memory), m or 0))
    return held
