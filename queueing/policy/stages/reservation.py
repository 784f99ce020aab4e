"""Rule A9, the reservation (EASY backfill): the first large gang of a GPU type waiting
for capacity reserves GPUs at its shadow time, and a job behind it that would still run
then only starts beside them. Part of stage 4 (node fit); rule R9.1 reads the shadow
time too."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from queueing.policy.snapshot import QueuedJob, Topology
from queueing.policy.workspace import Capacity, Workspace

if TYPE_CHECKING:
    from .state import Pass, Try


def reserve(p: Pass, t: Try, pools: tuple[str, ...]) -> None:
    """Rule A9: the try waits for capacity; if it is the first large gang of its GPU type
    to (at least a whole node of the type's largest, asking only GPUs), reserve GPUs for
    it at its shadow time - in the pool of its `pools` (rule K1: one cluster) where that
    comes first, ties by their order (rule K2)."""
    job, gt = t.job, t.gt
    if t.multi or t.cpu or t.mem or job.topology is not None or \
            t.total < p.largest.get(gt, 0) or gt in p.cap.packed:  # rule H7
        return
    p.decided.add(gt)
    best = None
    for q in pools:
        r = shadow_reservation(p.ws, job, p.now, p.admitted_ends.get(gt, ()), q, gt)
        if r is not None and (best is None or r.at < best.at):
            best = r
    if best is not None:
        p.reserved[gt] = best
        p.waits.reservations[gt] = (job.id, best.at)


class Reservation:
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


def reserve_earliest(p: Pass, tries: list[Try]) -> None:
    """Rules A9, G5: a job accepting several GPU types that waits for capacity on some of
    them (`tries`, those where rule A9 would reserve for it) reserves on the one type
    whose shadow time comes first (ties: the preferred type), in the pool of that type
    where it comes first. Every type it was the first large gang of is decided."""
    best: tuple[Reservation, str] | None = None
    for t in tries:
        job, gt = t.job, t.gt
        if t.cpu or t.mem or job.topology is not None or t.total < p.largest.get(gt, 0) \
                or gt in p.decided or gt in p.cap.packed:  # rule H7
            continue
        p.decided.add(gt)
        for q in t.k2 or t.fitting:
            r = shadow_reservation(p.ws, job, p.now, p.admitted_ends.get(gt, ()), q, gt)
            if r is not None and (best is None or r.at < best[0].at):
                best = (r, gt)
    if best is not None:
        p.reserved[best[1]] = best[0]
        p.waits.reservations[best[1]] = (tries[0].job.id, best[0].at)


def shadow_reservation(ws: Workspace, job: QueuedJob, now: datetime,
             admitted: Iterable[tuple[datetime, int, tuple[str, ...], int]],
             pool: str, gpu_type: str = "") -> Reservation | None:
    """Rule A9's shadow time for `job`: the earliest instant at which the jobs holding
    GPUs of its type, ended by their estimates (start + max_runtime_seconds; admitted in
    this pass: now + estimate) in order, free enough GPUs for the gang, and the nodes
    best fit (A3) gives it then. None when no such instant is known (the jobs in the way
    have no estimate). The victims of this pass's preemptions are not counted as freed.
    Only the nodes of `pool` count (rule K1: the gang runs in one cluster)."""
    cap = ws.capacity
    gt, g, reps = gpu_type or job.gpu_type, job.gpus_per_replica, job.replicas
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
    return Reservation(at, room, now, pool)


def spared_until_shadow(ws: Workspace, job: QueuedJob, now: datetime,
                         admitted: Iterable[tuple[datetime, int, tuple[str, ...], int]],
                         pools: tuple[str, ...], gpu_type: str = "") -> float:
    """Rule R9.1: the seconds from now to `job`'s shadow time (rule A9; the earliest of
    its pools), 0 when none is known."""
    at = None
    for p in pools:
        r = shadow_reservation(ws, job, now, admitted, p, gpu_type)
        if r is not None and (at is None or r.at < at):
            at = r.at
    return 0.0 if at is None else max(0.0, (at - now).total_seconds())


def place_beside(cap: Capacity, res: Reservation, gpu_type: str, gpus: int, replicas: int,
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
    placement = place_within(cap, gpu_type, gpus, replicas, cpu, memory, topology,
                             lambda n: room.get(n, 0))
    if placement is None:
        return None
    for n in placement:
        room[n] -= gpus
    return placement


def place_within(cap: Capacity, pool: str, gpus: int, replicas: int, cpu: int, memory: int,
                 topology: Topology | None, room: Callable[[str], int],
                 ) -> tuple[str, ...] | None:
    """Rules A9, W1 with CPU, memory or a topology (rules A6, A7): the usual placement,
    kept only if it takes at most `room(node)` GPUs on each node; None, changing
    nothing, when it cannot."""
    placement = cap.place(pool, gpus, replicas, cpu=cpu, memory=memory, topology=topology)
    if placement is None:
        return None
    need: dict[str, int] = defaultdict(int)
    for n in placement:
        need[n] += gpus
    if any(room(n) < k for n, k in need.items()):
        cap.release(placement, gpus, cpu=cpu, memory=memory, slots=cap.last_slots)
        return None
    return placement

