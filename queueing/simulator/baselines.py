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

Jobs are kept in groups of the same (GPU type, shape, estimate), each in submit order:
within one pass, free GPUs only shrink, so a group whose first job cannot start has no
job that can, and a pass costs O(admissions × groups) however long the queue.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from queueing.policy.snapshot import NodeState
from queueing.policy.workspace import Capacity

from .model import Attempt, JobRecord, RunResult, SimJob, Workload

BASELINES = ("fifo", "greedy", "easy")

_ARRIVAL, _FINISH = 0, 1

GroupKey = tuple[str, int, int, float]


@dataclass(slots=True)
class _Run:
    job: SimJob
    placement: tuple[str, ...]
    start: float


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


def run_baseline(policy: str, workload: Workload, *,
                 progress: Callable[[float], None] | None = None) -> RunResult:
    """Replay `workload` under one of `BASELINES` until every job has finished."""
    if policy not in BASELINES:
        raise ValueError(f"unknown baseline {policy!r}; one of {', '.join(BASELINES)}")
    t_wall = time.perf_counter()
    sc = workload.scenario
    cap = Capacity(NodeState(n.name, n.gpu_type, n.gpus, n.gpus) for n in sc.nodes)
    nodes_of: dict[str, list[str]] = {}
    for n in sorted(sc.nodes, key=lambda n: n.name):
        nodes_of.setdefault(n.gpu_type, []).append(n.name)
    jobs = {j.id: j for j in workload.jobs}
    events: list[tuple[float, int, int]] = [(j.submit, _ARRIVAL, j.id) for j in workload.jobs]
    heapq.heapify(events)
    groups: dict[GroupKey, deque[SimJob]] = {}
    running: dict[int, _Run] = {}
    attempts: dict[int, Attempt] = {}
    cycles = 0
    now = 0.0

    def start(j: SimJob, placement: tuple[str, ...]) -> None:
        running[j.id] = _Run(j, placement, now)
        heapq.heappush(events, (now + j.runtime, _FINISH, j.id))

    def pop_head(key: GroupKey) -> SimJob:
        q = groups[key]
        j = q.popleft()
        if not q:
            del groups[key]
        return j

    def earliest(alive: set[GroupKey], skip: int | None = None) -> GroupKey | None:
        best: tuple[float, int, GroupKey] | None = None
        for key in alive:
            q = groups.get(key)
            if not q:
                continue
            j = q[0] if q[0].id != skip else (q[1] if len(q) > 1 else None)
            if j is not None and (best is None or (j.submit, j.id) < best[:2]):
                best = (j.submit, j.id, key)
        return best[2] if best is not None else None

    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, kind, job_id = heapq.heappop(events)
            j = jobs[job_id]
            if kind == _ARRIVAL:
                groups.setdefault((j.gpu_type, j.gpus_per_replica, j.replicas, j.estimate),
                                  deque()).append(j)
            else:
                r = running.pop(job_id)
                cap.release(r.placement, j.gpus_per_replica)
                attempts[job_id] = Attempt(r.start, now, preempted=False)
        if not groups:
            continue
        cycles += 1
        alive = set(groups)
        head: SimJob | None = None
        # In submit order, every job that fits starts; FIFO and EASY stop at the first
        # that does not (EASY then reserves for it and backfills).
        while (key := earliest(alive)) is not None:
            j = groups[key][0]
            placement = cap.place(j.gpu_type, j.gpus_per_replica, j.replicas)
            if placement is not None:
                start(pop_head(key), placement)
                continue
            if policy == "greedy":
                alive.discard(key)
                continue
            head = j
            break
        if policy == "easy" and head is not None:
            _easy_backfill(head, now=now, cap=cap, nodes_of=nodes_of, groups=groups,
                           running=running, start=start, pop_head=pop_head, earliest=earliest)
        if progress is not None:
            progress(now)

    records = tuple(JobRecord(j, (attempts[j.id],) if j.id in attempts else (),
                              attempts[j.id].end if j.id in attempts else None)
                    for j in workload.jobs)
    return RunResult(policy, records, cycles, now, time.perf_counter() - t_wall)


def _easy_backfill(head: SimJob, *, now: float, cap: Capacity, nodes_of: dict[str, list[str]],
                   groups: dict[GroupKey, deque[SimJob]], running: dict[int, _Run],
                   start: Callable[[SimJob, tuple[str, ...]], None],
                   pop_head: Callable[[GroupKey], SimJob],
                   earliest: Callable[..., GroupKey | None]) -> None:
    gt, g, reps = head.gpu_type, head.gpus_per_replica, head.replicas
    nodes = nodes_of.get(gt, [])
    shadow_free = {n: cap.free[n] for ns in nodes_of.values() for n in ns}
    shadow: float | None = None
    # The shadow time: release running jobs by estimated end until the head fits.
    for r in sorted(running.values(), key=lambda r: (r.start + r.job.estimate, r.job.id)):
        for name in r.placement:
            shadow_free[name] += r.job.gpus_per_replica
        if r.job.gpu_type == gt and _fits(shadow_free, nodes, g, reps):
            shadow = r.start + r.job.estimate
            break
    if shadow is None:
        return  # it never fits this cluster (the loader drops such jobs): no reservation
    _place(shadow_free, nodes, g, reps)  # the reservation's GPUs at the shadow time
    alive = set(groups)
    while (key := earliest(alive, skip=head.id)) is not None:
        q = groups[key]
        j = q[0] if q[0].id != head.id else q[1]
        placement = cap.place(j.gpu_type, j.gpus_per_replica, j.replicas)
        if placement is None:
            alive.discard(key)
            continue
        if now + j.estimate > shadow:
            # Still running at the shadow time: only on GPUs the reservation leaves free.
            if any(shadow_free[n] < j.gpus_per_replica * placement.count(n)
                   for n in set(placement)):
                cap.release(placement, j.gpus_per_replica)
                alive.discard(key)
                continue
            for n in placement:
                shadow_free[n] -= j.gpus_per_replica
        if q[0].id == head.id:
            q.remove(j)
        else:
            pop_head(key)
        start(j, placement)
