"""Stage 1, the heads: the queue in rule O1's order with each team's live factor, and
the gates a job passes before any GPU is looked at - its dependencies (rules D1-D2), its
clusters open (rule K8), its array's limit (rule A8)."""

from __future__ import annotations

import heapq
import itertools
import math
import operator
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Protocol

from queueing.policy.dependencies import Counts, Verdict, array_limit_reached, dependencies_verdict
from queueing.policy.priority import PriorityWeights, size_factor
from queueing.policy.snapshot import QueuedJob

from .waits import Wait, WaitReason, closed_words


class Factors(Protocol):
    def factor(self, team: str) -> float: ...
    def charge(self, team: str, gpu_hours: float) -> None: ...


class StaticFactors:
    """Fixed factors for a snapshot without live standings (no entry penalty)."""

    def __init__(self, factors: Mapping[str, float]) -> None:
        self._factors = factors

    def factor(self, team: str) -> float:
        return self._factors.get(team, 1.0)

    def charge(self, team: str, gpu_hours: float) -> None:
        return None


class Charges:
    """The live factors with a running count of what was charged (rule F6)."""

    def __init__(self, inner: Factors) -> None:
        self._inner = inner
        self._cache: dict[str, float] = {}
        self.charged = 0.0
        self.count = 0  # how many charges: one may leave `charged` as it was (rounding)

    def factor(self, team: str) -> float:
        """The exact current factor."""
        return self._inner.factor(team)

    def cached(self, team: str) -> float:
        """The factor as of the team's last charge or the last `refresh` (rule O1)."""
        f = self._cache.get(team)
        if f is None:
            f = self._cache[team] = self._inner.factor(team)
        return f

    def refresh(self) -> None:
        self._cache.clear()

    def charge(self, team: str, gpu_hours: float) -> None:
        if gpu_hours:
            self._inner.charge(team, gpu_hours)
            self._cache.pop(team, None)
            self.charged += gpu_hours
            self.count += 1


# Rule O1: every team's key is recomputed once the usage charged since the last refresh
# exceeds this fraction of the total, so a key is never staler than that.
REFRESH_FRACTION = 0.01
# Rule O1 on the heap: once this many jobs in a row were yielded with no team charged,
# and at least 1/RESORT_SHARE of what is left, the rest of the tier is sorted by its
# keys then (`QueueOrder._rest_sorted`) and yielded from the sort until the next charge
# (a fleet's queue admits early, then mostly waits: docs/performance.md).
RESORT_QUIET = 2048
RESORT_SHARE = 16
# True: a tier reached after some charge starts sorted too (`QueueOrder._keyed_now`);
# False: on the heap from its start (held to it by tests/policy/test_fleet_fast_paths.py).
LATER_SORTED = True


# One job of a team's run in `QueueOrder`: (−job part, submitted, id, index in `jobs`).
_Keyed = tuple[float, datetime, int, int]


