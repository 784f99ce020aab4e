"""Ordering, admission and preemption on a snapshot (docs/scheduling.md, rules Q1, O1,
A1-A9, R1-R9, Q2, D1-D2, and K1-K4, K7, K8 across clusters and spot nodes).

`plan_admissions` is the entry point; its work is done in stages, one module each in
`policy/stages/` (the way Kueue's scheduler reads): the heads in queue order
(`stages/heads.py`), flavor assignment (`stages/flavors.py`), quota fit and borrowing
(`stages/quota.py`), node fit and topology (`stages/nodes.py`, the reservation in
`stages/reservation.py`), preemption targets (`stages/preempt.py`), admit
(`stages/admit.py`); `stages/pipeline.py` runs one job through them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Any

from .preemption import Preemption
from .snapshot import QueuedJob, Snapshot, Topology, TopologyMode
from .stages.admit import Admission
from .stages.heads import gate
from .stages.pipeline import attempt, attempt_types, try_of
from .stages.state import Pass, Step
from .stages.waits import CODE, NO_VICTIM, Wait, WaitReason, Waits
from .workspace import Capacity

__all__ = [
    "Admission", "Capacity", "Order", "Plan", "Preemption", "Topology", "TopologyMode", "Wait",
    "WaitReason", "plan_admissions",
]


@dataclass(frozen=True, slots=True)
class Plan:
    admissions: tuple[Admission, ...]
    waits: Mapping[int, Wait]
    # Rules R1-R8: victims to preempt now; each preemptor is admitted in a later cycle.
    preemptions: tuple[Preemption, ...] = ()
    # Every queued job id in the order the pass considered it (rule O1): queue position
    # (a tuple, or an `Order` that reads the ids when asked and compares as their tuple).
    order: Sequence[int] = ()
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
        if isinstance(waits, Waits):
            yield from waits.causes()
        else:
            for job_id, w in waits.items():
                yield job_id, w.reason.value



class Order(Sequence[int]):
    """`Plan.order` kept as the pass met it: indices into its jobs, the ids read
    (`ids`, per index) only when the order is read - most cycles never read it
    (docs/performance.md, "The plan expanded only where read"). Equal to the tuple of
    its ids, and to an `Order` of the same ids."""

    __slots__ = ("_ids", "_indices", "_tuple")

    def __init__(self, indices: list[int], ids: list[int]) -> None:
        self._indices: list[int] | None = indices
        self._ids: list[int] | None = ids
        self._tuple: tuple[int, ...] | None = None

    def ids(self) -> tuple[int, ...]:
        """The job ids in rule O1's order."""
        if self._tuple is None:
            assert self._indices is not None and self._ids is not None
            self._tuple = tuple(map(self._ids.__getitem__, self._indices))
            self._indices = self._ids = None
        return self._tuple

    def read(self) -> tuple[Sequence[int], Sequence[int]]:
        """(the indices in rule O1's order, the job id per index), without making the
        tuple of ids (`Waits.words` reads the waits by them)."""
        if self._tuple is not None:
            return range(len(self._tuple)), self._tuple
        assert self._indices is not None and self._ids is not None
        return self._indices, self._ids

    def __getitem__(self, i: Any) -> Any:
        return self.ids()[i]

    def __len__(self) -> int:
        return len(self._indices) if self._indices is not None else len(self.ids())

    def __iter__(self) -> Iterator[int]:
        return iter(self.ids())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Order):
            return self.ids() == other.ids()
        if isinstance(other, tuple):
            return self.ids() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.ids())

    def __repr__(self) -> str:
        return repr(self.ids())


# True: `plan_admissions` does not read a job whose class's wait is given at once
# (`_Replay.now`): `Plan.order` an `Order`, the job's wait kept in bulk (`Waits.bulk`)
# until read; False: its id and wait made per job (the reference, held to it by
# tests/policy/test_fleet_fast_paths.py).
_EXPANDED_ON_READ = True

