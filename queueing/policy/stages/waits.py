"""Waits: why a queued job is not admitted, kept raw and put in words only when read
(docs/scheduling.md, rules E1-E6 and the reason of every other rule that makes a job
wait)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from enum import StrEnum
from operator import attrgetter
from typing import Any

from queueing.policy.snapshot import QueuedJob


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
class Wait:
    job_id: int
    reason: WaitReason
    message: str
    until: datetime | None = None  # rule E4: when the wait ends, when the plan knows it



# A wait not formatted yet: (reason code, index of the job in `Waits.jobs`, GPUs held,
# ceiling). Only ints, so the garbage collector stops tracking the tuple at once (a long
# queue makes ~100,000 of them; tuples holding a job would make every collection slower).
Raw = tuple[int, int, int, int]
REASONS: tuple[WaitReason, ...] = tuple(WaitReason)
CODE = {r: i for i, r in enumerate(REASONS)}
# `Plan.wait_causes`: a `capacity` wait split by what its preemption search gave.
CAUSE_NAMES = {r: r.value for r in REASONS}
NOT_WORTH = "capacity:not_worth_it"  # rule R9 refused the victims found
PROTECTED_CAUSE = "capacity:protected"  # no victim set; candidates protected (rule R3)
NO_VICTIM = "capacity:no_victim"  # the search (or an equal one this pass) found none
NO_SEARCH = "capacity:no_search"  # preemption off, or no search left in the pass (R4)


class Waits(Mapping[int, Wait]):
    """`Plan.waits`, built lazily: most of a long queue waits, and a wait's message is
    only formatted when someone reads it. Reads give equal `Wait` values every time."""

    __slots__ = ("_raw", "blocks", "booked", "bulk", "bulk_held", "classes", "elsewhere", "jobs",
                 "lending", "now", "owed", "packed", "per_type", "pool_info", "protected",
                 "refused", "reservations", "segments", "several", "tree_limits")

    def __init__(self, jobs: list[QueuedJob] | None = None,
                 now: datetime | None = None) -> None:
        self._raw: dict[int, Wait | Raw] = {}
        self.jobs: list[QueuedJob] = jobs if jobs is not None else []
        self.now = now
        # Rule E3: (largest free block, its node, free GPUs of the type, the block's
        # cluster) as a `capacity` wait saw them; its `Raw` holds the index + 1 here.
        self.blocks: list[tuple[int, str, int, str]] = []
        # Rule K3: job id -> the pool it would fit in now but may not use; the pools'
        # (GPU type, cluster, spot); whether the snapshot has several clusters (rule E3
        # then names the block's cluster, rule A4 says "in one cluster").
        self.elsewhere: dict[int, str] = {}
        self.pool_info: Mapping[str, tuple[str, str, bool]] = {}
        self.several = False
        # Rule H5: the slice-packed GPU types (and pools) -> their slices per GPU.
        self.packed: Mapping[str, int] = {}
        # Rule E4: job id -> (when the first protection of its candidates ends, how many
        # of them are protected), for a `capacity` wait whose victim search found none.
        self.protected: dict[int, tuple[datetime, int]] = {}
        # Rule A9: GPU type -> (the job holding the reservation, its shadow time).
        self.reservations: dict[str, tuple[int, datetime]] = {}
        # `Plan.wait_causes`: job id -> what its preemption search gave (`NOT_WORTH`,
        # `NO_VICTIM`), for the jobs whose search ran (or was skipped as failed before).
        self.refused: dict[int, str] = {}
        # Rule G5: for a job accepting several GPU types that waits, its index in `jobs`
        # and each type's blocker in preference order (the type, its wait); `_raw` holds
        # the first type's.
        self.per_type: dict[int, tuple[int, list[tuple[str, Wait | Raw]]]] = {}
        # Rule R11: (job id, GPU type) -> its team's nominal of the type, for an owed
        # claim whose search found no victim set: its wait says it is owed.
        self.owed: dict[tuple[int, str], int] = {}
        # Rule Q4: the departments and teams whose borrowing limit made a job wait, with
        # (GPU type, nominal, borrowing limit); a `quota` or `never_fits` raw wait with
        # a negative ceiling -(k + 1) names entry k (its held: what the node's subtree
        # holds), so the replay of waits gives it again as it gives a team's.
        self.tree_limits: list[tuple[str, str, int, int]] = []
        # Rule Q4: the words of lending waits in a tree (who guards the GPUs left); a
        # `lending_limit` raw wait with a negative ceiling -(k + 1) says entry k, so the
        # replay of waits gives it again as it gives a quota wait.
        self.lending: list[str] = []
        # Rule W3: GPU type -> (team, GPUs, end) of each active booking that held free
        # GPUs out of the pass: a capacity wait of another team says so.
        self.booked: dict[str, list[tuple[str, int, datetime]]] = {}
        # Waits given per class and not made per job yet (`admission._EXPANDED_ON_READ`):
        # the job's index in `jobs`, its class's replayed entry (stamp, reason code, held,
        # ceiling, ...); `segments`: per run of them in the order they were given, the
        # key of `_raw` added last before it (None: none) and its start in `bulk`.
        # `expand` makes their raw waits, in that order, before any read.
        self.bulk: list[int] = []
        self.bulk_held: list[tuple[int, int, int, int, str, int]] = []
        self.segments: list[tuple[int | None, int]] = []
        # Per index of `jobs`, its class of equal jobs (the index of the class's first
        # job: `admission._classes`) when the pass found them, else []: jobs of one class
        # are equal in every field their words read but `max_runtime_seconds`.
        self.classes: list[int] = []

    def expand(self) -> None:
        """The waits kept in bulk made raw waits of `_raw`, in the order the pass gave
        them: each run after the key added last before it. Only after the pass (which
        adds `bulk` at its end): `_raw` is a new dict."""
        if not self.bulk:
            return
        raw, bulk, held_of, jobs = self._raw, self.bulk, self.bulk_held, self.jobs
        segments = self.segments
        keys, values = list(raw), list(raw.values())
        anchors = {key for key, _ in segments}
        at = {k: i + 1 for i, k in enumerate(keys) if k in anchors}
        ends = [start for _, start in segments[1:]]
        ends.append(len(bulk))
        new: dict[int, Wait | Raw] = {}
        done = 0
        for (key, start), end in zip(segments, ends, strict=True):
            cut = 0 if key is None else at[key]
            if cut > done:
                new.update(zip(keys[done:cut], values[done:cut], strict=True))
                done = cut
            run = bulk[start:end]
            new.update(zip([jobs[i].id for i in run],
                           [(h[1], i, h[2], h[3]) for i, h in zip(run, held_of[start:end],
                                                                   strict=True)],
                           strict=True))
        new.update(zip(keys[done:], values[done:], strict=True))
        self._raw = new
        self.bulk, self.bulk_held, self.segments = [], [], []

    def words(self, order: Iterable[int], ids: Sequence[int]
              ) -> Iterator[tuple[WaitReason, str, datetime | None] | None]:
        """Per index of `order` (indices into `jobs` as the pass met them: `Order.read`),
        the wait of the job `ids[index]` as (reason, message, until), None when it has
        none: what `self.get(ids[index])` gives, without expanding the bulk or making a
        `Wait` per job. A wait that reads nothing of its job but its wording fields (no
        rule E4 protection, K3 pool, R11 claim or A9 reservation of its own, one GPU
        type) is put in words once per distinct raw entry and wording."""
        raw_of, bulk, held_of, jobs = self._raw, self.bulk, self.bulk_held, self.jobs
        per_type = self.per_type
        own = {*self.protected, *self.elsewhere, *(j for j, _ in self.owed),
               *(h for h, _ in self.reservations.values())}
        said: dict[tuple[Any, ...], tuple[WaitReason, str, datetime | None]] = {}
        b, nb = 0, len(bulk)
        for index in order:
            job_id = ids[index]
            raw: Wait | Raw | None
            if b < nb and bulk[b] == index:
                h = held_of[b]
                raw = (h[1], index, h[2], h[3])
                b += 1
            else:
                raw = raw_of.get(job_id)
            if raw is None:
                yield None
            elif per_type and job_id in per_type:
                w = self._several_types(job_id, per_type[job_id])
                yield w.reason, w.message, w.until
            elif isinstance(raw, Wait):
                yield raw.reason, raw.message, raw.until
            elif job_id in own:
                w = self._format(job_id, raw, None)
                yield w.reason, w.message, w.until
            else:
                key = (raw[0], raw[2], raw[3], _wording(jobs[raw[1]]))
                found = said.get(key)
                if found is None:
                    w = self._format(job_id, raw, None)
                    found = said[key] = (w.reason, w.message, w.until)
                yield found

    def own_words(self) -> set[int]:
        """The jobs whose wait reads the job itself, beyond its wording fields: a rule E4
        protection, a K3 pool, an R11 claim, an A9 reservation held for it, or rule G5's
        several types. `words` puts their waits in words per job."""
        return {*self.protected, *self.elsewhere, *(j for j, _ in self.owed),
                *(h for h, _ in self.reservations.values()), *self.per_type}

    def words_of(self, job_id: int, raw: Wait | Raw
                 ) -> tuple[WaitReason, str, datetime | None]:
        """The wait `raw` of the job `job_id` as (reason, message, until), made for that
        job alone: what `words` gives it."""
        several = self.per_type.get(job_id) if self.per_type else None
        w = (self._several_types(job_id, several) if several is not None
             else self._format(job_id, raw, None))
        return w.reason, w.message, w.until

    def causes(self) -> Iterator[tuple[int, str]]:
        """`Plan.wait_causes`, from the raw waits."""
        self.expand()
        refused, protected, names = self.refused, self.protected, CAUSE_NAMES
        capacity = WaitReason.CAPACITY
        for job_id, raw in self._raw.items():
            reason = raw.reason if isinstance(raw, Wait) else REASONS[raw[0]]
            if reason is not capacity:
                yield job_id, names[reason]
            elif job_id in protected:
                yield job_id, PROTECTED_CAUSE
            else:
                yield job_id, refused.get(job_id, NO_SEARCH)

    def __getitem__(self, job_id: int) -> Wait:
        if self.bulk:
            self.expand()
        raw = self._raw[job_id]
        several = self.per_type.get(job_id) if self.per_type else None
        if several is not None:
            return self._several_types(job_id, several)
        return self._format(job_id, raw, None)

    def _several_types(self, job_id: int,
                       several: tuple[int, list[tuple[str, Wait | Raw]]]) -> Wait:
        """Rule G5: a job accepting several GPU types waits for the reason of its most
        preferred type, and its message names each type's blocker in order:
        "h100: quota (team a holds ...); a100: capacity (waiting for ...)"."""
        job = self.jobs[several[0]]
        waits = [self._format(job_id, raw, job if gt == job.gpu_type
                              else replace(job, gpu_type=gt)) for gt, raw in several[1]]
        words = "; ".join(f"{gt}: {w.reason.value} ({w.message})"
                          for (gt, _), w in zip(several[1], waits, strict=True))
        types = ", ".join(gt for gt, _ in several[1])
        until = min((w.until for w in waits if w.until is not None), default=None)
        return Wait(job_id, waits[0].reason,
                    f"none of the GPU types it accepts ({types}) has room: {words} (rule G5)",
                    until)

    def _format(self, job_id: int, raw: Wait | Raw, view: QueuedJob | None) -> Wait:
        """The `Wait` of a raw wait; `view` the job as tried on one of its GPU types
        (rule G5), else the job itself."""
        if isinstance(raw, Wait):
            return raw
        code, index, held, ceiling = raw
        reason, job = REASONS[code], view or self.jobs[index]
        gt = job.gpu_type
        per_gpu = self.packed.get(gt, 1) if self.packed else 1

        def gpus(units: int) -> str:
            """Units of a slice-packed type in GPUs (rule H4: 6 slices of 4 = 1.5)."""
            return str(units) if per_gpu == 1 else f"{units / per_gpu:g}"
        level = job.topology.level if job.topology is not None else ""
        if ceiling < 0 and reason in (WaitReason.QUOTA, WaitReason.NEVER_FITS):
            msg = self._tree_words(job, reason, held, -ceiling - 1)
        elif reason is WaitReason.NEVER_FITS:
            msg = (f"team {job.team} may hold at most {gpus(ceiling)} {gt} GPUs (its quota's "
                   f"nominal + borrowing limit); this job asks {gpus(job.total_gpus)}: it can never "
                   "run unless the quota is raised")
        elif reason is WaitReason.QUOTA:
            msg = (f"team {job.team} holds {gpus(held)} {gt} GPUs; {gpus(job.total_gpus)} more would "
                   f"pass its limit of {ceiling}")
        elif reason is WaitReason.NO_FIT and ceiling == IN_ONE_DOMAIN:
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
            size = (share_words(job.gpus_per_replica, self.packed[gt])  # rule H5
                    if self.packed and gt in self.packed else f"{job.gpus_per_replica} GPUs")
            msg = (f"even empty, the {gt} nodes{self._one_cluster} hold at most {held} "
                   f"replicas of {size}; this gang needs {job.replicas}")
        elif reason is WaitReason.LENDING and ceiling < 0:
            return Wait(job_id, reason, self.lending[-ceiling - 1])
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
        elif self.packed and gt in self.packed:
            msg = _packed_words(job, self.packed[gt],
                                self.blocks[held - 1] if held > 0 else None, self.several)
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
            if self.booked and gt in self.booked:
                msg += _booked_words(self.booked[gt], job.team, gt)
        if self.owed and (job_id, gt) in self.owed:
            msg += (f"; it is owed {gpus(job.total_gpus)} of team {job.team}'s "
                    f"{gpus(self.owed[(job_id, gt)])} nominal {gt} GPUs (rule R11), but the jobs "
                    "it may preempt (rules R1, R2) cannot make room for it")
        until = None
        if job_id in self.protected and reason in (WaitReason.CAPACITY, WaitReason.QUOTA):
            until, n = self.protected[job_id]
            msg += (f"; {n} running job{'s' if n != 1 else ''} it could preempt "
                    f"{'are' if n != 1 else 'is'} protected by the minimum runtime of "
                    f"{'their' if n != 1 else 'its'} tier (rule R3), the first until "
                    f"{until_words(until, self.now)}")
        return Wait(job_id, reason, msg, until)

    def _tree_words(self, job: QueuedJob, reason: WaitReason, held: int, k: int) -> str:
        """Rule Q4: the binding level of the job's path, its nominal + borrowing limit,
        what its subtree holds (rule E6 when the job alone passes it)."""
        node, gt, nominal, limit = self.tree_limits[k]
        who = (f"team {node}" if node == job.team
               else f"department {node} (above team {job.team})")
        words = f"{who} may hold at most {nominal + limit} {gt} GPUs (nominal {nominal} + " \
            f"borrowing limit {limit})"
        if reason is WaitReason.NEVER_FITS:
            return (f"{words}; this job asks {job.total_gpus}: it can never run unless the "
                    "quota is raised (rules Q4, E6)")
        return f"{words} and holds {held}; {job.total_gpus} more would pass it (rule Q4)"

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
        if self.bulk:
            self.expand()
        return job_id in self._raw

    def __iter__(self) -> Iterator[int]:
        self.expand()
        return iter(self._raw)

    def __len__(self) -> int:
        return len(self._raw) + len(self.bulk)

    def __repr__(self) -> str:
        return f"Waits({dict(self)!r})"


# What `Waits._format` reads of a job beside its id: jobs equal in these and in their raw
# entry (reason, held, ceiling) wait in the same words (`Waits.words`).
_wording = attrgetter("team", "gpu_type", "gpus_per_replica", "replicas", "topology",
                      "cpu_millicores", "memory_bytes", "clusters", "spot_ok",
                      "max_runtime_seconds")
wording = _wording  # the same, for the published plan's columns built per class

# `Raw`'s last field for a `gang_does_not_fit` of rule A7: no one domain holds the gang.
IN_ONE_DOMAIN = 1

# `Raw`'s last field for a `cluster` wait (rule K3): it would fit now in another pool.
ELSEWHERE = 1


def _booked_words(booked: list[tuple[str, int, datetime]], team: str, gt: str) -> str:
    """Rule W3 in a capacity wait: the bookings of other teams that keep GPUs free, and
    the job's own team's, whose free GPUs did not hold it (what is left of the booking
    is smaller than the job, or not on the nodes it needs)."""
    words = ""
    others = [(t, n, end) for t, n, end in booked if t != team]
    if others:
        words = "; " + "; ".join(f"{n} {gt} GPUs are booked for team {t} until {_when(end)}"
                                 for t, n, end in others) + ", not free to it (rule W3)"
    for t, n, end in booked:
        if t == team:
            words += (f"; the free GPUs of team {t}'s booking of {n} {gt} until "
                      f"{_when(end)} do not hold it either (rule W3)")
    return words


def closed_words(clusters: frozenset[str]) -> str:
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


def share_words(units: int, slices_per_gpu: int) -> str:
    """Rule H1 in words: a replica of `units` slices of a packed type - "2 slices of 4
    (0.5 GPU)", or whole GPUs: "2 GPUs"."""
    if units < slices_per_gpu:
        return (f"{units} slice{'s' if units != 1 else ''} of {slices_per_gpu} "
                f"({units / slices_per_gpu:g} GPU)")
    n = -(-units // slices_per_gpu)
    return f"{n} whole GPU{'s' if n != 1 else ''}"


def need_words(job: QueuedJob, gt: str, packed: Mapping[str, int]) -> str:
    """What a job waits for on `gt`: "waiting for 2 × 8 free h100 GPUs on nodes", on a
    slice-packed type in its slices (rule H5)."""
    if packed and gt in packed:
        return _packed_words(job if job.gpu_type == gt else replace(job, gpu_type=gt),
                             packed[gt], None, False)
    return f"waiting for {job.replicas} × {job.gpus_per_replica} free {gt} GPUs on nodes"


def _packed_words(job: QueuedJob, s: int, block: tuple[int, str, int, str] | None,
                  several: bool) -> str:
    """Rule H5: a capacity wait on a slice-packed type in words: "waiting for 1 × 2
    slices of 4 (0.5 GPU) of one ts-a10 GPU; no ts-a10 GPU has 2 free slices; the most
    on one GPU is 1 (on node-a; 3 slices free in all)"."""
    gt, g, reps = job.gpu_type, job.gpus_per_replica, job.replicas
    what = share_words(g, s)
    msg = (f"waiting for {reps} × {what} of one {gt} GPU" if g < s
           else f"waiting for {reps} × {what} of {gt}, wholly free (no GPU shared by "
                "fractions)")
    if block is None:
        return msg
    largest, node, free, cluster = block
    if several and node:
        node += f" (cluster {cluster})"
    if free == 0:
        return msg + f"; no {gt} slice is free"
    in_all = f"{free} slice{'s' if free != 1 else ''} free in all"
    if g < s:
        if largest < g:
            return (msg + f"; no {gt} GPU has {g} free slice{'s' if g != 1 else ''}; the most "
                    f"on one GPU is {largest} (on {node}; {in_all})")
        return (msg + f"; the most free slices on one {gt} GPU: {largest} on {node}; needs "
                f"{reps} GPUs with {g} ({in_all})")
    n, whole = largest // s, -(-g // s)
    return (msg + f"; the most wholly free {gt} GPUs on one node: {n}"
            + (f" on {node}" if node else "") + f"; needs {whole} on one node"
            + (f" for each of {reps} replicas" if reps > 1 else "")
            + f" ({in_all})")


def until_words(until: datetime, now: datetime | None) -> str:
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
