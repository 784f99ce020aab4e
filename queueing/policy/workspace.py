"""The mutable working copy of a snapshot that one planning pass changes.

Admission (rules A2-A4, A6-A7) consumes node capacity (GPUs, CPU, memory) and quota;
the preemption search (rules R1-R4) removes candidate victims and puts them back
(`simulate_removal` returns the undo, like Kueue's `SimulateWorkloadRemoval`). The
snapshot itself is never changed.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime

from .quota_tree import QuotaTree
from .snapshot import NodeState, RunningJob, Snapshot, Topology, TopologyMode


def pool_key(gpu_type: str, cluster: str = "", spot: bool = False) -> str:
    """Rules K1, K4: the key of the nodes of one GPU type, one cluster and one kind; the
    type's own name for the only cluster's regular nodes."""
    if not cluster and not spot:
        return gpu_type
    return f"{gpu_type}@{cluster}" + ("~spot" if spot else "")


def replicas_when_empty(capacity: int, gpus: int, cpu: int = 0, memory: int = 0,
                        cpu_allocatable: int | None = None,
                        memory_allocatable: int | None = None,
                        slices_per_gpu: int = 1) -> int:
    """Rules A3, A4, A6: how many replicas of `gpus` GPUs (and `cpu` millicores, `memory`
    bytes) one node of `capacity` GPUs holds when it is empty - the count its empty nodes
    hold that says whether a gang can ever run (the plan's `Capacity.slots_when_empty`,
    the submit check's `selectors/cluster.py::gang_room`). An allocatable of None is not
    known: no constraint. 0 for a replica of no GPUs. Rule H2: on a node of
    `slices_per_gpu` > 1 (`capacity` in slices) a fraction of `gpus` slices fits
    S // gpus times on each GPU, whole GPUs (a multiple of S) take wholly free GPUs."""
    if gpus <= 0:
        return 0
    if slices_per_gpu > 1:
        n = packed_count([slices_per_gpu] * (capacity // slices_per_gpu), slices_per_gpu, gpus)
    else:
        n = capacity // gpus
    if cpu > 0 and cpu_allocatable is not None:
        n = min(n, cpu_allocatable // cpu)
    if memory > 0 and memory_allocatable is not None:
        n = min(n, memory_allocatable // memory)
    return n


def packed_count(gpu_free: list[int], slices_per_gpu: int, units: int) -> int:
    """Rule H2: how many replicas of `units` slices the GPUs of one node hold, each GPU
    having `gpu_free` free slices: a fraction (fewer than a GPU's slices) on one GPU
    with that many free; whole GPUs only on wholly free GPUs (a GPU shared by fractions
    holds none)."""
    if units < slices_per_gpu:
        return sum(f // units for f in gpu_free)
    whole = -(-units // slices_per_gpu)
    return sum(1 for f in gpu_free if f >= slices_per_gpu) // whole


def per_gpu_free(capacity: int, free: int, slices_per_gpu: int,
                 gpu_free: tuple[int, ...] = ()) -> list[int]:
    """Rule H1: a slice-packed node's free slices per GPU (index = the GPU's), summing to
    at most `free`. `gpu_free` as the snapshot gives it (each cut to [0, S]); a node
    that reports fewer free slices than that lost the rest to work fairq does not know
    of, taken from its highest GPUs; none given: the free slices on as few GPUs as
    possible, the highest ones (the lower GPUs taken first)."""
    s = slices_per_gpu
    n = capacity // s
    free = max(0, min(free, n * s))
    if len(gpu_free) == n:
        out = [max(0, min(s, f)) for f in gpu_free]
    else:
        whole, rest = divmod(free, s)
        out = [0] * n
        for i in range(n - whole, n):
            out[i] = s
        if rest and n - whole - 1 >= 0:
            out[n - whole - 1] = rest
    extra = sum(out) - free
    for i in range(n - 1, -1, -1):
        if extra <= 0:
            break
        take = min(extra, out[i])
        out[i] -= take
        extra -= take
    return out


class Capacity:
    """Free GPUs, CPU and memory per node, bucketed by (GPU type, free GPUs) for best fit.

    Each bucket keeps its node names sorted, so "the node with the fewest free GPUs that
    still holds a replica, ties by name" (rule A3) is the first name of the first
    non-empty bucket at or above the replica's size: O(largest node) per replica. A
    replica that asks for CPU or memory (rule A6) on nodes that report them takes the
    first node in that same order whose CPU and memory also hold it; a topology request
    (rule A7) first chooses the domains, then places the same way within them.

    Rules K1 and K4: nodes are grouped in *pools* of one GPU type, one cluster and one
    kind (spot or not), and a gang is placed within one pool, so within one cluster.
    Every method that takes a `gpu_type` takes a pool key (`pool_key`); the pool of a
    type's nodes in the only cluster ("", not spot) is the type's own name, so a world
    of one cluster without spot nodes is bucketed exactly as before. `total` and
    `largest_node` stay per GPU type (the quota pool of rule K7 is per type across
    clusters); `pool_total` and `pool_largest` are per pool.

    Shared GPUs (rules H1-H3): a node with `slices_per_gpu` S > 1 (a time-sliced or MPS
    type) counts its capacity and free in slices and keeps its free slices per GPU
    (`gpu_free`); its pool and type are *packed* and take `_place_packed`'s per-GPU
    best fit. A world without such nodes never reaches that code: `packed` is empty.
    """

    def __init__(self, nodes: Iterable[NodeState]) -> None:
        self.free: dict[str, int] = {}
        self.capacity: dict[str, int] = {}
        self.node_type: dict[str, str] = {}
        # Rule A6: None = the node does not say (no constraint).
        self.cpu_free: dict[str, int | None] = {}
        self.memory_free: dict[str, int | None] = {}
        self.cpu_allocatable: dict[str, int | None] = {}
        self.memory_allocatable: dict[str, int | None] = {}
        self.topology: dict[str, Mapping[str, str]] = {}
        # GPU types with at least one node that reports CPU or memory: only their jobs
        # take the slower per-node path of rule A6.
        self.constrained: set[str] = set()
        self.largest_node: dict[str, int] = defaultdict(int)
        self.total: dict[str, int] = defaultdict(int)
        self.nodes_of: dict[str, list[str]] = defaultdict(list)  # per pool, by name
        # Rules K1, K4: each node's pool; each pool's (GPU type, cluster, spot); the pools
        # of each GPU type (sorted); free GPUs, capacity and largest node per pool.
        self.node_pool: dict[str, str] = {}
        self.pool_info: dict[str, tuple[str, str, bool]] = {}
        self.pools_of_type: dict[str, list[str]] = defaultdict(list)
        self.pool_free: dict[str, int] = defaultdict(int)
        self.pool_total: dict[str, int] = defaultdict(int)
        self.pool_largest: dict[str, int] = defaultdict(int)
        self.clusters: set[str] = set()
        # Bumped whenever a node gains free GPUs, CPU or memory: a gang that did not fit
        # before cannot fit now unless this changed.
        self.grown = 0
        # Bumped on every change of a node's free GPUs (rule E3 memoizes on it), in all
        # and per GPU type (a capacity wait reads the nodes of its type alone).
        self.changes = 0
        self.type_changes: dict[str, int] = defaultdict(int)
        self._buckets: dict[str, list[list[str]]] = {}
        # Rules H1-H3: per packed node its slices per GPU and free slices per GPU; the
        # packed pools and GPU types (-> slices per GPU); the GPU indexes of the latest
        # `place` on a packed pool, per replica (`Admission.gpu_slots`), else ().
        self.spg: dict[str, int] = {}
        self.gpu_free: dict[str, list[int]] = {}
        self.packed: dict[str, int] = {}
        self.last_slots: tuple[int, ...] = ()
        # Rule H3's index per packed pool: per free-slice count f (1..S-1), the (node, GPU)
        # pairs of the shared GPUs with f free, sorted: the best fit of a fraction is
        # the first pair of the first f that holds it.
        self._shared: dict[str, list[list[tuple[str, int]]]] = {}
        self._empty_slots: dict[tuple[str, int, int, int], int] = {}
        self._domain_empty_slots: dict[tuple[str, str, int, int, int], int] = {}
        for n in sorted(nodes, key=lambda n: n.name):
            free = max(0, min(n.free, n.capacity))
            if n.slices_per_gpu > 1:
                gf = self.gpu_free[n.name] = per_gpu_free(n.capacity, free, n.slices_per_gpu,
                                                          n.gpu_free)
                free = sum(gf)
                self.spg[n.name] = n.slices_per_gpu
                p = pool_key(n.gpu_type, n.cluster, n.spot)
                self.packed[n.gpu_type] = self.packed[p] = n.slices_per_gpu
                index = self._shared.setdefault(p, [[] for _ in range(n.slices_per_gpu)])
                for i, f in enumerate(gf):
                    if 0 < f < n.slices_per_gpu:
                        index[f].append((n.name, i))  # names arrive sorted
            self.free[n.name] = free
            self.capacity[n.name] = n.capacity
            self.node_type[n.name] = n.gpu_type
            self.cpu_free[n.name] = None if n.cpu_free is None else max(0, n.cpu_free)
            self.memory_free[n.name] = None if n.memory_free is None else max(0, n.memory_free)
            self.cpu_allocatable[n.name] = n.cpu_allocatable
            self.memory_allocatable[n.name] = n.memory_allocatable
            self.topology[n.name] = n.topology
            pool = pool_key(n.gpu_type, n.cluster, n.spot)
            self.node_pool[n.name] = pool
            if pool not in self.pool_info:
                self.pool_info[pool] = (n.gpu_type, n.cluster, n.spot)
                self.pools_of_type[n.gpu_type].append(pool)
            self.clusters.add(n.cluster)
            self.nodes_of[pool].append(n.name)
            if n.cpu_free is not None or n.memory_free is not None:
                # The type (the admission pass asks it) and the pool (`_simple`).
                self.constrained.add(n.gpu_type)
                self.constrained.add(pool)
            self.largest_node[n.gpu_type] = max(self.largest_node[n.gpu_type], n.capacity)
            self.total[n.gpu_type] += n.capacity
            self.pool_largest[pool] = max(self.pool_largest[pool], n.capacity)
            self.pool_total[pool] += n.capacity
            self.pool_free[pool] += free
        for pools in self.pools_of_type.values():
            pools.sort()
        for name in self.free:
            p = self.node_pool[name]
            buckets = self._buckets.setdefault(p, [[] for _ in range(self.pool_largest[p] + 1)])
            buckets[self.free[name]].append(name)  # names arrive sorted

    def _simple(self, gpu_type: str, cpu: int, memory: int) -> bool:
        """Rule A6 does not apply: GPUs alone decide (the fast bucket path)."""
        return (cpu <= 0 and memory <= 0) or gpu_type not in self.constrained

    def slots(self, name: str, gpus: int, cpu: int = 0, memory: int = 0) -> int:
        """Rule A6: how many replicas of (gpus, cpu, memory) node `name` holds now (rule
        H2 on a packed node: per GPU)."""
        if self.packed and name in self.spg:
            n = packed_count(self.gpu_free[name], self.spg[name], gpus)
        else:
            n = self.free[name] // gpus
        if cpu > 0:
            c = self.cpu_free[name]
            if c is not None:
                n = min(n, c // cpu)
        if memory > 0:
            m = self.memory_free[name]
            if m is not None:
                n = min(n, m // memory)
        return n

    def empty_node_slots(self, name: str, gpus: int, cpu: int, memory: int) -> int:
        """`replicas_when_empty` of node `name`."""
        return replicas_when_empty(self.capacity[name], gpus, cpu, memory,
                                   self.cpu_allocatable[name], self.memory_allocatable[name],
                                   self.spg.get(name, 1) if self.packed else 1)

    def slots_now(self, gpu_type: str, gpus: int) -> int:
        """How many replicas of `gpus` GPUs (GPUs alone) the nodes of `gpu_type` (a pool)
        hold now: O(largest node), from the buckets."""
        buckets = self._buckets.get(gpu_type)
        if not buckets or gpus <= 0:
            return 0
        if self.packed and gpu_type in self.packed:
            return sum(self.slots(n, gpus) for n in self.nodes_of[gpu_type])
        return sum(len(names) * (f // gpus) for f, names in enumerate(buckets) if f >= gpus)

    def slots_when_empty(self, gpu_type: str, gpus: int, cpu: int = 0, memory: int = 0) -> int:
        """How many replicas of `gpus` GPUs (and `cpu` millicores, `memory` bytes, rule
        A6) the nodes of `gpu_type` hold when all are empty: a gang needing more can
        never run on this cluster (rule A4)."""
        key = (gpu_type, gpus, cpu, memory)
        slots = self._empty_slots.get(key)
        if slots is None:
            slots = sum(self.empty_node_slots(n, gpus, cpu, memory)
                        for n in self.nodes_of.get(gpu_type, ()))
            self._empty_slots[key] = slots
        return slots

    def domain_slots_when_empty(self, gpu_type: str, level: str, gpus: int, cpu: int = 0,
                                memory: int = 0) -> int:
        """Rule A7: the most replicas one domain of `level` holds when its nodes are
        empty (0 when no node of the type carries the level)."""
        key = (gpu_type, level, gpus, cpu, memory)
        best = self._domain_empty_slots.get(key)
        if best is None:
            per: dict[str, int] = defaultdict(int)
            for n in self.nodes_of.get(gpu_type, ()):
                domain = self.topology[n].get(level)
                if domain is not None:
                    per[domain] += self.empty_node_slots(n, gpus, cpu, memory)
            best = self._domain_empty_slots[key] = max(per.values(), default=0)
        return best

    def fits(self, gpu_type: str, gpus: int, replicas: int, *, cpu: int = 0,
             memory: int = 0, topology: Topology | None = None) -> bool:
        """Rules A2, A6, A7: can `replicas` replicas of `gpus` GPUs (and `cpu`, `memory`)
        each be placed at all?

        A node that holds s replicas (its slots) loses exactly one slot per replica best
        fit puts there, so the gang fits iff the slots sum to `replicas` (within one
        domain for a required topology).
        """
        buckets = self._buckets.get(gpu_type)
        if buckets is None or gpus >= len(buckets):
            return False
        if gpus <= 0 or replicas <= 0:
            return True
        if topology is not None:
            return self._domains_for(gpu_type, gpus, replicas, cpu, memory, topology) is not None
        simple = self._simple(gpu_type, cpu, memory) and not (self.packed
                                                             and gpu_type in self.packed)
        room = 0
        for f in range(gpus, len(buckets)):
            if buckets[f]:
                if simple:
                    room += len(buckets[f]) * (f // gpus)
                else:
                    room += sum(self.slots(n, gpus, cpu, memory) for n in buckets[f])
                if room >= replicas:
                    return True
        return False

    def _domains_for(self, gpu_type: str, gpus: int, replicas: int, cpu: int, memory: int,
                     topology: Topology) -> set[str] | None:
        """Rule A7: the nodes a gang may use, or None when the request cannot be met now.

        The nodes of the type are grouped by their domain of the level. `required`: the
        best-fitting domain that holds the whole gang — the one with the fewest free GPUs,
        ties by domain name (like A3 one level up: small gangs fill partly used domains,
        whole domains stay free for large ones). `preferred`: that domain if any; else
        the fewest domains that hold it (most room first, then fewest free GPUs, then
        name), then nodes in no domain; else None (it does not fit at all).
        """
        room: dict[str, int] = defaultdict(int)
        free: dict[str, int] = defaultdict(int)
        members: dict[str, list[str]] = defaultdict(list)
        loose: list[str] = []
        loose_room = 0
        for name in self.nodes_of.get(gpu_type, ()):
            s = self.slots(name, gpus, cpu, memory)
            if s <= 0:
                continue
            domain = self.topology[name].get(topology.level)
            if domain is None:
                loose.append(name)
                loose_room += s
                continue
            room[domain] += s
            free[domain] += self.free[name]
            members[domain].append(name)
        whole = [(free[d], d) for d in room if room[d] >= replicas]
        if whole:
            return set(members[min(whole)[1]])
        if topology.mode is TopologyMode.REQUIRED:
            return None
        chosen: set[str] = set()
        got = 0
        for d in sorted(room, key=lambda d: (-room[d], free[d], d)):
            chosen.update(members[d])
            got += room[d]
            if got >= replicas:
                return chosen
        if got + loose_room >= replicas:
            return chosen | set(loose)
        return None

    def set_free(self, name: str, free: int) -> None:
        p = self.node_pool[name]
        buckets = self._buckets[p]
        old = self.free[name]
        if old == free:
            return
        if free > old:
            self.grown += 1
        self.changes += 1
        self.type_changes[self.node_type[name]] += 1
        lst = buckets[old]
        lst.pop(bisect.bisect_left(lst, name))
        bisect.insort(buckets[free], name)
        self.free[name] = free
        self.pool_free[p] += free - old

    def cluster_free(self, pool: str) -> int:
        """Rule K2: the free GPUs of the pool's GPU type in the pool's cluster (spot or
        not)."""
        gpu_type, cluster, _ = self.pool_info[pool]
        return sum(self.pool_free[p] for p in self.pools_of_type[gpu_type]
                   if self.pool_info[p][1] == cluster)

    def largest_free_block(self, gpu_type: str, units: int = 0) -> tuple[int, str, int]:
        """Rule E3: the most free GPUs on one node of the type, that node (the first by
        name among equals) and the type's free GPUs in all; (0, "", 0) when none is free.
        O(largest node): the buckets by free GPUs. Rule H5 on a packed pool, for a
        replica of `units` slices: a fraction's block is the most free slices on one GPU,
        whole GPUs' the most wholly free GPUs on one node (in slices)."""
        buckets = self._buckets.get(gpu_type)
        if not buckets:
            return 0, "", 0
        total = self.pool_free[gpu_type]
        if self.packed and units and gpu_type in self.packed:
            return (*self._packed_block(gpu_type, units), total)
        for f in range(len(buckets) - 1, 0, -1):
            if buckets[f]:
                return f, buckets[f][0], total
        return 0, "", 0

    def _packed_block(self, pool: str, units: int) -> tuple[int, str]:
        """Rule H5's block of a packed pool (see `largest_free_block`)."""
        s = self.packed[pool]
        best, where = 0, ""
        for name in self.nodes_of[pool]:
            gf = self.gpu_free[name]
            b = max(gf, default=0) if units < s else s * sum(1 for f in gf if f >= s)
            if b > best:
                best, where = b, name
        return best, where

    def _sync(self, name: str, before: list[int]) -> None:
        """Bring rule H3's index up to date after node `name`'s free slices per GPU
        changed from `before`."""
        index, s, gf = self._shared[self.node_pool[name]], self.spg[name], self.gpu_free[name]
        for i, (old, new) in enumerate(zip(before, gf, strict=True)):
            if old == new:
                continue
            if 0 < old < s:
                lst = index[old]
                del lst[bisect.bisect_left(lst, (name, i))]
            if 0 < new < s:
                bisect.insort(index[new], (name, i))

    def set_gpu_free(self, name: str, gpu_free: list[int]) -> None:
        """Rule H6's undo: node `name`'s free slices per GPU as they were (`gpu_free`, the
        totals set apart with `set_free`)."""
        before = self.gpu_free[name]
        self.gpu_free[name] = gpu_free
        self._sync(name, before)

    def take_free(self, name: str, n: int) -> int:
        """Take up to `n` free GPUs (slices on a packed node: the GPUs with the most
        free first, then the highest index - what a removed victim left wholly free)
        off node `name` for the rest of the pass (rule A5's holds); returns how many."""
        take = min(n, self.free[name])
        if take <= 0:
            return 0
        if self.packed and name in self.spg:
            gf = self.gpu_free[name]
            before = list(gf)
            left = take
            for i in sorted(range(len(gf)), key=lambda i: (-gf[i], -i)):
                d = min(left, gf[i])
                gf[i] -= d
                left -= d
                if not left:
                    break
            self._sync(name, before)
        self.set_free(name, self.free[name] - take)
        return take

    def give_free(self, name: str, n: int, slots: Iterable[int] = ()) -> int:
        """Give back `n` GPUs (slices on a packed node: `slots` the GPU of each part of
        it as `place` said, else the GPUs with the least free that have room first) to
        node `name`, never beyond its capacity; returns how many."""
        give = min(n, self.capacity[name] - self.free[name])
        if give <= 0:
            return 0
        if self.packed and name in self.spg:
            self._give_slices(name, give, slots)
        self.set_free(name, self.free[name] + give)
        return give

    def _give_slices(self, name: str, n: int, slots: Iterable[int]) -> None:
        """`give_free`'s slices: each GPU of `slots` (one per fraction, or one per whole
        GPU) first, up to a full GPU, the rest to the fullest GPUs with room."""
        s, gf = self.spg[name], self.gpu_free[name]
        before = list(gf)
        slots = list(slots)
        left = n
        if slots:
            each = max(1, -(-n // len(slots))) if n < s * len(slots) else s
            for i in slots:
                if 0 <= i < len(gf) and left > 0:
                    d = min(each, s - gf[i], left)
                    gf[i] += d
                    left -= d
        for i in sorted(range(len(gf)), key=lambda i: (gf[i] == s, -gf[i], i)):
            if left <= 0:
                break
            d = min(s - gf[i], left)
            gf[i] += d
            left -= d
        self._sync(name, before)

    def _place_packed(self, pool: str, units: int, replicas: int, cpu: int, memory: int,
                      allowed: set[str] | None) -> tuple[str, ...]:
        """Rules H2, H3: one node and GPU(s) per replica on a packed pool (the caller
        made sure the gang fits). A fraction goes to the GPU already shared (some slices
        taken) with the fewest free slices that hold it, of any node (best fit; ties by
        node name, GPU index); only when none has room is a wholly free GPU opened, on
        the node with the fewest free slices that has one (a node already shared first),
        its lowest such GPU. Whole GPUs take the lowest wholly free GPUs of the node with
        the fewest wholly free GPUs that holds them (then the fewest free slices, then
        the name). Sets `last_slots`: the GPU index of each fraction, or each replica's
        whole GPUs' indexes in turn."""
        s = self.packed[pool]
        whole = 0 if units < s else -(-units // s)
        taken: list[str] = []
        slots: list[int] = []
        for _ in range(replicas):
            found = (self._whole_gpus(pool, s, whole, units, cpu, memory, allowed) if whole
                     else self._fraction_gpu(pool, s, units, cpu, memory, allowed))
            assert found is not None  # `fits` said the gang fits
            name, chosen = found
            gf = self.gpu_free[name]
            before = list(gf)
            for i in chosen:
                gf[i] = 0 if whole else gf[i] - units
            self._sync(name, before)
            slots.extend(chosen)
            self.set_free(name, self.free[name] - units)
            if cpu or memory:
                self.add_cpu_memory(name, -cpu, -memory)
            taken.append(name)
        self.last_slots = tuple(slots)
        return tuple(taken)

    def _usable(self, name: str, units: int, cpu: int, memory: int,
                allowed: set[str] | None) -> bool:
        return (allowed is None or name in allowed) and (
            not (cpu or memory) or self.slots(name, units, cpu, memory) > 0)

    def _fraction_gpu(self, pool: str, s: int, units: int, cpu: int, memory: int,
                      allowed: set[str] | None) -> tuple[str, list[int]] | None:
        """Rule H3 for one fraction: the first shared GPU of the index that holds it,
        else the lowest wholly free GPU of the node with the fewest free slices."""
        index = self._shared[pool]
        for f in range(units, s):
            for name, i in index[f]:
                if self._usable(name, units, cpu, memory, allowed):
                    return name, [i]
        buckets = self._buckets[pool]
        for f in range(s, len(buckets)):
            for name in buckets[f]:
                gf = self.gpu_free[name]
                if s in gf and self._usable(name, units, cpu, memory, allowed):
                    return name, [gf.index(s)]
        return None

    def _whole_gpus(self, pool: str, s: int, whole: int, units: int, cpu: int, memory: int,
                    allowed: set[str] | None) -> tuple[str, list[int]] | None:
        """Rule H3 for one replica of whole GPUs: the node with the fewest wholly free
        GPUs that holds it (then the fewest free slices, then the name), its lowest."""
        best: tuple[int, int, str] | None = None
        for name in self.nodes_of[pool]:
            if self.free[name] < units:
                continue
            n_free = self.gpu_free[name].count(s)
            if n_free >= whole and (best is None or (n_free, self.free[name], name) < best) \
                    and self._usable(name, units, cpu, memory, allowed):
                best = (n_free, self.free[name], name)
        if best is None:
            return None
        gf = self.gpu_free[best[2]]
        return best[2], [i for i, f in enumerate(gf) if f >= s][:whole]

    def add_cpu_memory(self, name: str, cpu: int, memory: int) -> None:
        """Give (positive) or take (negative) CPU and memory on a node that reports them
        (rule A6); a node that does not stays unknown."""
        c, m = self.cpu_free[name], self.memory_free[name]
        if cpu and c is not None:
            self.cpu_free[name] = c + cpu
            if cpu > 0:
                self.grown += 1
        if memory and m is not None:
            self.memory_free[name] = m + memory
            if memory > 0:
                self.grown += 1

    def place(self, gpu_type: str, gpus: int, replicas: int, *, cpu: int = 0,
              memory: int = 0, topology: Topology | None = None) -> tuple[str, ...] | None:
        """Rules A2-A3, A6-A7: one node per replica, all or none, best fit.

        Each replica goes to the node of its type with the fewest free GPUs that still
        holds it — its GPUs, and its CPU and memory where the node reports them — ties
        by node name, which keeps whole nodes free for large gangs. With a topology
        request the nodes are first narrowed to the chosen domains (`_domains_for`).
        Returns None, changing nothing, when the gang does not fit.
        """
        if not self.fits(gpu_type, gpus, replicas, cpu=cpu, memory=memory, topology=topology):
            return None
        allowed = None
        if topology is not None:
            allowed = self._domains_for(gpu_type, gpus, replicas, cpu, memory, topology)
        if self.packed and gpu_type in self.packed:
            return self._place_packed(gpu_type, gpus, replicas, cpu, memory, allowed)
        self.last_slots = ()
        buckets = self._buckets[gpu_type]
        simple = allowed is None and self._simple(gpu_type, cpu, memory)
        taken: list[str] = []
        for _ in range(replicas):
            for f in range(gpus, len(buckets)):
                if not buckets[f]:
                    continue
                if simple:
                    name = buckets[f][0]
                else:
                    name = next((n for n in buckets[f]
                                 if (allowed is None or n in allowed)
                                 and self.slots(n, gpus, cpu, memory) > 0), "")
                    if not name:
                        continue
                self.set_free(name, f - gpus)
                if not simple:
                    self.add_cpu_memory(name, -cpu, -memory)
                taken.append(name)
                break
        return tuple(taken)

    def nodes_by_free(self, pool: str, at_least: int) -> Iterator[tuple[int, str]]:
        """(free GPUs, node) of the pool's nodes with at least `at_least` free, fewest
        free first, ties by name (rule A3's order; rule W1 walks it): from the buckets."""
        buckets = self._buckets.get(pool, ())
        for f in range(max(at_least, 1), len(buckets)):
            for name in buckets[f]:
                yield f, name

    def release(self, placement: Iterable[str], gpus: int, *, cpu: int = 0,
                memory: int = 0, slots: tuple[int, ...] = ()) -> None:
        """Give back `gpus` (and `cpu`, `memory`) on each node of `placement` (the inverse
        of `place`); on a packed node to the GPUs `slots` says (`last_slots` of that
        `place`, rule H6)."""
        if self.packed:
            placement = tuple(placement)
            per = replica_slots(slots, len(placement))
            for k, name in enumerate(placement):
                if name in self.free:
                    self.give_free(name, gpus, per[k] if name in self.spg else ())
                    self.add_cpu_memory(name, cpu, memory)
            return
        for name in placement:
            if name in self.free:
                self.set_free(name, min(self.capacity[name], self.free[name] + gpus))
                self.add_cpu_memory(name, cpu, memory)


def replica_slots(slots: tuple[int, ...], replicas: int) -> list[tuple[int, ...]]:
    """Rule H1's encoding of `gpu_slots` split per replica: the GPU indexes of each
    replica in turn (one for a fraction, its whole GPUs' for whole GPUs); () each when
    not known."""
    if not slots or replicas <= 0 or len(slots) % replicas:
        return [()] * max(replicas, 0)
    each = len(slots) // replicas
    return [slots[k * each:(k + 1) * each] for k in range(replicas)]


# False: a forest without departments keeps the flat ledger of rule Q1 (the fast path);
# True: every ledger is the quota tree's (rules Q3-Q7), what the tests hold the fast
# path to (tests/policy/test_quota_tree_q.py).
TREE_ALWAYS = False
# True: `Ledger.tree_limit` keeps its answer per (team, type) until something moves under
# the team's top-level node, `lending_blocks` until the type moves; False: until
# anything moves (the reference, held to it by tests/policy/test_fleet_fast_paths.py).
LIMITS_PER_TOP = True


def has_departments(team_parent: Mapping[str, str | None]) -> bool:
    """Rule Q3: is some team another team's child (after rule F4's forest is made safe)?"""
    from .fairshare import forest_parents

    if not any(team_parent.values()):
        return False
    raw = dict(team_parent)
    for parent in list(raw.values()):
        if parent:
            raw.setdefault(parent, None)
    return any(forest_parents(raw).values())


class Ledger:
    """GPUs held per (team, GPU type) and the pool rules of Q1, or of the quota tree
    (rules Q3-Q7) when some team has a department.

    A team's unused nominal beyond its lending limit is *guarded*: only the team itself
    may use it. `guarded_total[type]` is kept as a running sum so the check is O(1).
    In a tree, `tree` keeps every holding (the pass's admissions too) and `running_tree`
    what running jobs alone hold (rule Q6 reads it as rule R2 reads `running_held`).
    """

    def __init__(self, snapshot: Snapshot, capacity: Capacity) -> None:
        self._snapshot = snapshot
        self.capacity_total: dict[str, int] = dict(capacity.total)
        self.held: dict[tuple[str, str], int] = defaultdict(int)
        self.used: dict[str, int] = defaultdict(int)
        self.guarded_total: dict[str, int] = defaultdict(int)
        # How many times `held` changed: a plan's memo is valid while this stays; and
        # per GPU type (what a wait on that type alone reads).
        self.moves = 0
        self.type_moves: dict[str, int] = defaultdict(int)
        # Rule Q1: nominal + borrowing limit per (team, type); absent = no ceiling.
        self.ceiling: dict[tuple[str, str], int | None] = {
            k: q.ceiling for k, q in snapshot.quotas.items()}
        # What running jobs alone hold (rule R2 looks only at these: a team is not made
        # reclaimable by what this very pass admits for it).
        self.running_held: dict[tuple[str, str], int] = defaultdict(int)
        # Every (team, type) whose `running_held` moved, in order: what the victim
        # search keeps across a pass reads only the teams moved since it last looked
        # (`preemption._Kept`, `owed._borrowed`).
        self.running_moves: list[tuple[str, str]] = []
        for r in snapshot.running:
            self.held[(r.team, r.gpu_type)] += r.total_gpus
            self.running_held[(r.team, r.gpu_type)] += r.total_gpus
            self.used[r.gpu_type] += r.total_gpus
        for (team, gpu_type), _q in snapshot.quotas.items():
            self.guarded_total[gpu_type] += self.guarded(team, gpu_type)
        self.tree: QuotaTree | None = None
        self.running_tree: QuotaTree | None = None
        # Rule Q7: per (node, type) what its whole subtree holds (a team's own: `held`).
        self.subtree_held: dict[tuple[str, str], int] = defaultdict(int)
        # Rule Q4: per (team, type) `QuotaTree.within_limits` and the binding node's
        # nominal + borrowing limit, as of a count of moves: the moves under the team's
        # top-level node (`LIMITS_PER_TOP`; no other move changes what its path holds),
        # kept in a one-item list shared by the teams under that node (`_cell`).
        self._limits: dict[tuple[str, str],
                           tuple[list[int], int, int | None, str, int]] = {}
        self._cells: dict[tuple[str, str], list[int]] = {}
        self._cell_of: dict[tuple[str, str], list[int]] = {}
        # Rule Q4: per (team, type) at the type's moves, `QuotaTree.available` while
        # some node off the team's path guards GPUs, else None (no lending wait).
        self._room: dict[tuple[str, str], tuple[int, int | None]] = {}
        # Rule Q6: a forest with departments names its reclaims `Q6-reclaim`.
        self.departments = has_departments(snapshot.team_parent)
        if TREE_ALWAYS or self.departments:
            self._grow_tree(snapshot)

    def _grow_tree(self, snapshot: Snapshot) -> None:
        """Rules Q3-Q7: the quota tree of the snapshot, with what running jobs hold."""
        tree = self.tree = QuotaTree(snapshot.team_parent, snapshot.quotas,
                                     self.capacity_total)
        running = self.running_tree = QuotaTree(snapshot.team_parent, snapshot.quotas,
                                                self.capacity_total)
        for (team, gpu_type), gpus in self.held.items():
            tree.add(team, gpu_type, gpus)
            running.add(team, gpu_type, gpus)
            for node in tree.path(team):
                self.subtree_held[(node, gpu_type)] += gpus

    def guarded(self, team: str, gpu_type: str) -> int:
        """Rule Q1: unused nominal of `team` that others may not borrow."""
        q = self._snapshot.quota(team, gpu_type)
        if q.lending_limit is None:
            return 0
        return max(0, q.nominal - self.held[(team, gpu_type)] - q.lending_limit)

    def _move(self, team: str, gpu_type: str, gpus: int) -> None:
        self.moves += 1
        self.type_moves[gpu_type] += 1
        before = self.guarded(team, gpu_type)
        self.held[(team, gpu_type)] += gpus
        self.used[gpu_type] += gpus
        self.guarded_total[gpu_type] += self.guarded(team, gpu_type) - before
        tree = self.tree
        if tree is not None:
            tree.add(team, gpu_type, gpus)
            self._cell(team, gpu_type)[0] += 1
            for node in tree.path(team):
                self.subtree_held[(node, gpu_type)] += gpus

    def _cell(self, team: str, gpu_type: str) -> list[int]:
        """The count of moves of `gpu_type` under `team`'s top-level node, which
        `tree_limit`'s memo is kept at; with `LIMITS_PER_TOP` off one count of every
        move (the reference the tests hold it to)."""
        cell = self._cell_of.get((team, gpu_type))
        if cell is None:
            assert self.tree is not None
            top = (self.tree.path(team)[-1], gpu_type) if LIMITS_PER_TOP else ("", "")
            cell = self._cell_of[(team, gpu_type)] = self._cells.setdefault(top, [0])
        return cell

    def path_moves(self, team: str, gpu_type: str) -> list[int]:
        """Rule Q4: a one-item list counting the moves of `gpu_type` that may change what
        `team`'s path holds (`_cell`); it grows in place. While it stays, so does
        `tree_limit` for the team and type."""
        return self._cell(team, gpu_type)

    def add(self, team: str, gpu_type: str, gpus: int) -> None:
        self._move(team, gpu_type, gpus)

    def remove(self, team: str, gpu_type: str, gpus: int) -> None:
        self._move(team, gpu_type, -gpus)

    def move_running(self, team: str, gpu_type: str, gpus: int) -> None:
        """A running job taken as a victim (`gpus` < 0) or put back (> 0): what rules R2
        and Q6 read."""
        self.running_held[(team, gpu_type)] += gpus
        self.running_moves.append((team, gpu_type))
        if self.running_tree is not None:
            self.running_tree.add(team, gpu_type, gpus)

    def over_ceiling(self, team: str, gpu_type: str, gpus: int) -> int | None:
        """Rule Q1: the team's ceiling (nominal + borrowing limit) when `gpus` more would
        pass it, else None. Rule Q4 in a tree: the binding level's (`tree_limit`)."""
        if self.tree is not None:
            binding = self.tree_limit(team, gpu_type, gpus)
            return None if binding is None else binding[1]
        ceiling = self.ceiling.get((team, gpu_type))
        if ceiling is not None and self.held[(team, gpu_type)] + gpus > ceiling:
            return ceiling
        return None

    def tree_limit(self, team: str, gpu_type: str, gpus: int) -> tuple[str, int, int] | None:
        """Rule Q4: when `gpus` more for `team` would pass a borrowing limit on its path,
        (the binding node, its nominal + borrowing limit, what its subtree holds)."""
        seen = self._limits.get((team, gpu_type))
        if seen is None or seen[0][0] != seen[1]:
            tree = self.tree
            assert tree is not None
            cell = self._cell(team, gpu_type)
            room, node = tree.within_limits(team, gpu_type)
            cap = 0 if room is None else tree.nominal(node, gpu_type) + (
                tree.quota(node, gpu_type).borrowing_limit or 0)
            seen = self._limits[(team, gpu_type)] = (cell, cell[0], room, node, cap)
        room = seen[2]
        if room is None or gpus <= room:
            return None
        node = seen[3]
        return node, seen[4], self.subtree_held[(node, gpu_type)]

    def under_limit(self, team: str, other: str, gpu_type: str, gpus: int) -> bool:
        """Rule Q4: is `other` under the department whose borrowing limit `gpus` more
        for `team` would pass (not the team's own: its own jobs make room there)?"""
        if self.tree is None:
            return False
        binding = self.tree_limit(team, gpu_type, gpus)
        return binding is not None and binding[0] != team and \
            binding[0] in self.tree.path(other)

    def lending_blocks(self, team: str, gpu_type: str, gpus: int) -> bool:
        """Rule Q1: would `gpus` more for `team` eat into GPUs other teams guard?

        Only the pool check: whether the GPUs exist on nodes is rule A2's business.
        Rule Q4 in a tree: the quota tree refuses it while some node off the team's path
        guards GPUs (else it is the fleet's cap alone: rule A2's capacity wait).
        """
        tree = self.tree
        if tree is not None:
            # The tree's usage of the type moves only with moves of that type.
            stamp = self.type_moves[gpu_type] if LIMITS_PER_TOP else self.moves
            seen = self._room.get((team, gpu_type))
            if seen is None or seen[0] != stamp:
                guarded = tree.guarded_off_path(team, gpu_type)
                seen = self._room[(team, gpu_type)] = (
                    stamp, None if guarded <= 0 else tree.available(team, gpu_type))
            room = seen[1]
            return room is not None and gpus > room
        others = self.guarded_total[gpu_type] - self.guarded(team, gpu_type)
        if others <= 0:
            return False
        return self.used[gpu_type] + gpus + others > self.capacity_total.get(gpu_type, 0)

    def within_nominal(self, team: str, gpu_type: str, gpus: int) -> bool:
        """Rules R2, Q6: the team, and in a tree every department above it (rule Q7's
        count: `QuotaTree.within_guarantee`), stays within its nominal with `gpus`
        more."""
        if not self.within_own_nominal(team, gpu_type, gpus):
            return False
        tree = self.tree
        if tree is None:
            return True
        return self.reclaim_reach(team, gpu_type, gpus) is None

    def within_own_nominal(self, team: str, gpu_type: str, gpus: int) -> bool:
        """Rule R2: the team itself stays within its nominal with `gpus` more."""
        return self.held[(team, gpu_type)] + gpus <= self._snapshot.quota(team, gpu_type).nominal

    def reclaim_reach(self, team: str, gpu_type: str, gpus: int) -> frozenset[str] | None:
        """Rule Q6's claimant side: the common departments below which the team's path
        stays within its guarantee with `gpus` more - a reclaim from a team whose
        nearest common node with it is one of them is allowed. None: all of them (flat,
        or the whole path within)."""
        tree = self.tree
        if tree is None:
            return None
        path = tree.path(team)
        held = self.held
        reach = tree.within_guarantee(team, gpu_type, gpus, lambda n: held.get((n, gpu_type), 0))
        if reach >= len(path):
            return None
        return frozenset(path[:reach + 1])

    def borrowing(self, team: str, gpu_type: str) -> bool:
        """Rule R2: do the team's running jobs (minus victims taken) exceed its nominal?"""
        return self.running_held[(team, gpu_type)] > self._snapshot.quota(team, gpu_type).nominal

    def reclaimable(self, claimant: str, team: str, gpu_type: str) -> bool:
        """Rules R2, Q6: may a claimant of `claimant` reclaim from `team`'s running jobs?
        Flat: `team` borrows. In a tree: some node on `team`'s path below the nearest
        node both are under borrows (its running usage passes its subtree quota)."""
        tree = self.running_tree
        if tree is None:
            return self.borrowing(team, gpu_type)
        top = tree.lca(claimant, team)
        for node in tree.path(team):
            if node == top:
                return False
            if tree.borrowing(node, gpu_type):
                return True
        return False

    def lca(self, a: str, b: str) -> str:
        """The nearest node both teams are under ("" = the fleet, and flat)."""
        return "" if self.tree is None else self.tree.lca(a, b)

    def nearness(self, claimant: str, team: str, gpu_type: str) -> int:
        """Rule Q6's order: nearest first - minus twice the depth of the nearest node
        `claimant` and `team` are under (siblings before cousins before other
        departments), and at one depth a team that borrows itself before one that is
        only under a borrowing department; 0 flat (every candidate of another team
        borrows there) and for the claimant's own team."""
        tree = self.running_tree
        if tree is None or claimant == team:
            return 0
        itself = 0 if tree.borrowing(team, gpu_type) else 1
        return -2 * tree.depth(tree.lca(claimant, team)) + itself


class Workspace:
    """Capacity and ledger together, with what-if removal of running jobs."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        self.capacity = Capacity(snapshot.open_nodes())  # rule K8: no closed cluster's
        self.ledger = Ledger(snapshot, self.capacity)
        self.running_by_type: dict[str, list[RunningJob]] = defaultdict(list)
        self.running_by_id: dict[int, RunningJob] = {}
        # Rule K7: the cluster each running job runs in - the one of its nodes in the
        # snapshot, else its own `cluster` (its cluster left the snapshot: rule K5).
        self.running_cluster: dict[int, str] = {}
        node_pool, pool_info = self.capacity.node_pool, self.capacity.pool_info
        for r in snapshot.running:
            self.running_by_type[r.gpu_type].append(r)
            self.running_by_id[r.id] = r
            cluster = r.cluster
            for n in r.nodes:
                if n in node_pool:
                    cluster = pool_info[node_pool[n]][1]
                    break
            self.running_cluster[r.id] = cluster
        self.removed: set[int] = set()
        # The victim search's per-(GPU type, now, rule R3 applies) list of unprotected
        # running jobs (`preemption._unprotected`).
        self.victim_pools: dict[tuple[str, datetime, bool],
                                list[tuple[RunningJob, float]]] = {}
        # Per entry of `victim_pools`: the lowest tier of its preemptible jobs (None: none).
        self.victim_floor: dict[tuple[str, datetime, bool], int | None] = {}
        # Per entry of `victim_pools`: its jobs per team, in its order (`_Levels` reads
        # only the teams a search may take from).
        self.victim_teams: dict[tuple[str, datetime, bool],
                                dict[str, list[tuple[RunningJob, float]]]] = {}
        # Rule H6 in the victim search: per packed node of a type, per GPU, its running
        # jobs with the slices each gives back there and their sum
        # (`preemption._gpu_index`), and what each job gives back per node
        # (`preemption._given`).
        self.victim_gpus: dict[
            str, dict[str, list[tuple[list[tuple[RunningJob, int]], int]]]] = {}
        self.victim_given: dict[tuple[int, str], list[tuple[int, int]]] = {}
        # A one-GPU claim's search (`preemption._team_runs`): per (GPU type, now, rule
        # R3 applies, cluster), per team read, per (preemptible, tier), the unprotected running jobs
        # in rule R4's order with the first one not removed (`[index]`); per running job
        # those first-ones it is in with its index, so a restored job moves them back.
        self.victim_runs: dict[tuple[str, datetime, bool, str],
                               dict[str, list[tuple[bool, int, tuple[
                                   list[tuple[float, int, RunningJob]], list[int]]]]]] = {}
        self.victim_marks: dict[int, list[tuple[list[int], int]]] = {}
        # Per entry of `victim_runs`: the work each job of its teams made would lose
        # (rule R4).
        self.victim_lost: dict[tuple[str, datetime, bool, str], dict[int, float]] = {}
        # Per entry of `victim_runs` in a flat forest, the first job of each borrowing
        # team's runs kept across the pass (`preemption._Kept`).
        self.victim_kept: dict[tuple[str, datetime, bool, str], object] = {}
        # Per node of a GPU type the victim search read, its running jobs.
        self.victim_nodes: dict[str, dict[str, list[RunningJob]]] = {}
        # The lowest tier among each (team, type)'s preemptible jobs: a job over its own
        # team's ceiling can only make room by preempting those (rules Q1, R1).
        self.lowest_tier: dict[tuple[str, str], int] = {}
        for r in snapshot.running:
            if r.preemptible:
                k = (r.team, r.gpu_type)
                self.lowest_tier[k] = min(self.lowest_tier.get(k, r.tier_rank), r.tier_rank)

    def _free_nodes_of(self, job: RunningJob) -> list[tuple[str, int, int, int]]:
        """Give `job`'s GPUs, CPU and memory back to its nodes; returns (node, GPUs, CPU,
        memory given) for the undo."""
        given: list[tuple[str, int, int, int]] = []
        cap = self.capacity
        cpu, memory = job.cpu_millicores or 0, job.memory_bytes or 0
        per = replica_slots(job.gpu_slots, len(job.nodes)) if cap.packed else None
        for k, name in enumerate(job.nodes):
            if name not in cap.free:
                continue
            if per is not None and name in cap.spg:
                # Rule H6: its slices go back to the GPU(s) it held.
                delta = cap.give_free(name, job.gpus_per_replica, per[k])
            else:
                new = min(cap.capacity[name], cap.free[name] + job.gpus_per_replica)
                delta = new - cap.free[name]
                if delta:
                    cap.set_free(name, new)
            c = cpu if cap.cpu_free[name] is not None else 0
            m = memory if cap.memory_free[name] is not None else 0
            cap.add_cpu_memory(name, c, m)
            if delta or c or m:
                given.append((name, delta, c, m))
        return given

    def simulate_removal(self, jobs: Iterable[RunningJob]) -> Callable[[], None]:
        """Remove running `jobs` from the working copy; the returned function undoes it."""
        done: list[tuple[RunningJob, list[tuple[str, int, int, int]]]] = []
        cap = self.capacity
        # Rule H6: the free slices per GPU of the packed nodes before, for the undo.
        before: list[tuple[str, list[int]]] = []
        for job in jobs:
            if job.id in self.removed:
                continue
            self.removed.add(job.id)
            self.ledger.remove(job.team, job.gpu_type, job.total_gpus)
            self.ledger.move_running(job.team, job.gpu_type, -job.total_gpus)
            if cap.packed:
                before.extend((n, list(cap.gpu_free[n])) for n in dict.fromkeys(job.nodes)
                              if n in cap.spg)
            done.append((job, self._free_nodes_of(job)))

        marks = self.victim_marks

        def undo() -> None:
            for job, given in reversed(done):
                for name, delta, cpu, memory in given:
                    cap.set_free(name, cap.free[name] - delta)
                    cap.add_cpu_memory(name, -cpu, -memory)
                self.ledger.add(job.team, job.gpu_type, job.total_gpus)
                self.ledger.move_running(job.team, job.gpu_type, job.total_gpus)
                self.removed.discard(job.id)
                for first, at in marks.get(job.id, ()):
                    if at < first[0]:
                        first[0] = at  # `preemption._one_gpu` reads from it again
            for name, gf in reversed(before):
                cap.set_gpu_free(name, gf)

        return undo

    def fits(self, team: str, gpu_type: str, gpus: int, replicas: int, *, cpu: int = 0,
             memory: int = 0, topology: Topology | None = None, pool: str | None = None) -> bool:
        """Rules Q1, A2, A6 and A7 together, without placing anything; the quota per GPU
        type over all clusters (rule K7), the nodes those of `pool` (rule K1; None = the
        type's pool in the only cluster)."""
        total = gpus * replicas
        return (self.ledger.over_ceiling(team, gpu_type, total) is None
                and not self.ledger.lending_blocks(team, gpu_type, total)
                and self.capacity.fits(gpu_type if pool is None else pool, gpus, replicas,
                                       cpu=cpu, memory=memory, topology=topology))
