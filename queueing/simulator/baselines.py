"""The baselines a fairq run is measured against (docs/simulator.md, "Baselines"), on the
same workload and cluster, with the same gang placement (rules A2-A3: one node per
replica, best fit) and no tiers, fair share or preemption:

- `fifo`   — strict FIFO by submit time: the first job that does not fit blocks all.
- `greedy` — greedy backfill: in submit order, every job that fits starts.
- `easy`   — EASY backfill (Slurm's backfill with one reservation): the first job that
             does not fit gets a reservation at the earliest instant the running jobs'
             runtime estimates free enough GPUs for it (the *shadow time*, on the nodes
             it would get then); a later job starts now only if it fits now and either
             ends, by its estimate, before the shadow time or leaves the reserved GPUs
             free at the shadow time.

A job is placed only on the GPU types it accepts (`SimJob.accepted_types`), on the first
of them, in its order, that holds the gang now. The queue is kept in submit order; within
one pass free GPUs only shrink, so once a job of some (accepted types, shape) cannot start
no later job of that shape is tried in the pass, and a pass stops when no shape is left.
In EASY's backfill, likewise, once a job of some shape that would outlast the shadow time
is refused for the reserved GPUs, later ones of that shape that would too are not tried.

On a time-sliced type (docs/simulator.md, "Fractional GPUs") a node counts in slices (S
per GPU) and a fraction goes on ONE GPU, packed onto GPUs already shared first
(`slices.pack_fraction`); a whole GPU is a GPU with every slice free
(`slices.pick_whole`). EASY's shadow time and its check of the reserved GPUs count a
time-sliced node's free slices, not each GPU's (an approximation: the head's fraction may
find its slices spread over GPUs at the shadow time).
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from queueing.policy.snapshot import NodeState
from queueing.policy.workspace import Capacity

from .model import Attempt, JobRecord, RunResult, SimJob, Workload
from .slices import Hold, SliceBook, pack_fraction, pick_whole

BASELINES = ("fifo", "greedy", "easy")

_ARRIVAL, _FINISH = 0, 1

Shape = tuple[tuple[str, ...], int, int]


@dataclass(slots=True)
class _Run:
    job: SimJob
    placement: tuple[str, ...]
    gpu_type: str
    start: float
    holds: tuple[Hold, ...] = ()  # on time-sliced nodes: the GPUs and slices it holds


def shape_of(j: SimJob) -> Shape:
    return (j.accepted_types, j.units_per_replica, j.replicas)


def _fits(free: dict[str, int], nodes: list[str], gpus: int, replicas: int) -> bool:
    return sum(free[n] // gpus for n in nodes) >= replicas


def _place(free: dict[str, int], nodes: list[str], gpus: int,
           replicas: int) -> tuple[str, ...] | None:
    """Best fit (rule A3) on a plain map of free GPUs: each replica on the node with the
    fewest free GPUs that holds it, ties by name; None, changing nothing, if it does not
    fit."""
    if not _fits(free, nodes, gpus, replicas):
        return None
    taken = []
    for _ in range(replicas):
        name = min((n for n in nodes if free[n] >= gpus), key=lambda n: (free[n], n))
        free[name] -= gpus
        taken.append(name)
    return tuple(taken)


Placed = tuple[str, tuple[str, ...], tuple[Hold, ...]]


def place_sliced(cap: Capacity, book: SliceBook, gt: str, nodes: list[str],
                 j: SimJob) -> Placed | None:
    """A job on a time-sliced type: each replica's fraction packed on one GPU, or its
    whole GPUs on GPUs with every slice free; None, changing nothing, if it does not fit."""
    holds: list[Hold] = []
    for _ in range(j.replicas):
        if j.gpu_slices:
            got = pack_fraction(book, nodes, j.gpu_slices)
            hold = None if got is None else book.take(got[0], slices=j.gpu_slices, gpu=got[1])
        else:
            name = pick_whole(book, nodes, j.gpus_per_replica)
            hold = None if name is None else book.take(name, slices=0,
                                                       whole=j.gpus_per_replica)
        if hold is None:
            for x in holds:
                book.give(x)
            return None
        holds.append(hold)
    for name in {x[0] for x in holds}:
        cap.set_free(name, book.units_free(name))
    return gt, tuple(x[0] for x in holds), tuple(holds)


def place_accepted(cap: Capacity, j: SimJob, book: SliceBook | None = None,
                   nodes_of: dict[str, list[str]] | None = None) -> Placed | None:
    """(GPU type, placement, holds) on the first accepted type that holds the gang now
    (`book` and `nodes_of` for time-sliced types)."""
    for gt in j.accepted_types:
        if book is not None and nodes_of is not None and gt in nodes_of \
                and book.shared(nodes_of[gt][0]):
            got = place_sliced(cap, book, gt, nodes_of[gt], j)
            if got is not None:
                return got
            continue
        if gt in cap.total:
            placement = cap.place(gt, j.units_per_replica, j.replicas)
            if placement is not None:
                return gt, placement, ()
    return None


def run_baseline(policy: str, workload: Workload, *,
                 progress: Callable[[float], None] | None = None) -> RunResult:
    """Replay `workload` under one of `BASELINES` until every job has finished."""
    if policy not in BASELINES:
        raise ValueError(f"unknown baseline {policy!r}; one of {', '.join(BASELINES)}")
    t_wall = time.perf_counter()
    sc = workload.scenario
    units = {n.name: n.gpus * sc.slices_per_gpu(n.gpu_type) for n in sc.nodes}
    cap = Capacity(NodeState(n.name, n.gpu_type, units[n.name], units[n.name])
                   for n in sc.nodes)
    book = SliceBook(sc.nodes, sc.slices)
    nodes_of: dict[str, list[str]] = {}
    for n in sorted(sc.nodes, key=lambda n: n.name):
        nodes_of.setdefault(n.gpu_type, []).append(n.name)
    jobs = {j.id: j for j in workload.jobs}
    events: list[tuple[float, int, int]] = [(j.submit, _ARRIVAL, j.id) for j in workload.jobs]
    heapq.heapify(events)
    # Waiting jobs in submit order (arrivals pop in (submit, id) order; nothing requeues).
    queue: dict[int, SimJob] = {}
    shapes: Counter[Shape] = Counter()
    running: dict[int, _Run] = {}
    attempts: dict[int, Attempt] = {}
    cycles = 0
    now = 0.0

    def start(j: SimJob, gt: str, placement: tuple[str, ...], holds: tuple[Hold, ...]) -> None:
        del queue[j.id]
        key = shape_of(j)
        shapes[key] -= 1
        if not shapes[key]:
            del shapes[key]
        running[j.id] = _Run(j, placement, gt, now, holds)
        heapq.heappush(events, (now + j.runtime, _FINISH, j.id))

    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, job_id = heapq.heappop(events)
            j = jobs[job_id]
            if kind == _ARRIVAL:
                queue[j.id] = j
                shapes[shape_of(j)] += 1
            else:
                r = running.pop(job_id)
                release(cap, book, r)
                attempts[job_id] = Attempt(r.start, now, preempted=False, gpu_type=r.gpu_type)
        if not queue:
            continue
        cycles += 1
        head: SimJob | None = None
        dead: set[Shape] = set()
        # In submit order, every job that fits starts; FIFO and EASY stop at the first
        # that does not (EASY then reserves for it and backfills).
        for j in list(queue.values()):
            key = shape_of(j)
            if key in dead:
                continue
            got = place_accepted(cap, j, book, nodes_of)
            if got is not None:
                start(j, *got)
                continue
            if policy != "greedy":
                head = j
                break
            dead.add(key)
            if len(dead) == len(shapes):
                break
        if policy == "easy" and head is not None:
            _easy_backfill(head, now=now, cap=cap, book=book, nodes_of=nodes_of, queue=queue,
                           shapes=shapes, running=running, start=start)
        if progress is not None:
            progress(now)

    records = tuple(JobRecord(j, (attempts[j.id],) if j.id in attempts else (),
                              attempts[j.id].end if j.id in attempts else None)
                    for j in workload.jobs)
    return RunResult(policy, records, cycles, now, time.perf_counter() - t_wall)


def release(cap: Capacity, book: SliceBook, r: _Run) -> None:
    """An ended job's GPUs (or slices, back on the GPUs they came from) are free again."""
    if not r.holds:
        cap.release(r.placement, r.job.units_per_replica)
        return
    for x in r.holds:
        book.give(x)
    for name in {x[0] for x in r.holds}:
        cap.set_free(name, book.units_free(name))


