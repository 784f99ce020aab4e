"""Ordering and admission on a snapshot (docs/scheduling.md, rules O1, A1-A4)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from .snapshot import NodeState, QueuedJob, Snapshot


class WaitReason(StrEnum):
    QUOTA = "quota"
    CAPACITY = "capacity"
    NO_FIT = "gang_does_not_fit"


@dataclass(frozen=True, slots=True)
class Admission:
    job_id: int
    team: str
    gpu_type: str
    # One node name per replica, in replica order (rule A3).
    placement: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Wait:
    job_id: int
    reason: WaitReason
    message: str


@dataclass(frozen=True, slots=True)
class Plan:
    admissions: tuple[Admission, ...]
    waits: Mapping[int, Wait]


def queue_order_key(job: QueuedJob, fair_share: Mapping[str, float]) -> tuple[object, ...]:
    """Rule O1: higher tier first; within a tier the team with the higher fair-share
    factor F first; then earlier submit time; then lower id (deterministic)."""
    return (-job.tier_rank, -fair_share.get(job.team, 1.0), job.submitted_at, job.id)


def order_queue(jobs: Iterable[QueuedJob], fair_share: Mapping[str, float]) -> list[QueuedJob]:
    return sorted(jobs, key=lambda j: queue_order_key(j, fair_share))


class _Capacity:
    """Free GPUs per node, grouped by GPU type, mutable for one planning pass."""

    def __init__(self, nodes: Iterable[NodeState]) -> None:
        self.free: dict[str, int] = {}
        self.by_type: dict[str, list[str]] = defaultdict(list)
        self.largest_node: dict[str, int] = defaultdict(int)
        for n in sorted(nodes, key=lambda n: n.name):
            self.free[n.name] = n.free
            self.by_type[n.gpu_type].append(n.name)
            self.largest_node[n.gpu_type] = max(self.largest_node[n.gpu_type], n.capacity)
        self.max_free: dict[str, int] = {
            t: max((self.free[n] for n in names), default=0) for t, names in self.by_type.items()
        }

    def place(self, gpu_type: str, gpus: int, replicas: int) -> tuple[str, ...] | None:
        """Rules A2-A3: one node per replica, all or none, best fit.

        Each replica goes to the node of its type with the fewest free GPUs that still
        holds it (ties by node name), which keeps whole nodes free for large gangs.
        Returns None, changing nothing, when any replica does not fit.
        """
        if gpus > self.max_free.get(gpu_type, 0):
            return None
        names = self.by_type.get(gpu_type, [])
        taken: list[str] = []
        for _ in range(replicas):
            best: str | None = None
            for name in names:
                f = self.free[name]
                if f >= gpus and (best is None or f < self.free[best]):
                    best = name
                    if f == gpus:
                        break
            if best is None:
                for name in taken:  # roll back the replicas already placed
                    self.free[name] += gpus
                return None
            self.free[best] -= gpus
            taken.append(best)
        self.max_free[gpu_type] = max((self.free[n] for n in names), default=0)
        return tuple(taken)


def plan_admissions(snapshot: Snapshot) -> Plan:
    """Admit, in queue order (rule O1), every job that fits its team's quota (rule A1)
    and free node capacity as a whole gang (rules A2-A3).

    A job that does not fit waits with a reason and does not block smaller jobs behind it
    (rule A4, best-effort order). The same snapshot always gives the same plan.
    """
    cap = _Capacity(snapshot.nodes)
    held: dict[tuple[str, str], int] = defaultdict(int)
    for r in snapshot.running:
        held[(r.team, r.gpu_type)] += r.total_gpus

    admissions: list[Admission] = []
    waits: dict[int, Wait] = {}
    for job in order_queue(snapshot.queued, snapshot.fair_share):
        key = (job.team, job.gpu_type)
        ceiling = snapshot.quota(job.team, job.gpu_type).ceiling
        if ceiling is not None and held[key] + job.total_gpus > ceiling:
            waits[job.id] = Wait(
                job.id,
                WaitReason.QUOTA,
                f"team {job.team} holds {held[key]} {job.gpu_type} GPUs; "
                f"{job.total_gpus} more would pass its limit of {ceiling}",
            )
            continue
        if job.gpus_per_replica > cap.largest_node.get(job.gpu_type, 0):
            waits[job.id] = Wait(
                job.id,
                WaitReason.NO_FIT,
                f"no {job.gpu_type} node has {job.gpus_per_replica} GPUs for one replica",
            )
            continue
        placement = cap.place(job.gpu_type, job.gpus_per_replica, job.replicas)
        if placement is None:
            waits[job.id] = Wait(
                job.id,
                WaitReason.CAPACITY,
                f"waiting for {job.replicas} × {job.gpus_per_replica} free "
                f"{job.gpu_type} GPUs on nodes",
            )
            continue
        held[key] += job.total_gpus
        admissions.append(Admission(job.id, job.team, job.gpu_type, placement))
    return Plan(admissions=tuple(admissions), waits=waits)
