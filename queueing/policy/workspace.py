"""The mutable working copy of a snapshot that one planning pass changes.

Admission (rules A2-A4) consumes node capacity and quota; the preemption search (rules
R1-R4) removes candidate victims and puts them back (`simulate_removal` returns the undo,
like Kueue's `SimulateWorkloadRemoval`). The snapshot itself is never changed.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime

from .snapshot import NodeState, RunningJob, Snapshot


class Capacity:
    """Free GPUs per node, bucketed by (GPU type, free GPUs) for best-fit placement.

    Each bucket keeps its node names sorted, so "the node with the fewest free GPUs that
    still holds a replica, ties by name" (rule A3) is the first name of the first
    non-empty bucket at or above the replica's size: O(largest node) per replica.
    """

    def __init__(self, nodes: Iterable[NodeState]) -> None:
        self.free: dict[str, int] = {}
        self.capacity: dict[str, int] = {}
        self.node_type: dict[str, str] = {}
        self.largest_node: dict[str, int] = defaultdict(int)
        self.total: dict[str, int] = defaultdict(int)
        # Bumped whenever a node gains free GPUs: a gang that did not fit before cannot
        # fit now unless this changed.
        self.grown = 0
        self._buckets: dict[str, list[list[str]]] = {}
        self._empty_slots: dict[tuple[str, int], int] = {}
        for n in sorted(nodes, key=lambda n: n.name):
            free = max(0, min(n.free, n.capacity))
            self.free[n.name] = free
            self.capacity[n.name] = n.capacity
            self.node_type[n.name] = n.gpu_type
            self.largest_node[n.gpu_type] = max(self.largest_node[n.gpu_type], n.capacity)
            self.total[n.gpu_type] += n.capacity
        for name in self.free:
            t = self.node_type[name]
            buckets = self._buckets.setdefault(t, [[] for _ in range(self.largest_node[t] + 1)])
            buckets[self.free[name]].append(name)  # names arrive sorted

    def slots_when_empty(self, gpu_type: str, gpus: int) -> int:
        """How many replicas of `gpus` GPUs the nodes of `gpu_type` hold when all are
        empty: a gang needing more can never run on this cluster (rule A4)."""
        key = (gpu_type, gpus)
        slots = self._empty_slots.get(key)
        if slots is None:
            slots = sum(self.capacity[n] // gpus for n, t in self.node_type.items()
                        if t == gpu_type)
            self._empty_slots[key] = slots
        return slots

    def fits(self, gpu_type: str, gpus: int, replicas: int) -> bool:
        """Rule A2: can `replicas` replicas of `gpus` GPUs each be placed at all?

        A node with f free GPUs holds f // gpus replicas, and best fit uses exactly one of
        them per replica, so the gang fits iff the sum reaches `replicas`.
        """
        buckets = self._buckets.get(gpu_type)
        if buckets is None or gpus >= len(buckets):
            return False
        if gpus <= 0 or replicas <= 0:
            return True
        room = 0
        for f in range(gpus, len(buckets)):
            if buckets[f]:
                room += len(buckets[f]) * (f // gpus)
                if room >= replicas:
                    return True
        return False

    def set_free(self, name: str, free: int) -> None:
        t = self.node_type[name]
        buckets = self._buckets[t]
        old = self.free[name]
        if old == free:
            return
        if free > old:
            self.grown += 1
        lst = buckets[old]
        lst.pop(bisect.bisect_left(lst, name))
        bisect.insort(buckets[free], name)
        self.free[name] = free

    def place(self, gpu_type: str, gpus: int, replicas: int) -> tuple[str, ...] | None:
        """Rules A2-A3: one node per replica, all or none, best fit.

        Each replica goes to the node of its type with the fewest free GPUs that still
        holds it (ties by node name), which keeps whole nodes free for large gangs.
        Returns None, changing nothing, when the gang does not fit.
        """
        if not self.fits(gpu_type, gpus, replicas):
            return None
        buckets = self._buckets[gpu_type]
        taken: list[str] = []
        for _ in range(replicas):
            for f in range(gpus, len(buckets)):
                if buckets[f]:
                    name = buckets[f][0]
                    self.set_free(name, f - gpus)
                    taken.append(name)
                    break
        return tuple(taken)

    def release(self, placement: Iterable[str], gpus: int) -> None:
        """Give back `gpus` on each node of `placement` (the inverse of `place`)."""
        for name in placement:
            if name in self.free:
                self.set_free(name, min(self.capacity[name], self.free[name] + gpus))


class Ledger:
    """GPUs held per (team, GPU type) and the pool rules of Q1.

    A team's unused nominal beyond its lending limit is *guarded*: only the team itself
    may use it. `guarded_total[type]` is kept as a running sum so the check is O(1).
    """

    def __init__(self, snapshot: Snapshot, capacity: Capacity) -> None:
        self._snapshot = snapshot
        self.capacity_total: dict[str, int] = dict(capacity.total)
        self.held: dict[tuple[str, str], int] = defaultdict(int)
        self.used: dict[str, int] = defaultdict(int)
        self.guarded_total: dict[str, int] = defaultdict(int)
        # Rule Q1: nominal + borrowing limit per (team, type); absent = no ceiling.
        self.ceiling: dict[tuple[str, str], int | None] = {
            k: q.ceiling for k, q in snapshot.quotas.items()}
        # What running jobs alone hold (rule R2 looks only at these: a team is not made
        # reclaimable by what this very pass admits for it).
        self.running_held: dict[tuple[str, str], int] = defaultdict(int)
        for r in snapshot.running:
            self.held[(r.team, r.gpu_type)] += r.total_gpus
            self.running_held[(r.team, r.gpu_type)] += r.total_gpus
            self.used[r.gpu_type] += r.total_gpus
        for (team, gpu_type), _q in snapshot.quotas.items():
            self.guarded_total[gpu_type] += self.guarded(team, gpu_type)

    def guarded(self, team: str, gpu_type: str) -> int:
        """Rule Q1: unused nominal of `team` that others may not borrow."""
        q = self._snapshot.quota(team, gpu_type)
        if q.lending_limit is None:
            return 0
        return max(0, q.nominal - self.held[(team, gpu_type)] - q.lending_limit)

    def _move(self, team: str, gpu_type: str, gpus: int) -> None:
        before = self.guarded(team, gpu_type)
        self.held[(team, gpu_type)] += gpus
        self.used[gpu_type] += gpus
        self.guarded_total[gpu_type] += self.guarded(team, gpu_type) - before

    def add(self, team: str, gpu_type: str, gpus: int) -> None:
        self._move(team, gpu_type, gpus)

    def remove(self, team: str, gpu_type: str, gpus: int) -> None:
        self._move(team, gpu_type, -gpus)

    def over_ceiling(self, team: str, gpu_type: str, gpus: int) -> int | None:
        """Rule Q1: the team's ceiling (nominal + borrowing limit) when `gpus` more would
        pass it, else None."""
        ceiling = self.ceiling.get((team, gpu_type))
        if ceiling is not None and self.held[(team, gpu_type)] + gpus > ceiling:
            return ceiling
        return None

    def lending_blocks(self, team: str, gpu_type: str, gpus: int) -> bool:
        """Rule Q1: would `gpus` more for `team` eat into GPUs other teams guard?

        Only the pool check: whether the GPUs exist on nodes is rule A2's business.
        """
        others = self.guarded_total[gpu_type] - self.guarded(team, gpu_type)
        if others <= 0:
            return False
        return self.used[gpu_type] + gpus + others > self.capacity_total.get(gpu_type, 0)

    def within_nominal(self, team: str, gpu_type: str, gpus: int) -> bool:
        return self.held[(team, gpu_type)] + gpus <= self._snapshot.quota(team, gpu_type).nominal

    def borrowing(self, team: str, gpu_type: str) -> bool:
        """Rule R2: do the team's running jobs (minus victims taken) exceed its nominal?"""
        return self.running_held[(team, gpu_type)] > self._snapshot.quota(team, gpu_type).nominal