class QueueOrder:
    """Rule O1 as an iterator whose keys follow the live standings.

    Higher tier first; within a tier the higher priority (rule P1: weights.fair_share ×
    the team's current F + the job part), then earlier submit time, then lower id.
    A team's jobs share its F, so each (tier, team) list is sorted once by job part; a
    heap over the teams of a tier holds each team's head. After the consumer charges a
    team (rule F6) that team's next head is keyed with its new F. A charge also moves the
    total, and so every other team's F a little: all keys of the tier are recomputed once
    the charges since the last refresh pass `REFRESH_FRACTION` of the total usage.
    O(n log n) to build, O(log teams) per job plus the refreshes.

    While no team has been charged, every key holds the factor of the pass's start, and
    the heap merges the teams' runs by those fixed keys: one sort of the tier gives that
    order (`_tier_sorted`) with no heap operation per job - a long queue's common pass,
    where little or nothing fits. At the first charge the heap takes over where the sort
    was. The runs and the heap are only built for a tier that needs them. A tier reached
    after some charge starts sorted the same way, keyed as the heap would key it then
    (`LATER_SORTED`), and a tier on the heap is sorted again once enough jobs passed with
    no charge (`RESORT_QUIET`): a fleet's charges come early in the pass.
    """

    # False: every tier through the heap, the reference the tests hold the sort to.
    fast = True

    def __init__(self, jobs: Iterable[QueuedJob], *, factors: Charges, weights: PriorityWeights,
                 now: datetime, cluster_gpus: float, first: Iterable[int] = (),
                 usage_total: float = 0.0, units_per_gpu: Mapping[str, int] | None = None,
                 ) -> None:
        self._factors = factors
        self._w = w = weights.fair_share
        self._base = usage_total
        firsts = set(first)
        # Every job once; the iterator yields indices into this list. The sort keys below
        # hold the index, not the job: tuples of numbers and datetimes only, which the
        # garbage collector stops tracking (100,000 tuples holding jobs made every
        # collection of the pass walk them all).
        self.jobs: list[QueuedJob] = list(jobs)
        first_idx: list[int] = []
        # Per job (by index) its −job part; per tier its jobs (indices) and their keys'
        # first term with their team's factor of now (`factors.factor`: no cache is
        # filled before the heap would fill it).
        self._neg: list[float] = [0.0] * len(self.jobs)
        neg = self._neg
        by_tier: defaultdict[int, tuple[list[float], list[int]]] = defaultdict(
            lambda: ([], []))
        # Per tier, per team: `w` × its factor of now, the key's fair-share term.
        offsets: defaultdict[int, dict[str, float]] = defaultdict(dict)
        # Rule P1 without the fair-share term: `job_priority(...).job_part` (its factor
        # functions without the breakdown, the size factor cached per GPU count).
        w_age, w_size, max_age = weights.age, weights.size, weights.max_age_seconds
        sizes: dict[float, float] = {}
        upg = units_per_gpu or None  # rule H4: a job's size in GPU-equivalents
        for index, job in enumerate(self.jobs):
            if firsts and job.id in firsts:
                first_idx.append(index)
                continue
            submitted = job.submitted_at
            # `age_factor(submitted_at=submitted, now=now, max_age_seconds=max_age)`,
            # inlined: one call per queued job.
            if max_age > 0:
                waited = (now - submitted).total_seconds()
                age = (waited if waited > 0.0 else 0.0) / max_age
                if age > 1.0:
                    age = 1.0
            else:
                age = 0.0
            total: float = job.gpus_per_replica * job.replicas
            if upg is not None and job.gpu_type in upg:
                total /= upg[job.gpu_type]
            size = sizes.get(total)
            if size is None:
                size = sizes[total] = size_factor(total_gpus=total, cluster_gpus=cluster_gpus,
                                                  favor_small=weights.favor_small)
            neg[index] = neg_part = -(w_age * age + w_size * size)
            team, tier = job.team, job.tier_rank
            offset = offsets[tier]
            c = offset.get(team)
            if c is None:
                c = offset[team] = w * factors.factor(team)
            keys, indices = by_tier[tier]
            keys.append(neg_part - c)
            indices.append(index)
        js = self.jobs
        first_idx.sort(key=lambda i: (-js[i].tier_rank, js[i].submitted_at, js[i].id))
        self.first = first_idx
        self._count = factors.count
        self._tiers = [(*by_tier[t], offsets[t]) for t in sorted(by_tier, reverse=True)]
        # Every offset a number: a NaN or an infinity would not sort as the heap orders.
        self._finite = all(math.isfinite(c) for o in offsets.values() for c in o.values())

    def __iter__(self) -> Iterator[int]:
        """Indices into `jobs`, in queue order."""
        yield from self.first
        charges = self._factors
        for keys, indices, offset in self._tiers:
            keyed: tuple[list[float], dict[str, float]] | None = (keys, offset)
            if self.fast and self._finite and charges.count != self._count:
                # A tier after some charge (`LATER_SORTED`; else the heap from its start).
                keyed = self._keyed_now(indices, offset) if LATER_SORTED else None
            if self.fast and self._finite and keyed is not None:
                yield from self._tier_sorted(keyed[0], indices, keyed[1])
            else:
                yield from self._tier_heap_from_start(self._runs(indices))

    def _keyed_now(self, indices: list[int], offset: dict[str, float],
                   ) -> tuple[list[float], dict[str, float]] | None:
        """A tier's keys' first terms with each team's factor as the heap would key it
        at the tier's start (`Charges.cached`: a team charged in an earlier tier with its
        new factor, the others as they were last read), and those offsets; None when one
        is not a number."""
        cached, w = self._factors.cached, self._w
        now = {team: w * cached(team) for team in offset}
        if not all(math.isfinite(c) for c in now.values()):
            return None
        js, neg = self.jobs, self._neg
        return [neg[i] - now[js[i].team] for i in indices], now

    def _runs(self, indices: list[int]) -> dict[str, list[_Keyed]]:
        """A tier's jobs per team, each list (−job part, submitted, id, index) sorted."""
        runs = self._runs_from(indices)
        for items in runs.values():
            items.sort()
        return runs

    def _runs_from(self, seq: list[int]) -> dict[str, list[_Keyed]]:
        """`_runs` of a tier from its order `seq` (`_sorted`'s): a team's jobs come in
        its run's order there already."""
        runs: dict[str, list[_Keyed]] = {}
        js, neg = self.jobs, self._neg
        for index in seq:
            job = js[index]
            items = runs.get(job.team)
            if items is None:
                items = runs[job.team] = []
            items.append((neg[index], job.submitted_at, job.id, index))
        return runs

    def _tier_heap_from_start(self, by_team: dict[str, list[_Keyed]]) -> Iterator[int]:
        head = dict.fromkeys(by_team, 0)
        heap = [self._key(team, by_team[team], 0) for team in by_team]
        heapq.heapify(heap)
        return self._tier_heap(by_team, head, heap, self._factors.charged)

    def _tier_sorted(self, keys: list[float], indices: list[int],
                     offset: dict[str, float]) -> Iterator[int]:
        """A tier (`indices`, their `keys`' first terms) in `_tier_heap`'s order while no
        team is charged: the keys of the tier's start, sorted - by the first term alone
        when no two are equal (then nothing else is ever compared). Exact when each
        team's run stays sorted once keyed: two equal keys whose job parts were not
        (rounding) send the tier to the heap at once (so does any tie of keys with
        parts unequal, to be safe)."""
        charges = self._factors
        ordered = self._sorted(keys, indices)
        if ordered is None:
            yield from self._tier_heap_from_start(self._runs(indices))
            return
        seq = ordered
        # What the heap fills at a tier's start: the factor of each of its teams.
        for team in offset:
            charges.cached(team)
        count, charged = charges.count, charges.charged
        for pos, index in enumerate(seq):
            yield index
            if charges.count != count:
                yield from self._heap_after(seq, offset, pos, charged)
                return

    def _sorted(self, keys: list[float], indices: list[int]) -> list[int] | None:
        """`indices` (jobs) in the order of their keys (`keys`' first terms, then
        submitted, then id): sorted by the first term alone when no two are equal. None
        when two equal first terms have unequal job parts (rounding: the heap, which
        sees one head per team, might order them otherwise)."""
        order = sorted(range(len(keys)), key=keys.__getitem__)
        firsts = [keys[i] for i in order]
        seq = [indices[i] for i in order]
        if any(map(operator.eq, firsts, itertools.islice(firsts, 1, None))):
            # Equal first terms: each run of them by (submitted, id), the key's rest.
            js, neg = self.jobs, self._neg
            ties = [p for p, same in enumerate(map(
                operator.eq, firsts, itertools.islice(firsts, 1, None))) if same]
            t = 0
            while t < len(ties):
                start = end = ties[t]
                while t < len(ties) and ties[t] == end:
                    t += 1
                    end += 1
                block = seq[start:end + 1]
                if len({neg[i] for i in block}) > 1:
                    return None
                block.sort(key=lambda i: (js[i].submitted_at, js[i].id))
                seq[start:end + 1] = block
        return seq

    def _heap_after(self, seq: list[int], offset: dict[str, float],
                    pos: int, seen_charged: float) -> Iterator[int]:
        """The rest of a sorted tier (its jobs in the order `seq`) after its job at `pos`
        was charged: the heap as it would be then (every team's head keyed with the
        factor of the tier's start, the charged team's next with its new factor) and on
        with it, its refresh counting the charges from `seen_charged`, the tier's start."""
        by_team = self._runs_from(seq)
        js = self.jobs
        head = dict.fromkeys(by_team, 0)
        for done in itertools.islice(seq, pos + 1):
            head[js[done].team] += 1
        team = js[seq[pos]].team
        heap = [(items[i][0] - offset[t], items[i][1], items[i][2], t, i)
                for t, i in head.items() if t != team and i < len(items := by_team[t])]
        if head[team] < len(by_team[team]):
            heap.append(self._key(team, by_team[team], head[team]))
        heapq.heapify(heap)
        return self._tier_heap(by_team, head, heap, seen_charged)

    def _tier_heap(self, by_team: dict[str, list[_Keyed]], head: dict[str, int],
                   heap: list[tuple[float, datetime, int, str, int]],
                   seen_charged: float) -> Iterator[int]:
        """A tier from `head` (per team, the index of its next job) on: a heap over the
        teams' next jobs, `heap`; a team's next keyed again after each job (its charge,
        rule F6), and every key again once the charges since `seen_charged` pass
        `REFRESH_FRACTION` of the total."""
        charges, w = self._factors, self._w
        cached, cache = charges.cached, charges._cache
        heapreplace, heappop = heapq.heapreplace, heapq.heappop
        # Jobs yielded since the last charge, and how many are left (`_rest_sorted`).
        quiet, count = 0, charges.count
        left = sum(len(by_team[t]) - i for t, i in head.items())
        while heap:
            if charges.charged != seen_charged:
                since = charges.charged - seen_charged
                if since > 0 and since > REFRESH_FRACTION * self._base:
                    self._base += since
                    seen_charged = charges.charged
                    charges.refresh()
                    heap = [self._key(t, by_team[t], i) for t, i in head.items()
                            if i < len(by_team[t])]
                    heapq.heapify(heap)
            if charges.count != count:
                quiet, count = 0, charges.count
            elif quiet >= RESORT_QUIET and quiet * RESORT_SHARE >= left and self.fast:
                sort = self._rest_sorted(by_team, head, heap)
                quiet = 0
                if sort is None:  # keys the sort cannot order as the heap: stay
                    quiet = -left
                else:
                    rest, offsets = sort
                    done = 0
                    for index in rest:
                        yield index
                        done += 1
                        if charges.count != count:
                            break
                    else:
                        return
                    heap = self._heap_at(by_team, head, rest, done, offsets)
                    left -= done
                    continue
            top = heap[0]
            team, i = top[3], top[4]
            items = by_team[team]
            i += 1
            head[team] = i
            quiet += 1
            left -= 1
            yield items[i - 1][3]
            # The consumer has charged the team by now (rule F6): key its next job
            # with the new factor; one sift instead of a pop and a push.
            if i < len(items):
                neg_part, submitted, job_id, _ = items[i]
                f = cache.get(team)  # `charges.cached(team)`, the lookup inlined
                if f is None:
                    f = cached(team)
                heapreplace(heap, (neg_part - w * f, submitted, job_id, team, i))
            else:
                heappop(heap)

    def _rest_sorted(self, by_team: dict[str, list[_Keyed]], head: dict[str, int],
                     heap: list[tuple[float, datetime, int, str, int]],
                     ) -> tuple[list[int], dict[str, float]] | None:
        """The rest of a tier in `_tier_heap`'s order while no team is charged: every
        team's jobs from its `head` on, keyed with the factor its head's key in the `heap`
        holds, sorted (`_sorted`); and each team's `w` × factor. None when some team's
        factor is not that of its key (then the heap stays) or the keys tie with job
        parts unequal."""
        cache, w = self._factors._cache, self._w
        at = {entry[3]: entry[0] for entry in heap}
        keys: list[float] = []
        seq: list[int] = []
        offsets: dict[str, float] = {}
        for team, i in head.items():
            items = by_team[team]
            if i >= len(items):
                continue
            f = cache.get(team)
            if f is None:
                return None
            c = offsets[team] = w * f
            if items[i][0] - c != at.get(team):
                return None
            keys.extend([item[0] - c for item in itertools.islice(items, i, None)])
            seq.extend([item[3] for item in itertools.islice(items, i, None)])
        ordered = self._sorted(keys, seq)
        return None if ordered is None else (ordered, offsets)

    def _heap_at(self, by_team: dict[str, list[_Keyed]], head: dict[str, int],
                 rest: list[int], done: int, offsets: dict[str, float],
                 ) -> list[tuple[float, datetime, int, str, int]]:
        """The heap `_tier_heap` would hold after the first `done` jobs of `rest`, a
        team just charged: each team's head moved past what `rest` gave, keyed as the
        sort keyed it (`offsets`) but the last job's team's, keyed anew with its factor
        now (what `_tier_heap` does after each job)."""
        js = self.jobs
        for index in itertools.islice(rest, done):
            head[js[index].team] += 1
        last = js[rest[done - 1]].team
        heap = []
        for t, i in head.items():
            items = by_team[t]
            if i < len(items):
                neg_part, submitted, job_id, _ = items[i]
                heap.append(self._key(t, items, i) if t == last else
                            (neg_part - offsets[t], submitted, job_id, t, i))
        heapq.heapify(heap)
        return heap

    def _key(self, team: str, items: list[_Keyed],
             i: int) -> tuple[float, datetime, int, str, int]:
        neg_part, submitted, job_id, _ = items[i]
        return (neg_part - self._w * self._factors.cached(team), submitted, job_id, team, i)



