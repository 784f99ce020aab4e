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

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from .preemption import Preemption
from .snapshot import Snapshot, Topology, TopologyMode
from .stages.admit import Admission
from .stages.heads import gate
from .stages.pipeline import attempt, attempt_types, try_of
from .stages.state import Pass
from .stages.waits import NO_VICTIM, Wait, WaitReason, Waits
from .workspace import Capacity

__all__ = [
    "Admission", "Capacity", "Plan", "Preemption", "Topology", "TopologyMode", "Wait",
    "WaitReason", "plan_admissions",
]


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
        if isinstance(waits, Waits):
            yield from waits.causes()
        else:
            for job_id, w in waits.items():
                yield job_id, w.reason.value



# False: every job through the whole pass, the reference the tests hold the replay of
# waits (`plan_admissions`'s `lane`) to.
_REPLAY = True
# How many misses the replay of waits may have before it is judged (`plan_admissions`).
_LANE_TRIAL = 2048
# A queued job's team, GPU type, tier, shape (GPUs, replicas, CPU, memory, topology),
# allowed clusters and spot_ok: all that its wait depends on once the pass searches no
# more (its tier: whether it is an owed claim, which still searches, rule R11).
_LaneKey = tuple[str, str, int, int, int, int | None, int | None, Topology | None,
                 frozenset[str] | None, bool]

# A queued job of several GPU types (rule G5): team, types, tier (rule G2's setting),
# shape, allowed clusters and spot_ok; what the replay gives again: (stamp, the first
# type's reason code, held, ceiling, rule K3's pool or "", and each type's (type, code,
# held, ceiling)).
_SeveralKey = tuple[str, tuple[str, ...], int, int, int, int | None, int | None,
                    Topology | None, frozenset[str] | None, bool]
_SeveralReplay = tuple[int, int, int, int, str, tuple[tuple[str, int, int, int], ...]]


def _replay_several(p: Pass, job_id: int, index: int, again: _SeveralReplay) -> None:
    """The wait of a job of several types as an equal job's was (rule G5)."""
    p.raw[job_id] = (again[1], index, again[2], again[3])
    if again[4]:
        p.waits.elsewhere[job_id] = again[4]
    p.waits.per_type[job_id] = (index, [(gt, (c, index, h, ce)) for gt, c, h, ce in again[5]])


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

    The replay of a long queue's waits: once no search is left (rule R4) and no
    preemptor is nominated, a job waits exactly as an earlier job of its team and shape
    did when nothing has changed since - no capacity, hold or ledger move (every counter
    in `stamp` only grows). Per `_LaneKey`: (stamp, reason code, held, ceiling, rule K3's
    pool or "") as the stages gave it; a job of several GPU types (rule G5) per
    `_SeveralKey`, with each type's blocker. A queue of many teams and shapes that keeps
    changing the state seldom replays: after `_LANE_TRIAL` misses outnumbering the
    replays the pass stops looking.
    """
    p = Pass(snapshot)
    cap, ledger, hold_log, jobs, raw = p.cap, p.ledger, p.hold_log, p.jobs, p.raw
    seen: list[int] = []
    remember = seen.append
    # (stamp, reason code, held, ceiling, rule K3's pool or "", rule R11's nominal or 0)
    lane: dict[_LaneKey, tuple[int, int, int, int, str, int]] = {}
    several_lane: dict[_SeveralKey, _SeveralReplay] = {}  # rule G5: jobs of several types
    lane_on = _REPLAY and not p.nominated
    stamp = replays = misses = 0
    elsewhere = p.waits.elsewhere
    for index in p.order:
        job = jobs[index]
        job_id = job.id
        remember(job_id)
        lkey: _LaneKey | None = None
        skey: _SeveralKey | None = None
        several = len(job.gpu_types) > 1
        if several and cap.packed and any(gt in cap.packed for gt in job.gpu_types):
            several = False  # rule H7: its units are its own type's; no other type
        if lane_on and not p.may_search and not job.dependencies and job.array_id is None:
            stamp = cap.changes + cap.grown + len(hold_log) + ledger.moves
            if several:
                skey = (job.team, job.gpu_types, job.tier_rank, job.gpus_per_replica,
                        job.replicas, job.cpu_millicores, job.memory_bytes, job.topology,
                        job.clusters, job.spot_ok)
                again = several_lane.get(skey)
                if again is not None and again[0] == stamp:
                    _replay_several(p, job_id, index, again)
                    replays += 1
                    continue
            else:
                lkey = (job.team, job.gpu_type, job.tier_rank, job.gpus_per_replica,
                        job.replicas, job.cpu_millicores, job.memory_bytes, job.topology,
                        job.clusters, job.spot_ok)
                replay = lane.get(lkey)
                if replay is not None and replay[0] == stamp:
                    raw[job_id] = (replay[1], index, replay[2], replay[3])
                    if replay[4]:
                        elsewhere[job_id] = replay[4]
                    if replay[5]:  # rule R11: owed, its search found nothing
                        p.waits.owed[(job_id, job.gpu_type)] = replay[5]
                        p.waits.refused[job_id] = NO_VICTIM
                    replays += 1
                    continue
            misses += 1
            if misses >= _LANE_TRIAL and misses > replays:
                lane_on = False
        wait = gate(job, snapshot.dependency_counts, snapshot.closed_clusters,
                    p.array_active, snapshot.array_limits, p.never_met)
        if wait is not None:
            raw[job_id] = wait
            continue
        if several:  # rules G1-G5
            step = attempt_types(p, job, index)
            if step and skey is not None:
                several_lane[skey] = (stamp, *step, tuple(
                    (gt, r[0], r[2], r[3]) for gt, r in p.waits.per_type[job_id][1]
                    if not isinstance(r, Wait)))
            continue
        step = attempt(p, try_of(p, job, index, job.gpu_type))
        if step and lkey is not None:
            lane[lkey] = (stamp, *step, p.waits.owed.get((job_id, job.gpu_type), 0))
    teams = sorted(p.queued_teams | set(snapshot.fair_share))
    standings = {t: p.factors.factor(t) for t in teams}
    return Plan(admissions=tuple(p.admissions), waits=p.waits,
                preemptions=tuple(p.preemptions), order=tuple(seen),
                fair_share_after=standings, never_met=p.never_met,
                reservations=dict(p.waits.reservations))