def _easy_backfill(head: SimJob, *, now: float, cap: Capacity, book: SliceBook,
                   nodes_of: dict[str, list[str]],
                   queue: dict[int, SimJob], shapes: Counter[Shape], running: dict[int, _Run],
                   start: Callable[[SimJob, str, tuple[str, ...], tuple[Hold, ...]], None]
                   ) -> None:
    g, reps = head.units_per_replica, head.replicas
    types = [gt for gt in head.accepted_types if gt in nodes_of]
    shadow_free = {n: cap.free[n] for ns in nodes_of.values() for n in ns}
    shadow: float | None = None
    reserved_on: list[str] = []
    # The shadow time: release running jobs by estimated end until the head fits on one
    # of its types (the first, in its order, that holds it then).
    for r in sorted(running.values(), key=lambda r: (r.start + r.job.estimate, r.job.id)):
        for name in r.placement:
            shadow_free[name] += r.job.units_per_replica
        if r.gpu_type not in types:
            continue
        for gt in types:
            if _fits(shadow_free, nodes_of[gt], g, reps):
                shadow, reserved_on = r.start + r.job.estimate, nodes_of[gt]
                break
        if shadow is not None:
            break
    if shadow is None:
        return  # it never fits this cluster (the loader drops such jobs): no reservation
    _place(shadow_free, reserved_on, g, reps)  # the reservation's GPUs at the shadow time
    # No longer fit now (the head's shape: it did not fit, and free GPUs only shrink).
    dead: set[Shape] = {shape_of(head)}
    refused: set[Shape] = set()  # would outlast the shadow time and was refused
    for j in list(queue.values()):
        if j.id == head.id:
            continue
        key = shape_of(j)
        if key in dead:
            continue
        long = now + j.estimate > shadow
        if long and key in refused:
            continue
        got = place_accepted(cap, j, book, nodes_of)
        if got is None:
            dead.add(key)
            if len(dead) == len(shapes):
                break
            continue
        gt, placement, holds = got
        if long:
            # Still running at the shadow time: only on GPUs the reservation leaves free.
            if any(shadow_free[n] < j.units_per_replica * placement.count(n)
                   for n in set(placement)):
                release(cap, book, _Run(j, placement, gt, now, holds))
                refused.add(key)
                continue
            for n in placement:
                shadow_free[n] -= j.units_per_replica
        start(j, gt, placement, holds)