# False: every job through the whole pass, the reference the tests hold the replay of
# waits (`plan_admissions`'s `lane`) to.
_REPLAY = True
# How many misses the replay of waits may have before it is judged (`plan_admissions`).
_LANE_TRIAL = 2048
# A replay judged not worth it tries again once this many jobs in a row saw the state
# unchanged: a long queue's admissions come early, its tail mostly waits.
_LANE_QUIET = 256
# True: `_Replay.per_type`; False: every job at the stamp of every change and per tier
# (the reference, held to it by tests/policy/test_fleet_fast_paths.py).
_PER_TYPE = True
# A queued job's team, GPU type (rule G5: the types of a job of several, in order),
# tier, shape (GPUs, replicas, CPU, memory, topology), allowed clusters and spot_ok:
# all that its wait depends on once the pass searches no more (its tier: whether it is
# an owed claim, which still searches, rule R11; of several types, rule G2's setting).
_LaneKey = tuple[str, str | tuple[str, ...], int, int, int, int | None, int | None,
                 Topology | None, frozenset[str] | None, bool]

# True: a class's wait, once replayed, is given again to its next jobs without asking
# the replay (`_Replay.now`) until some stamp moves; False: the replay asked for each job
# (held to it by tests/policy/test_fleet_fast_paths.py).
_PER_CLASS = True

# True: a class whose wait rule Q4 gave in stage 3 (its path over a borrowing limit) is
# replayed while nothing moved under its team's top-level node (`_Replay.path_kept`),
# whatever else of its GPU type moved; False: only at its type's stamp (held to it by
# tests/policy/test_fleet_fast_paths.py).
_PATH_KEPT = True
_QUOTA, _NEVER_FITS = CODE[WaitReason.QUOTA], CODE[WaitReason.NEVER_FITS]

# A queued job's class: every field `_LaneKey` reads (its tier only where the replay
# reads tiers), and those that keep a job out of the replay (dependencies, array,
# several GPU types). Jobs of one class wait alike once the pass searches no more.
_CLASS_FIELDS = ("team", "gpu_type", "gpus_per_replica", "replicas", "cpu_millicores",
                 "memory_bytes", "topology", "clusters", "spot_ok", "dependencies",
                 "array_id", "gpu_types")
_class_of = attrgetter(*_CLASS_FIELDS)
_class_and_tier_of = attrgetter(*_CLASS_FIELDS, "tier_rank")
_id_of = attrgetter("id")

# What the replay gives again to a job of several GPU types: (stamp, the first type's
# reason code, held, ceiling, rule K3's pool or "", and each type's (type, code, held,
# ceiling)).
_SeveralReplay = tuple[int, int, int, int, str, tuple[tuple[str, int, int, int], ...]]


def _classes(jobs: list[QueuedJob], tiers: bool) -> list[int]:
    """The queue in classes of equal jobs (`_class_of`, with the tier when `tiers`),
    found once for the whole queue: per job, its class, the index of its class's first
    job. The replay keys its lane by class."""
    first: dict[tuple[Any, ...], int] = {}
    # Each job's key dropped once looked up (a list of a million keys is ~150 MB).
    return list(map(first.setdefault, map(_class_and_tier_of if tiers else _class_of, jobs),
                    itertools.count()))