class Workspace:
    """Capacity and ledger together, with what-if removal of running jobs."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.capacity = Capacity(snapshot.nodes)
        self.ledger = Ledger(snapshot, self.capacity)
        self.running_by_type: dict[str, list[RunningJob]] = defaultdict(list)
        self.running_by_id: dict[int, RunningJob] = {}
        for r in snapshot.running:
            self.running_by_type[r.gpu_type].append(r)
            self.running_by_id[r.id] = r
        self.removed: set[int] = set()
        # The victim search's per-(GPU type, now) list of unprotected running jobs
        # (`preemption._unprotected`).
        self.victim_pools: dict[tuple[str, datetime], list[tuple[RunningJob, float]]] = {}
        # The lowest tier among each (team, type)'s preemptible jobs: a job over its own
        # team's ceiling can only make room by preempting those (rules Q1, R1).
        self.lowest_tier: dict[tuple[str, str], int] = {}
        for r in snapshot.running:
            if r.preemptible:
                k = (r.team, r.gpu_type)
                self.lowest_tier[k] = min(self.lowest_tier.get(k, r.tier_rank), r.tier_rank)

    def _free_nodes_of(self, job: RunningJob) -> list[tuple[str, int]]:
        """Give `job`'s GPUs back to its nodes; returns (node, GPUs given) for the undo."""
        given: list[tuple[str, int]] = []
        for name in job.nodes:
            if name not in self.capacity.free:
                continue
            new = min(self.capacity.capacity[name], self.capacity.free[name] + job.gpus_per_replica)
            delta = new - self.capacity.free[name]
            if delta:
                self.capacity.set_free(name, new)
                given.append((name, delta))
        return given

    def simulate_removal(self, jobs: Iterable[RunningJob]) -> Callable[[], None]:
        """Remove running `jobs` from the working copy; the returned function undoes it."""
        done: list[tuple[RunningJob, list[tuple[str, int]]]] = []
        for job in jobs:
            if job.id in self.removed:
                continue
            self.removed.add(job.id)
            self.ledger.remove(job.team, job.gpu_type, job.total_gpus)
            self.ledger.running_held[(job.team, job.gpu_type)] -= job.total_gpus
            done.append((job, self._free_nodes_of(job)))

        def undo() -> None:
            for job, given in reversed(done):
                for name, delta in given:
                    self.capacity.set_free(name, self.capacity.free[name] - delta)
                self.ledger.add(job.team, job.gpu_type, job.total_gpus)
                self.ledger.running_held[(job.team, job.gpu_type)] += job.total_gpus
                self.removed.discard(job.id)

        return undo

    def fits(self, team: str, gpu_type: str, gpus: int, replicas: int) -> bool:
        """Rules Q1 and A2 together, without placing anything."""
        total = gpus * replicas
        return (self.ledger.over_ceiling(team, gpu_type, total) is None
                and not self.ledger.lending_blocks(team, gpu_type, total)
                and self.capacity.fits(gpu_type, gpus, replicas))