def gate(job: QueuedJob, dep_counts: Mapping[tuple[str, int], Counts],
         closed: frozenset[str], array_active: defaultdict[int, int],
         array_limits: Mapping[int, int], never_met: dict[int, str]) -> Wait | None:
    """The wait of a job that may not be considered yet, or None: a dependency not met
    (rule D1; one never met is also put in `never_met`, rule D2: the cycle fails it),
    every cluster it may use disabled (rule K8), its array at its limit (rule A8)."""
    job_id = job.id
    if job.dependencies:  # rules D1-D2
        dep = dependencies_verdict(job.dependencies, dep_counts)
        if dep.verdict is not Verdict.MET:
            never = dep.verdict is Verdict.NEVER
            if never:
                never_met[job_id] = dep.message
            return Wait(job_id, WaitReason.DEPENDENCY_NEVER if never
                        else WaitReason.DEPENDENCY, dep.message)
    if closed and job.clusters and job.clusters <= closed:  # rule K8
        return Wait(job_id, WaitReason.CLUSTER, closed_words(job.clusters))
    array_id = job.array_id
    if array_id is not None and array_limit_reached(active=array_active[array_id],
                                                    limit=array_limits.get(array_id)):
        return Wait(job_id, WaitReason.ARRAY_LIMIT,
                    f"{array_active[array_id]} members of array {array_id} hold "
                    f"GPUs, its limit of {array_limits[array_id]} at once (rule A8)")
    return None