class _Replay:
    """The replay of waits (`plan_admissions`): per class of equal jobs (`_classes`;
    per `_LaneKey` for jobs of several GPU types) what the stages gave an equal job, at
    `stamp`."""

    __slots__ = ("able", "class_of", "elsewhere", "key", "lane", "misses", "now",
                 "on", "p", "path_kept", "per_path", "per_type", "quiet", "quiet_stamp",
                 "replays", "several_key", "several_lane", "stamp", "tiers", "total")

    def __init__(self, p: Pass) -> None:
        self.p = p
        # (stamp, reason code, held, ceiling, rule K3's pool or "", rule R11's nominal or 0)
        self.lane: dict[int, tuple[int, int, int, int, str, int]] = {}
        self.several_lane: dict[_LaneKey, _SeveralReplay] = {}  # rule G5
        self.able = self.on = _REPLAY and not p.nominated
        # `_PER_TYPE`: a job of one GPU type replays at its type's stamp (its quota,
        # lending and capacity waits read that type alone) and, when no rule reads tiers
        # here (rule R11's owed claims, rules W1-W4's bookings), whatever its tier.
        self.per_type = _PER_TYPE and p.book is None
        self.tiers = not self.per_type or p.owed_on
        self.class_of = _classes(p.jobs, self.tiers) if self.able else []
        self.stamp = self.replays = self.misses = self.quiet = 0
        self.quiet_stamp = -1
        self.elsewhere = p.waits.elsewhere
        # The job's class, or its `_LaneKey` when of several types, when its wait may be
        # replayed (else None).
        self.key: int | None = None
        self.several_key: _LaneKey | None = None
        # `_PER_CLASS`: per class, the lane's entry replayed since the stamps last moved
        # (their sum `total`): its next jobs are given it at once.
        self.now: dict[int, tuple[int, int, int, int, str, int]] = {}
        self.total = -1
        # `_PATH_KEPT`: per class whose lane holds rule Q4's wait of stage 3, the count of
        # moves of its type under its team's top-level node (`Ledger.path_moves`), that
        # count when last checked and the binding level then (`Ledger.tree_limit`: node,
        # limit, what its subtree holds). Stage 3 reads nothing else that moves: only
        # bookings (rules W3, W4) come before it and only owed claims (rule R11) or a
        # search (rule R4) let a job past it; neither is replayed here.
        self.per_path = _PATH_KEPT and self.per_type and not p.owed_on and \
            p.ledger.tree is not None
        self.path_kept: dict[int, tuple[list[int], int, tuple[str, int, int]]] = {}

    def replayed(self, job: QueuedJob, index: int, several: bool) -> bool:
        """Give the job an equal job's wait when the state is as it was then; else
        False with `key` the job's class (None when its wait may not be replayed now).
        Judged off after `_LANE_TRIAL` misses outnumbering the replays; on again once
        `_LANE_QUIET` jobs in a row found the state unchanged."""
        p = self.p
        self.key = self.several_key = None
        if not self.able or p.may_search or job.dependencies or job.array_id is not None:
            return False
        cap, ledger = p.cap, p.ledger
        if not self.on or several or not self.per_type:
            stamp = self.stamp = cap.changes + cap.grown + len(p.hold_log) + ledger.moves
            if not self.on:
                self.quiet = self.quiet + 1 if stamp == self.quiet_stamp else 0
                self.quiet_stamp = stamp
                if self.quiet < _LANE_QUIET:
                    return False
                self.on, self.misses, self.replays = True, 0, 0
        if several:
            key = self.several_key = (
                job.team, job.gpu_types, job.tier_rank, job.gpus_per_replica, job.replicas,
                job.cpu_millicores, job.memory_bytes, job.topology, job.clusters, job.spot_ok)
            more = self.several_lane.get(key)
            if more is not None and more[0] == self.stamp:
                _replay_several(p, job.id, index, more)
                self.replays += 1
                return True
            return self._missed()
        gt = job.gpu_type
        if self.per_type:
            self.stamp = cap.type_changes[gt] + cap.grown + len(p.hold_log) + \
                ledger.type_moves[gt]
        c = self.key = self.class_of[index]
        replay = self.lane.get(c)
        if replay is None or replay[0] != self.stamp:
            kept = self.path_kept.get(c) if replay is not None and self.per_path else None
            if replay is None or kept is None or not self._path_holds(c, kept, job):
                return self._missed()
            # Rule Q4: the path binds as it did; the wait holds at the type's stamp now.
            replay = self.lane[c] = (self.stamp, *replay[1:])
        job_id = job.id
        p.raw[job_id] = (replay[1], index, replay[2], replay[3])
        if replay[4] or replay[5]:
            self.more(job_id, gt, replay)
        self.replays += 1
        if _PER_CLASS:
            self.now[c] = replay
        return True

    def _path_holds(self, c: int, kept: tuple[list[int], int, tuple[str, int, int]],
                    job: QueuedJob) -> bool:
        """Rule Q4 (`_PATH_KEPT`): whether the class's wait of stage 3 holds now - nothing
        moved under its team's top-level node, or its path binds as it did (the same
        node, limit and holdings: `tree_wait` words it the same)."""
        moves, count, binding = kept
        if moves[0] == count:
            return True
        if self.p.ledger.tree_limit(job.team, job.gpu_type, job.gpus_per_replica *
                                    job.replicas) != binding:
            return False
        self.path_kept[c] = (moves, moves[0], binding)
        return True

    def more(self, job_id: int, gt: str, replay: tuple[int, int, int, int, str, int]) -> None:
        """What a replayed wait says beyond its raw wait: rule K3's pool where it would
        fit now, rule R11's owed claim whose search found nothing."""
        if replay[4]:
            self.elsewhere[job_id] = replay[4]
        if replay[5]:  # rule R11: owed, its search found nothing
            self.p.waits.owed[(job_id, gt)] = replay[5]
            self.p.waits.refused[job_id] = NO_VICTIM

    def moved(self) -> None:
        """After a job through the stages: forget `now` when some stamp moved (every
        counter in the stamps only grows, so their sum moved)."""
        p = self.p
        cap = p.cap
        total = cap.changes + cap.grown + len(p.hold_log) + p.ledger.moves
        if total != self.total:
            self.total = total
            if self.now:
                self.now.clear()

    def _missed(self) -> bool:
        self.misses += 1
        if self.misses >= _LANE_TRIAL and self.misses > self.replays:
            self.on = False
        return False

    def keep(self, step: Step, owed: int, job: QueuedJob) -> None:
        key = self.key
        if key is not None:
            self.lane[key] = (self.stamp, *step, owed)
            if not self.per_path:
                return
            # Rule Q4's wait of stage 3 (a tree entry: its ceiling negative) or another.
            if step and step[0] in (_QUOTA, _NEVER_FITS) and step[2] < 0:
                ledger = self.p.ledger
                binding = ledger.tree_limit(job.team, job.gpu_type,
                                            job.gpus_per_replica * job.replicas)
                assert binding is not None
                moves = ledger.path_moves(job.team, job.gpu_type)
                self.path_kept[key] = (moves, moves[0], binding)
            elif self.path_kept:
                self.path_kept.pop(key, None)

    def keep_several(self, step: Step, job_id: int) -> None:
        if self.several_key is not None:
            self.several_lane[self.several_key] = (self.stamp, *step, tuple(
                (gt, r[0], r[2], r[3]) for gt, r in self.p.waits.per_type[job_id][1]
                if not isinstance(r, Wait)))


