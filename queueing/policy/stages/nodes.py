"""Stage 4, node fit and topology: a gang placed best fit on the nodes of one pool
(rules A2, A3), CPU and memory beside its GPUs (rule A6), in one domain when it asks
(rule A7), beside the pass's reservation (rule A9) - and when it is not, the wait that
says why: the largest free block (rule E3), GPUs held for a preemptor (rule E2), or a
pool it may not use (rule K3)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from queueing.policy.snapshot import Topology
from queueing.policy.workspace import Capacity

from .bookings import blocked_wait, crossing, place_ahead
from .flavors import k2_order
from .owed import owed
from .reservation import place_beside, reserve
from .waits import CODE, ELSEWHERE, Raw, WaitReason

if TYPE_CHECKING:
    from .state import Pass, Step, Try

_CAPACITY = CODE[WaitReason.CAPACITY]
_CPU_MEMORY = CODE[WaitReason.CPU_MEMORY]
_TOPOLOGY = CODE[WaitReason.TOPOLOGY]
_RESERVED = CODE[WaitReason.RESERVED]
_HELD = CODE[WaitReason.HELD_FOR_PREEMPTOR]
_CLUSTER = CODE[WaitReason.CLUSTER]
# True: a capacity wait's memos (`capacity_wait`, rules E2, E3, K3) are kept until a node
# of the try's GPU type changes (`Capacity.type_changes`: they read only those nodes);
# False: until any node changes (the reference, held to it by
# tests/policy/test_fleet_fast_paths.py).
PER_TYPE = True


def capacity_wait(p: Pass, t: Try, code: int) -> Raw:
    """The raw wait of a try that did not fit in any of its pools: `capacity` with rule
    E3's largest free block, rule E2's `held_for_preemptor` when it would fit on the GPUs
    held for a preemptor, or rule K3's `cluster` when it would fit now in one of the
    excluded pools (a cluster or spot nodes it may not use); any other code as it is."""
    if code != _CAPACITY:
        return (code, t.index, 0, 0)
    # The answer only changes with the capacity or the holds: a long queue asks it for
    # most of its jobs, of a few shapes.
    cap, job_id = p.cap, t.job.id
    changes = cap.type_changes[t.gt] if PER_TYPE else cap.changes
    memo = p.wait_seen.get(t.skey)
    if memo is not None and memo[0] == changes and memo[1] == len(p.hold_log):
        c, h, ce, where = memo[2]
    else:
        c, h, ce, where = _capacity_wait(p, t, changes)
        p.wait_seen[t.skey] = (changes, len(p.hold_log), (c, h, ce, where))
    if where:
        p.waits.elsewhere[job_id] = where
    return (c, t.index, h, ce)


def _capacity_wait(p: Pass, t: Try, changes: int) -> tuple[int, int, int, str]:
    """`capacity_wait`'s answer as (code, held, ceiling, the pool it would fit in now but
    may not use or ""); `changes` the count its memos are kept at (`PER_TYPE`)."""
    cap, job = p.cap, t.job
    g, reps, cpu, mem = job.gpus_per_replica, job.replicas, t.cpu, t.mem
    for q in t.fitting:
        held_here = p.holds.get(q)
        if held_here and not cpu and not mem and job.topology is None:
            # Memoized per shape until the capacity or the holds change.
            shape = (q, g, reps)
            known = p.fits_held.get(shape)
            if known is None or known[0] != changes:
                fits = fits_with(cap, q, g, reps, held_here)
                known = p.fits_held[shape] = (changes,
                                              sum(held_here.values()) if fits else 0)
            if known[1]:
                return (_HELD, p.holder[q], known[1], "")
    for q in t.excluded:
        shape6 = (q, g, reps, cpu, mem, job.topology)
        now_fits = p.fits_elsewhere.get(shape6)
        if now_fits is None or now_fits[0] != changes:
            now_fits = p.fits_elsewhere[shape6] = (changes, cap.fits(
                q, g, reps, cpu=cpu, memory=mem, topology=job.topology))
        if now_fits[1]:
            return (_CLUSTER, 0, ELSEWHERE, q)
    pools = t.fitting
    if cap.packed and t.gt in cap.packed:
        pools = (*pools, f"#{g}")  # rule H5: a packed pool's block depends on the shape
    seen = p.block_seen.get(pools)
    if seen is None or seen[0] != changes:
        blocks = p.waits.blocks
        if cap.packed and t.gt in cap.packed:
            blocks.append(largest_block_of(cap, t.fitting, g))
        elif len(pools) == 1:
            largest_block, node, free = cap.largest_free_block(pools[0])
            blocks.append((largest_block, node, free, p.pool_info[pools[0]][1]))
        else:
            blocks.append(largest_block_of(cap, pools))
        seen = p.block_seen[pools] = (changes, len(blocks))
    return (_CAPACITY, seen[1], 0, "")


def fit_known_unfit(p: Pass, t: Try) -> Step | bool:
    """Every pool was found unfit for this shape and nothing grew since (the memo of
    `fit`, for all its pools at once): the common case of a long queue. False when not
    known; else sets the try's `why_not` and with no victim search left (and no owed
    claim, rule R11) says the wait (and returns the replay's entry), else True."""
    seen_unfit = p.all_unfit.get(t.skey)
    if seen_unfit is None or seen_unfit[0] != p.cap.grown:
        return False
    t.why_not = seen_unfit[1]
    if p.may_search or owed(p, t) is not None:
        return True
    job = t.job
    p.raw[job.id] = wait = capacity_wait(p, t, t.why_not)
    # (`reserve` passes over a gang smaller than a node before the order of its pools
    # matters: most of a long queue; it decides once per GPU type: never again.)
    if t.why_not == _CAPACITY and p.reserve_on and t.gt not in p.decided and \
            t.total >= p.largest.get(t.gt, 0) and not (t.cpu or t.mem) and job.topology is None:
        reserve(p, t, k2_order(p, t.fitting, job.id))
    return (wait[0], wait[2], wait[3], p.waits.elsewhere.get(job.id, ""))


def fit(p: Pass, t: Try) -> Step | None:
    """Rules A2-A3, A6-A7, A9, K1, K2: place the gang in the first of its pools, in rule
    K2's order, that holds it now (beside the reservation of its type, rule A9); a shape
    found unfit is remembered until some node grows. Sets the try's `placement` and
    `pool`, or its `why_not` (the first pool's reason in K2 order); a wait that needs no
    victim search is said here."""
    job, cap = t.job, p.cap
    g, reps, cpu, mem, topo = job.gpus_per_replica, job.replicas, t.cpu, t.mem, job.topology
    k2 = t.k2 = t.fitting if len(t.fitting) == 1 else k2_order(p, t.fitting, job.id)
    all_known, saw_reserved, first = True, False, True
    for q in k2:
        shape = (q, g, reps, cpu, mem, topo)
        known = p.unfit.get(shape)
        if (known is None or known[0] != cap.grown) and (cpu or mem):
            known = dominated(p.unfit_by_size.get((q, g, reps, topo)), cpu, mem, cap.grown)
        if known is not None and known[0] == cap.grown:
            code = known[1]
            if code == _CPU_MEMORY and not cap.fits(q, g, reps):
                code = _CAPACITY  # its GPUs are taken too by now
        else:
            all_known = False
            code = _place(p, t, q, shape)
            if t.placement is not None:
                t.pool = q
                return None
        if code == _RESERVED:
            saw_reserved = True
        if first:  # the reason said is the first cluster's in rule K2 order
            t.why_not, first = code, False
    if saw_reserved:  # rule A9 (or W1): it fits, but only on GPUs reserved for another
        p.raw[job.id] = blocked_wait(p, t) or (_RESERVED, t.index, 0, 0)
        return ()
    if t.why_not != _CPU_MEMORY:
        p.all_unfit[t.skey] = (cap.grown, t.why_not)
    if all_known and not p.may_search and not p.nominated and owed(p, t) is None:
        # The common case of a long queue.
        p.raw[job.id] = capacity_wait(p, t, t.why_not)
        if t.why_not == _CAPACITY and p.reserve_on and t.gt not in p.decided:
            reserve(p, t, k2)
        return ()
    return None


def _place(p: Pass, t: Try, q: str, shape: tuple[str, int, int, int, int, Topology | None],
           ) -> int:
    """One pool's try: sets `t.placement` when the gang is placed in pool `q`, else
    remembers the shape unfit and returns its reason code (-1 when placed)."""
    job, cap = t.job, p.cap
    g, reps, cpu, mem, topo = job.gpus_per_replica, job.replicas, t.cpu, t.mem, job.topology
    code = -1
    res = p.reserved.get(t.gt) if p.reserved else None
    if p.book is not None and p.book.ahead and (limits := crossing(p, t)):
        # Rule W1 (with rule A9's room when the job crosses its shadow time too).
        a9 = res.room if res is not None and res.pool == q and not (
            job.max_runtime_seconds is not None
            and job.max_runtime_seconds <= res.seconds) else None
        code = place_ahead(p, t, q, limits, a9)
        if code not in (-1, _RESERVED):
            p.unfit[shape] = (cap.grown, code)
        return code
    if res is not None and res.pool == q and not (
            job.max_runtime_seconds is not None and job.max_runtime_seconds <= res.seconds):
        # Rule A9: a job that may still run at the shadow time only starts on GPUs the
        # reservation leaves free then.
        if p.held_back.get(shape) == cap.grown:
            code = _RESERVED
        else:
            t.placement = place_beside(cap, res, q, g, reps, cpu, mem, topo)
            if t.placement is None and cap.fits(q, g, reps, cpu=cpu, memory=mem, topology=topo):
                p.held_back[shape] = cap.grown
                code = _RESERVED
    else:
        t.placement = cap.place(q, g, reps, cpu=cpu, memory=mem, topology=topo)
    if t.placement is not None:
        t.slots = cap.last_slots  # rule H3
        return -1
    if code < 0:
        code = why_unplaced(cap, q, g, reps, cpu, mem, topo)
        p.unfit[shape] = (cap.grown, code)
        if code != _TOPOLOGY:
            remember_unfit(p.unfit_by_size, (q, g, reps, topo), cpu, mem, cap.grown, code)
    return code


def largest_block_of(cap: Capacity, pools: tuple[str, ...],
                     units: int = 0) -> tuple[int, str, int, str]:
    """Rule E3 over several pools: the largest free block of any (the first pool in key
    order among equals), its node, the free GPUs of all of them, the block's cluster;
    rule H5's block for a replica of `units` slices on packed pools."""
    best = (0, "", 0, "")
    total = 0
    for p in pools:
        largest, node, free = cap.largest_free_block(p, units)
        total += free
        if largest > best[0]:
            best = (largest, node, 0, cap.pool_info[p][1])
    return best[0], best[1], total, best[3]


def dominated(failed: list[tuple[int, int, int, int]] | None, cpu: int, memory: int,
               grown: int) -> tuple[int, int] | None:
    """(grown, code) of a failure at `grown` that asked no more CPU and memory, or None."""
    for c, m, at, code in failed or ():
        if at == grown and cpu >= c and memory >= m:
            return at, code
    return None


def remember_unfit(by_size: dict[tuple[str, int, int, Topology | None],
                                  list[tuple[int, int, int, int]]],
                    key: tuple[str, int, int, Topology | None], cpu: int, memory: int,
                    grown: int, code: int) -> None:
    """Keep the failures at `grown` of one size, at most 16 (a cache, not a record)."""
    kept = [f for f in by_size.get(key, ()) if f[2] == grown][-15:]
    kept.append((cpu, memory, grown, code))
    by_size[key] = kept


def why_unplaced(cap: Capacity, gpu_type: str, gpus: int, replicas: int, cpu: int,
                  memory: int, topology: Topology | None) -> int:
    """The wait reason code of a gang `place` refused: `topology` when it would fit, CPU
    and memory included, but for its required domain (rule A7); `cpu_memory` when its
    GPUs alone would fit (rule A6); else `capacity`. Topology first: a gang that sets
    memory (every job has some, docs/kubernetes.md) and fits anywhere but in one domain
    waits for its domain, not for memory."""
    if topology is not None and cap.fits(gpu_type, gpus, replicas, cpu=cpu, memory=memory):
        return CODE[WaitReason.TOPOLOGY]
    if (cpu or memory) and cap.fits(gpu_type, gpus, replicas):
        return CODE[WaitReason.CPU_MEMORY]
    return CODE[WaitReason.CAPACITY]


def fits_with(cap: Capacity, gpu_type: str, gpus: int, replicas: int,
              held: Mapping[str, int]) -> bool:
    """Rule E2: would the gang fit (GPUs alone) if the GPUs `held` per node (of the pool
    `gpu_type`) were free? The slots now from the buckets, plus what the held GPUs add."""
    free = cap.free
    slots = cap.slots_now(gpu_type, gpus)
    for n, h in held.items():
        f = free[n]
        slots += (f + h) // gpus - f // gpus
    return slots >= replicas