def _replay_several(p: Pass, job_id: int, index: int, again: _SeveralReplay) -> None:
    """The wait of a job of several types as an equal job's was (rule G5)."""
    p.raw[job_id] = (again[1], index, again[2], again[3])
    if again[4]:
        p.waits.elsewhere[job_id] = again[4]
    p.waits.per_type[job_id] = (index, [(gt, (c, index, h, ce)) for gt, c, h, ce in again[5]])


def _through_stages(p: Pass, replay: _Replay, job: QueuedJob, index: int,
                    several: bool) -> None:
    """One job through the gates and the stages (its wait kept for the replay)."""
    snapshot, job_id = p.snapshot, job.id
    wait = gate(job, snapshot.dependency_counts, snapshot.closed_clusters,
                p.array_active, snapshot.array_limits, p.never_met)
    if wait is not None:
        p.raw[job_id] = wait
        return
    if several:  # rules G1-G5
        step = attempt_types(p, job, index)
        if step:
            replay.keep_several(step, job_id)
        return
    step = attempt(p, try_of(p, job, index, job.gpu_type))
    if step:
        replay.keep(step, p.waits.owed.get((job_id, job.gpu_type), 0), job)


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

    The replay of a long queue's waits (`_Replay`): once no search is left (rule R4)
    and no preemptor is nominated, a job waits exactly as an earlier job of its team and
    shape did when nothing has changed since - no capacity, hold or ledger move (every
    counter in the stamp only grows). Per `_LaneKey`: (stamp, reason code, held,
    ceiling, rule K3's pool or "") as the stages gave it; a job of several GPU types
    (rule G5) with each type's blocker. A queue of many teams and
    shapes that keeps changing the state seldom replays: after `_LANE_TRIAL` misses
    outnumbering the replays the pass stops looking, until `_LANE_QUIET` jobs in a row
    found the state unchanged (a fleet's queue admits early, then waits:
    docs/performance.md). The replay is kept per class of equal jobs (`_classes`): a
    class's wait once replayed is given to its next jobs at once until a stamp moves
    (`_PER_CLASS`).
    """
    p = Pass(snapshot)
    cap, jobs, raw = p.cap, p.jobs, p.raw
    replay = _Replay(p)
    # Per job (its index): its class, its id; read in rule O1's order without touching
    # the job when its class's wait is given at once (`_Replay.now`).
    of = replay.class_of or [0] * len(jobs)
    p.waits.classes = replay.class_of  # the published plan puts waits in words per class
    ids = list(map(_id_of, jobs))
    now, more = replay.now, replay.more
    if _EXPANDED_ON_READ:
        return _plan(p, replay, of, ids)
    seen: list[int] = []
    remember = seen.append
    for index in p.order:
        job_id = ids[index]
        remember(job_id)
        c = of[index]
        held = now.get(c)
        if held is not None:  # rules as the replay gives them: `_Replay.replayed`
            raw[job_id] = (held[1], index, held[2], held[3])
            if held[4] or held[5]:
                job = jobs[index]
                more(job_id, job.gpu_type, held)
            replay.replays += 1
        else:
            job = jobs[index]
            several = _several(cap, job)
            if not replay.replayed(job, index, several):
                _through_stages(p, replay, job, index, several)
                replay.moved()
    return _plan_of(p, tuple(seen))


def _plan(p: Pass, replay: _Replay, of: list[int], ids: list[int]) -> Plan:
    """`plan_admissions`' loop with the plan expanded only where read
    (`_EXPANDED_ON_READ`): a job whose class's wait is given at once (`_Replay.now`) is
    not read at all - neither its id nor a wait of its own is made; its index and its
    class's entry go to `Waits.bulk`, and `Plan.order` keeps indices (`Order`). The
    same answers as the loop above once read."""
    cap, jobs, raw = p.cap, p.jobs, p.raw
    seen: list[int] = []
    remember = seen.append
    now, more = replay.now, replay.more
    waits = p.waits
    bulk: list[int] = []
    bulk_held: list[tuple[int, int, int, int, str, int]] = []
    to_bulk, held_to_bulk = bulk.append, bulk_held.append
    segments = waits.segments
    # True once `raw` may have had a wait added since the last bulk entry: the next one
    # starts a segment after `raw`'s last key (`Waits.expand` keeps the order of adding).
    fresh = True
    replays = 0
    for index in p.order:
        remember(index)
        held = now.get(of[index])
        if held is not None:  # rules as the replay gives them: `_Replay.replayed`
            replays += 1
            if held[4] or held[5]:
                job = jobs[index]
                raw[job.id] = (held[1], index, held[2], held[3])
                more(job.id, job.gpu_type, held)
                fresh = True
                continue
            if fresh:
                segments.append((next(reversed(raw), None), len(bulk)))
                fresh = False
            to_bulk(index)
            held_to_bulk(held)
        else:
            replay.replays += replays
            replays = 0
            fresh = True
            job = jobs[index]
            several = _several(cap, job)
            if not replay.replayed(job, index, several):
                _through_stages(p, replay, job, index, several)
                replay.moved()
    replay.replays += replays
    waits.bulk, waits.bulk_held = bulk, bulk_held
    return _plan_of(p, Order(seen, ids))


def _several(cap: Capacity, job: QueuedJob) -> bool:
    """Whether `job` is tried on each of its GPU types (rule G5): not when one of them
    packs slices (rule H7: its units are its own type's; no other type)."""
    if len(job.gpu_types) <= 1:
        return False
    return not (cap.packed and any(gt in cap.packed for gt in job.gpu_types))


def _plan_of(p: Pass, order: Sequence[int]) -> Plan:
    teams = sorted(p.queued_teams | set(p.snapshot.fair_share))
    standings = {t: p.factors.factor(t) for t in teams}
    return Plan(admissions=tuple(p.admissions), waits=p.waits,
                preemptions=tuple(p.preemptions), order=order,
                fair_share_after=standings, never_met=p.never_met,
                reservations=dict(p.waits.reservations))
