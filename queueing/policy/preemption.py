"""The victim search (docs/scheduling.md, rules R1-R4 and Q2), on the working copy only.

`find_victims` is called by the admission pass for a queued job that does not fit. It
removes candidate victims from the workspace with `simulate_removal` and puts back every
one it turns out not to need; on success the victims stay removed and the job's placement
reserved (the caller keeps them or calls the returned undo), on failure the workspace is
exactly as before.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from functools import partial
from typing import Literal, cast

from .bookings import Booking
from .quota_tree import QuotaTree
from .snapshot import QueuedJob, RunningJob, Snapshot, TopologyMode
from .workspace import Capacity, Workspace, has_departments, replica_slots


class PreemptionRule(StrEnum):
    PRIORITY = "R1-priority"
    RECLAIM = "R2-reclaim"
    TREE_RECLAIM = "Q6-reclaim"  # rule R2 in a forest with departments
    BOOKED = "W2-booked"  # rules W2, W4: its GPUs are booked (docs/scheduling.md)


@dataclass(frozen=True, slots=True)
class Victim:
    job_id: int
    team: str
    tier_rank: int
    gpus: int
    rule: PreemptionRule


@dataclass(frozen=True, slots=True)
class Preemption:
    """`preemptor_id` will fit once `victims` are gone (rule R8: admitted in a later
    cycle). `placement` is where it fits on the snapshot after the removal."""

    preemptor_id: int
    team: str
    gpu_type: str
    victims: tuple[Victim, ...]
    placement: tuple[str, ...]
    cluster: str = ""  # rule K7: the one cluster of the victims and the placement
    # Rule R11: made for an owed claim (rules R3's protection, R5 and R9 did not apply).
    owed: bool = False
    # Rules W2, W4: made for this booking (stages/bookings.py); `preemptor_id` 0 when no
    # job preempts (rule W2 empties the booked GPUs at the booking's start).
    booking: Booking | None = None

    @property
    def rules(self) -> tuple[str, ...]:
        return tuple(sorted({str(v.rule) for v in self.victims}))


def is_protected(job: RunningJob, now: datetime, max_preemptions: int | None = None) -> bool:
    """Rule R3: a job of a non-preemptible tier, one that has run less than its tier's
    minimum runtime, or one already preempted `max_preemptions` times (None: no such
    limit) is never a victim - but for rule Q2's reclaim (`reclaim_only`)."""
    return not job.preemptible or _limited(job, now, max_preemptions)


def _limited(job: RunningJob, now: datetime, max_preemptions: int | None) -> bool:
    return (job.ran_seconds(now) < job.min_runtime_seconds
            or (max_preemptions is not None and job.preemptions >= max_preemptions))


def reclaim_only(job: RunningJob, now: datetime, max_preemptions: int | None = None) -> bool:
    """Rule Q2: a job of a non-preemptible tier (past its minimum runtime and the per-job
    limit of R3) is a victim only for a reclaim (R2) of GPUs its team borrows: whatever
    the tiers, what another team was guaranteed can always be taken back."""
    return not job.preemptible and not _limited(job, now, max_preemptions)


def work_lost_gpu_hours(job: RunningJob, now: datetime, units_per_gpu: int = 1) -> float:
    """Rule R4: the work a preemption of `job` at `now` throws away, in GPU-hours: its
    GPUs × the time since its current attempt's last checkpoint, or since its start when
    it reported none (0 while admitted, not started). Rule H4: its units / the type's
    `units_per_gpu` (a 0.25 fraction loses a quarter of a GPU's hour per hour)."""
    return job.total_gpus / units_per_gpu * job.lost_seconds(now) / 3600.0


# False: every search reads all its candidates, the reference the tests hold
# `find_victims`'s shortcut on the lowest tier (`Workspace.victim_floor`) to.
_FLOOR = True
# False: every search builds and sorts all its candidates (`_candidates`) and weighs
# every node they run on, the reference the tests hold the search by rule Q6's
# nearness, one level at a time (`_Levels`, `_take_per_replica_by_level`), to.
_INDEX = True
# False: step 2 weighs every node of a packed pool the levels reach for a replica of
# whole GPUs, the reference the tests hold the bound per node (`_packed_bounds`) to.
_BOUND = True
# False: a claim of one whole GPU builds and weighs its levels like any other, the
# reference the tests hold its search in rule R4's price order (`_one_gpu`) to.
_ONE = True
# False: such a claim in a flat forest sets up its level per search (each team's flag of
# rule R2 and the first job of each of its runs), the reference the tests hold the
# heads kept across the pass (`_Kept`, `_one_gpu_kept`) to.
_KEPT = True
# False: a claim of one whole GPU that asks CPU or memory (rule A6) builds and weighs its
# levels like any other, the reference the tests hold `_one_gpu` for such claims to.
_ONE_A6 = True
# How many entries no longer current a kept heap holds beyond twice its current ones
# before it is made again (`_Kept.sync`); the tests set 0 to make it often.
_STALE = 32


def _unprotected(ws: Workspace, gpu_type: str, now: datetime,
                 protect: bool = True) -> list[tuple[RunningJob, float]]:
    """The running jobs of `gpu_type` that rule R3 does not protect at `now` (and the
    non-preemptible ones rule Q2 leaves to reclaim), in `ws.running_by_type` order, each
    with the work its preemption would lose (rule R4: since its last checkpoint, else its
    start). `protect` False: rule R11's owed claim, which R3's minimum runtime and per-job
    limit do not refuse - every running job of the type. Cached on the workspace: its
    running jobs never change."""
    key = (gpu_type, now, protect)
    pool = ws.victim_pools.get(key)
    if pool is None:
        # `not _limited(r, now, limit)` and `work_lost_gpu_hours(r, now)` with two
        # subtractions per job: this runs over every running job of the type, once for
        # both lists (a pass with owed claims and others asks both).
        limit = ws.snapshot.preemption.max_preemptions_per_job
        now_ts = now.timestamp()
        per_unit = 1.0 / ws.snapshot.units_per_gpu.get(gpu_type, 1)  # rule H4
        every: list[tuple[RunningJob, float]] = []
        kept: list[tuple[RunningJob, float]] = []
        for r in ws.running_by_type.get(gpu_type, ()):
            started = r.started_at
            if started is None:
                ran = lost = 0.0
            else:
                ran = lost = now_ts - started.timestamp()
                if ran < 0.0:
                    ran = lost = 0.0
                checkpoint = r.checkpointed_at
                if checkpoint is not None and checkpoint > started:
                    lost = now_ts - checkpoint.timestamp()
                    if lost < 0.0:
                        lost = 0.0
            item = (r, r.gpus_per_replica * r.replicas * per_unit * lost / 3600.0)
            every.append(item)
            if not (ran < r.min_runtime_seconds
                    or (limit is not None and r.preemptions >= limit)):
                kept.append(item)  # else rule R3 (a non-preemptible job stays: rule Q2)
        for protects, jobs in ((True, kept), (False, every)):
            k = (gpu_type, now, protects)
            ws.victim_pools[k] = jobs
            ws.victim_floor[k] = min((r.tier_rank for r, _ in jobs if r.preemptible),
                                     default=None)
        pool = ws.victim_pools[key]
    return pool


def find_victims(
    ws: Workspace, job: QueuedJob, *, now: datetime, factor: Callable[[str], float],
    pool: str | None = None, protect: bool = True, spared: Collection[int] = (),
) -> tuple[Preemption, Callable[[], None]] | None:
    """Rules R1-R4: a minimal set of victims whose removal lets `job` fit, or None.

    On success the victims are removed from the workspace and the job's placement is
    reserved on it; the returned function undoes both. On None nothing changed.

    1. Candidates: running jobs of the job's GPU type that rule R1 or (when the job's
       team stays within its nominal) rule R2 allows, minus the protected ones (R3),
       ordered by rule R4 (lowest tier; for reclaim the lowest F; least work lost;
       then id). When the job's own team is at its ceiling (Q1), first its own
       lower-tier jobs, in that order, until the ceiling allows it.
    2. Node-aware greedy: for each replica that has no room, pick the node whose
       victims are cheapest by rule R4 (the highest tier among them lowest, then the
       least work lost in total, then the fewest, then node name) and take them.
       While the quota pool (rule Q1) still refuses the job, take more in R4 order.
    3. Minimize: put back each victim, most valuable first, whenever the job still fits
       without it, so no victim in the result can be spared.
    Rule K7: the job is placed on the nodes of `pool` (`workspace.pool_key`; None = its
    type's pool in the only cluster), and only jobs running in that pool's cluster are
    candidates - the quota stays per GPU type across clusters. The caller tries the
    clusters in rule K2 order.
    `protect` False (rule R11, an owed claim): rule R3's minimum runtime and per-job
    limit protect no candidate; which jobs are candidates is still rules R1, R2 and Q2.
    `spared`: running jobs that are no candidates for this job (rule W4: jobs lent a
    booking's GPUs it could not use once they are freed).
    The same workspace always gives the same answer.
    """
    gt, g, reps, team = job.gpu_type, job.gpus_per_replica, job.replicas, job.team
    cap = ws.capacity
    pool = gt if pool is None else pool
    cluster = cap.pool_info[pool][1] if pool in cap.pool_info else ""
    cpu = mem = 0
    if gt in cap.constrained:  # rule A6 only where nodes report CPU or memory
        cpu, mem = job.cpu_millicores or 0, job.memory_bytes or 0
    topo = job.topology

    def fits() -> bool:
        return ws.fits(team, gt, g, reps, cpu=cpu, memory=mem, topology=topo, pool=pool)

    within_nominal = ws.ledger.within_own_nominal(team, gt, job.total_gpus)
    unprotected = _unprotected(ws, gt, now, protect)
    if not within_nominal and _FLOOR:
        # Beyond its nominal a job preempts only by rule R1, a preemptible job of a lower
        # tier: when no unprotected job of the type is one, there is no candidate (a long
        # queue's searches on a cluster its top tier fills).
        floor = ws.victim_floor[(gt, now, protect)]
        if floor is None or floor >= job.tier_rank:
            return None
    if (_ONE and _INDEX and g == 1 and reps == 1 and (_ONE_A6 or (not cpu and not mem))
            and topo is None and not (cap.packed and pool in cap.packed)
            and ws.ledger.over_ceiling(team, gt, job.total_gpus) is None
            and not cap.fits(pool, 1, 1)):
        one = _one_gpu(ws, _Levels(ws, job, _by_team(ws, gt, now, protect), cluster,
                                   within_nominal, factor, spared), pool, now, protect,
                       cpu, mem)
        if one is None:
            return None
        if one is not False:
            victim, rule, key = one
            undo_one = ws.simulate_removal([victim])
            ok = fits()
            undo_one()
            if ok:
                return _found(ws, job, pool, cluster, cpu, mem, {victim.id: rule},
                              _minimize(ws, [victim], {victim.id: key}, fits))
        # else the quota pool refuses it still (rule Q1), or some node's way may need
        # more than one victim (rule A6): the search below decides
    cands: list[_Cand] | _Levels
    if _INDEX:
        cands = _Levels(ws, job, _by_team(ws, gt, now, protect), cluster, within_nominal,
                        factor, spared)
        if not cands.more():
            return None
        rule_of, key_of = cands.rule_of, cands.key_of
    else:
        cands = _candidates(ws, job, unprotected, cluster, within_nominal, factor)
        if spared:
            cands = [c for c in cands if c[1].id not in spared]
        if not cands:
            return None
        cands.sort(key=lambda c: c[0])
        rule_of = {r.id: rule for _, r, rule in cands}
        key_of = {r.id: k for k, r, _ in cands}

    taken = _take_enough(ws, job, cands, rule_of, fits, pool, cpu, mem)
    if taken is None:
        return None
    return _found(ws, job, pool, cluster, cpu, mem, rule_of, _minimize(ws, taken, key_of, fits))


def _found(ws: Workspace, job: QueuedJob, pool: str, cluster: str, cpu: int, mem: int,
           rule_of: dict[int, PreemptionRule], victims: list[RunningJob],
           ) -> tuple[Preemption, Callable[[], None]] | None:
    """`find_victims`' end: `victims` removed and the job placed, with the undo."""
    cap = ws.capacity
    gt, g, reps, team, topo = (job.gpu_type, job.gpus_per_replica, job.replicas, job.team,
                               job.topology)
    undo_victims = ws.simulate_removal(victims)
    placement = cap.place(pool, g, reps, cpu=cpu, memory=mem, topology=topo)
    if placement is None:  # pragma: no cover - fits() said it does
        undo_victims()
        return None
    slots = cap.last_slots
    found = Preemption(
        job.id, team, gt,
        tuple(Victim(r.id, r.team, r.tier_rank, r.total_gpus, rule_of[r.id]) for r in victims),
        placement, cluster,
    )

    def undo_found() -> None:
        cap.release(placement, g, cpu=cpu, memory=mem, slots=slots)
        undo_victims()

    return found, undo_found


# Rule R4's sort key of a candidate: (rule Q6's nearness, tier rank, team F for reclaim
# else 0, work lost, id). Nearness is minus the depth of the nearest node the claimant's
# team and the victim's are under: 0 for every candidate in a flat forest and for the
# claimant's own team, so the tree only orders other teams' jobs nearest first.
_Key = tuple[int, int, float, float, int]
_Cand = tuple[_Key, RunningJob, PreemptionRule]


def _take_enough(ws: Workspace, job: QueuedJob, cands: list[_Cand] | _Levels,
                 rule_of: dict[int, PreemptionRule], fits: Callable[[], bool], pool: str,
                 cpu: int, mem: int) -> list[RunningJob] | None:
    """Steps 1b and 2 of `find_victims`: the victims that make the job fit (its own
    team's lower tiers first while it is over its ceiling, then node-aware greedy, then
    more in R4 order while the quota pool refuses it), or None. The workspace is as
    before either way."""
    gt, team, g, reps, topo = (job.gpu_type, job.team, job.gpus_per_replica, job.replicas,
                               job.topology)
    taken: list[RunningJob] = []
    undos: list[Callable[[], None]] = []
    levels = cands if isinstance(cands, _Levels) else None
    # `ledger.reclaimable` per victim team; only a removal changes it.
    sources: dict[str, bool] = {}

    def take(victims: list[RunningJob]) -> None:
        sources.clear()
        taken.extend(victims)
        undos.append(ws.simulate_removal(victims))

    def undo_all() -> None:
        for u in reversed(undos):
            u()

    def still_allowed(r: RunningJob) -> bool:
        if r.id in ws.removed:
            return False
        # Rules R2, Q2 and Q6 are re-checked as victims go: another team stops being
        # a source of victims once it (or, in a tree, its path below the claimant's
        # nearest common node) no longer borrows.
        if r.team == team and rule_of[r.id] is PreemptionRule.PRIORITY:
            return True
        got = sources.get(r.team)
        if got is None:
            got = sources[r.team] = ws.ledger.reclaimable(team, r.team, gt)
        return got

    # 1b. Its own team's ceiling (Q1): only the team's own lower-tier jobs make room;
    # in a tree (rule Q4) over a department's borrowing limit, any candidate under it.
    def binding() -> int:
        """Rule Q4's binding node's depth (`under_limit`); past any when it is the team."""
        limit = ws.ledger.tree_limit(team, gt, job.total_gpus) if ws.ledger.tree else None
        if limit is None or limit[0] == team or ws.ledger.tree is None:
            return 1 << 30
        return ws.ledger.tree.depth(limit[0])

    for _, r, _ in (levels.under_path(binding) if levels is not None else cands):
        if ws.ledger.over_ceiling(team, gt, job.total_gpus) is None:
            break
        if (r.team == team or ws.ledger.under_limit(team, r.team, gt, job.total_gpus)) \
                and still_allowed(r):
            take([r])
    if ws.ledger.over_ceiling(team, gt, job.total_gpus) is not None:
        undo_all()
        return None
    # 2. node-aware greedy, one replica at a time, reserving each placed replica; for a
    # required topology (rule A7) per domain instead.
    if topo is not None and topo.mode is TopologyMode.REQUIRED:
        ok = _take_in_one_domain(ws, _flat(cands), take, still_allowed, fits, pool,
                                 topo.level)
    elif levels is not None:
        ok = _take_per_replica_by_level(ws, levels, take, still_allowed, pool, g, reps,
                                        cpu, mem)
    else:
        ok = _take_per_replica(ws, _flat(cands), take, still_allowed, pool, g, reps, cpu,
                               mem)
    if ok:
        for _, r, _ in cands:
            if fits():
                break
            if still_allowed(r):
                take([r])
        ok = fits()
    undo_all()
    return taken if ok and taken else None


def _candidates(ws: Workspace, job: QueuedJob, unprotected: list[tuple[RunningJob, float]],
                cluster: str, within_nominal: bool,
                factor: Callable[[str], float]) -> list[_Cand]:
    """Step 1 of `find_victims`: per running job of the type, skip it when removed or
    protected (R3) or in another cluster (K7); R1 (strictly lower tier) or else, within
    nominal, R2 (another team's job of the same or a lower tier, borrowing beyond its
    nominal); keyed by rule R4, unsorted. The protection and the start-time part of the
    key only depend on `now`: computed once per workspace (the pass searches many
    times)."""
    cands: list[_Cand] = []
    gt, team, tier = job.gpu_type, job.team, job.tier_rank
    ledger = ws.ledger
    removed = ws.removed
    priority = PreemptionRule.PRIORITY
    reclaim = PreemptionRule.TREE_RECLAIM if ledger.departments else PreemptionRule.RECLAIM
    running_cluster = ws.running_cluster
    # Rule Q6: per victim team, whether it borrows below the nearest common node, how
    # near it is, and whether the claimant's path below that node is within guarantee.
    seen: dict[str, tuple[bool, int, bool]] = {}
    reach = ledger.reclaim_reach(team, gt, job.total_gpus) if within_nominal else None

    def borrowing(other: str) -> tuple[bool, int, bool]:
        got = seen.get(other)
        if got is None:
            got = seen[other] = (ledger.reclaimable(team, other, gt),
                                 ledger.nearness(team, other, gt),
                                 reach is None or ledger.lca(team, other) in reach)
        return got

    for r, lost in unprotected:
        if r.id in removed or running_cluster[r.id] != cluster:  # rule K7: its cluster only
            continue
        if not r.preemptible:
            # Rule Q2: a non-preemptible job only goes to reclaim its team's borrowing,
            # whatever the tiers; after every preemptible candidate (its tier sorts it).
            if within_nominal and r.team != team and (b := borrowing(r.team))[0] and b[2]:
                cands.append(((b[1], r.tier_rank, factor(r.team), lost, r.id), r, reclaim))
        elif r.tier_rank < tier and (r.team == team or borrowing(r.team)[0]):
            # Rule Q2: another team's job only while that team borrows, so no tier takes
            # what a team was guaranteed.
            near = 0 if r.team == team else borrowing(r.team)[1]
            cands.append(((near, r.tier_rank, 0.0, lost, r.id), r, priority))
        elif (within_nominal and r.team != team and r.tier_rank <= tier
              and (b := borrowing(r.team))[0] and b[2]):
            cands.append(((b[1], r.tier_rank, factor(r.team), lost, r.id), r, reclaim))
    return cands


def _by_team(ws: Workspace, gpu_type: str, now: datetime,
             protect: bool) -> dict[str, list[tuple[RunningJob, float]]]:
    """`_unprotected(ws, gpu_type, now, protect)` per team, each in its order; kept on
    the workspace as that list is."""
    key = (gpu_type, now, protect)
    got = ws.victim_teams.get(key)
    if got is None:
        got = ws.victim_teams[key] = {}
        for item in _unprotected(ws, gpu_type, now, protect):
            got.setdefault(item[0].team, []).append(item)
    return got


def _flat(cands: list[_Cand] | _Levels) -> list[_Cand]:
    """Every candidate, in rule R4's order, of either form."""
    return cands.all() if isinstance(cands, _Levels) else cands


class _Levels:
    """`_candidates`, sorted and without `spared`, made one level of rule Q6's nearness
    (the first part of rule R4's key) at a time, nearest first: the teams under the
    claimant, then those under its department, and so on up to the fleet, each group
    borrowing teams first (`Ledger.nearness`); the claimant's own team with the fleet's
    borrowing teams (nearness 0). A level reads only its own teams' jobs: a search that
    finds its victims among the nearest teams never reads the rest of the type's
    running jobs (136,000 fractions in docs/performance.md's fleet).

    Which teams are sources (`Ledger.reclaimable`) and how near they are is read when
    their group is: the victims the search has taken by then move the ledger, but only
    on their own paths, under a nearer node than the group's - and a team of the group
    is a source by the nodes of its path below the group's node, which those paths
    never meet. So each group reads what `_candidates` read when the search began.
    `items` is a prefix of `_candidates`' sorted list, `ends` where each level made so
    far ends in it."""

    def __init__(self, ws: Workspace, job: QueuedJob,
                 by_team: dict[str, list[tuple[RunningJob, float]]], cluster: str,
                 within_nominal: bool, factor: Callable[[str], float],
                 spared: Collection[int]) -> None:
        ledger = ws.ledger
        self.ws, self.job, self.by_team, self.cluster = ws, job, by_team, cluster
        self.within, self.factor, self.spared = within_nominal, factor, spared
        self.tree = ledger.running_tree
        self.reach = (ledger.reclaim_reach(job.team, job.gpu_type, job.total_gpus)
                      if within_nominal else None)
        self.reclaim = (PreemptionRule.TREE_RECLAIM if ledger.departments
                        else PreemptionRule.RECLAIM)
        self.items: list[_Cand] = []
        self.ends: list[int] = []
        self.rule_of: dict[int, PreemptionRule] = {}
        self.key_of: dict[int, _Key] = {}
        # The groups still to read: (the nearest node the claimant and its teams are
        # under, its depth, the subtree already read), nearest first; then the levels
        # of the group being read, as (nearness, [(team, reclaim allowed by Q6's reach)]).
        self._groups: list[tuple[str, int, str | None]] = []
        if self.tree is None:
            self._groups.append(("", 0, None))
        else:
            path = self.tree.path(job.team)
            below: str | None = None
            for k, node in enumerate(path):
                self._groups.append((node, len(path) - k, below))
                below = node
            self._groups.append(("", 0, below))
        self._groups.reverse()
        self._pending: list[tuple[int, list[tuple[str, bool]]]] = []
        self._fleet_from: int | None = None  # where the fleet's group starts in `items`

    def _flag(self, node: str) -> bool:
        """Does `node` (a team when flat: one group, read at once) borrow?"""
        gt = self.job.gpu_type
        if self.tree is None:
            return self.ws.ledger.borrowing(node, gt)
        return self.tree.borrowing(node, gt)

    def _teams_under(self, top: str, below: str | None) -> list[str]:
        """The teams with candidates in `top`'s subtree (all of them at the fleet, "")
        but `below`'s, `top` included."""
        assert self.tree is not None
        children, out, stack = self.tree.children, [], [top]
        while stack:
            node = stack.pop()
            if node != below:
                if node in self.by_team and node != "":
                    out.append(node)
                stack.extend(children.get(node, ()))
        return out

    def _next_group(self) -> None:
        """Split the next group's teams into its two levels (borrowing teams first)."""
        top, depth, below = self._groups.pop()
        team = self.job.team
        if top == "":
            self._fleet_from = len(self.items)
        if self.tree is None:
            teams = [t for t in self.by_team if t != team]
        else:
            teams = [t for t in self._teams_under(top, below) if t != team]
        reach_ok = self.reach is None or top in self.reach
        near: list[tuple[str, bool]] = []
        far: list[tuple[str, bool]] = []
        for t in teams:
            if self.tree is None:
                if self._flag(t):
                    near.append((t, reach_ok))
                continue
            path = self.tree.path(t)
            if not any(self._flag(n) for n in path[:len(path) - depth]):
                continue  # not reclaimable (`Ledger.reclaimable`): no candidate
            (near if self._flag(t) else far).append((t, reach_ok))
        if top == "":
            near.append((team, False))  # its own lower tiers (rule R1), nearness 0
        if self.tree is None:
            self._pending = [(0, near)]
        else:
            self._pending = [(-2 * depth + 1, far), (-2 * depth, near)]

    def more(self, within: bool = False) -> bool:
        """Make the next level that has candidates; False when none is left (`within`:
        in the group being read)."""
        while self._pending or (self._groups and not within):
            if not self._pending:
                self._next_group()
                continue
            nearness, teams = self._pending.pop()
            made = self._level(nearness, teams)
            if made:
                made.sort(key=lambda c: c[0])
                for k, r, rule in made:
                    self.rule_of[r.id] = rule
                    self.key_of[r.id] = k
                self.items.extend(made)
                self.ends.append(len(self.items))
                return True
        return False

    def _level(self, nearness: int, teams: list[tuple[str, bool]]) -> list[_Cand]:
        """`_candidates`' rules on the jobs of `teams`, all at `nearness` but the
        claimant's own (0 too)."""
        job, ws, factor = self.job, self.ws, self.factor
        own, tier, within = job.team, job.tier_rank, self.within
        removed, where, cluster, spared = ws.removed, ws.running_cluster, self.cluster, \
            self.spared
        priority, reclaim = PreemptionRule.PRIORITY, self.reclaim
        out: list[_Cand] = []
        for t, reach_ok in teams:
            if t == own:
                for r, lost in self.by_team.get(t, ()):
                    if r.preemptible and r.tier_rank < tier and r.id not in removed \
                            and where[r.id] == cluster and r.id not in spared:
                        out.append(((0, r.tier_rank, 0.0, lost, r.id), r, priority))
                continue
            may_reclaim = within and reach_ok
            f = factor(t) if may_reclaim else 0.0
            for r, lost in self.by_team[t]:
                if r.id in removed or where[r.id] != cluster or r.id in spared:
                    continue
                if not r.preemptible:
                    if may_reclaim:
                        out.append(((nearness, r.tier_rank, f, lost, r.id), r, reclaim))
                elif r.tier_rank < tier:
                    out.append(((nearness, r.tier_rank, 0.0, lost, r.id), r, priority))
                elif may_reclaim and r.tier_rank <= tier:
                    out.append(((nearness, r.tier_rank, f, lost, r.id), r, reclaim))
        return out

    def __iter__(self) -> Iterator[_Cand]:
        i = 0
        while i < len(self.items) or self.more():
            yield self.items[i]
            i += 1

    def under_path(self, binding: Callable[[], int]) -> Iterator[_Cand]:
        """The candidates step 1b of `_take_enough` may take, in order: those of the
        teams under rule Q4's binding node (`Ledger.under_limit`; `binding()`: its
        depth now, more than any when it is the claimant's own team), then the
        claimant's own team's (its lower tiers, rule Q1). The binding node is on the
        claimant's path, so the fleet's other teams are never under it, nor a group's
        teams while it is below the group's node: no candidate of such a group is taken,
        the ledger does not move, and neither are the farther groups'."""
        i = 0
        while self._fleet_from is None or i < self._fleet_from:
            if i < len(self.items):
                yield self.items[i]
                i += 1
                continue
            if self._pending and self.more(within=True):
                continue  # the next level of the group being read
            if not self._groups:
                break
            top, depth, _ = self._groups[-1]
            if top == "" or binding() > depth:
                break  # the fleet's group is next, or a group none of it is taken from
            self._next_group()
        own = self._level(0, [(self.job.team, False)])
        own.sort(key=lambda c: c[0])
        for c in own:
            self.rule_of[c[1].id] = c[2]
            self.key_of[c[1].id] = c[0]
            yield c

    def team_levels(self) -> Iterator[tuple[int, list[tuple[str, bool]]]]:
        """The levels `more` would make, each as (nearness, [(team, reclaim allowed by
        rule Q6's reach)]), without reading their jobs; nearest first."""
        while self._pending or self._groups:
            if not self._pending:
                self._next_group()
                continue
            yield self._pending.pop()

    def all(self) -> list[_Cand]:
        while self.more():
            pass
        return self.items


_Run = tuple[list[tuple[float, int, RunningJob]], list[int]]


def _team_runs(ws: Workspace, key: tuple[str, datetime, bool, str],
               by_team: dict[str, list[tuple[RunningJob, float]]], team: str,
               ) -> list[tuple[bool, int, _Run]]:
    """`team`'s jobs of `_by_team` in cluster `key[3]` (rule K7) per (preemptible,
    tier), each in rule R4's order within it (least work lost, then id), with the index
    of its first job not removed; made when a search first reads the team and kept on
    the workspace for the pass (`Workspace.victim_runs`; a restored job moves that
    index back, `Workspace.simulate_removal`). The work each loses goes to
    `Workspace.victim_lost`."""
    runs = ws.victim_runs.setdefault(key, {})
    got = runs.get(team)
    if got is None:
        where, cluster = ws.running_cluster, key[3]
        lost_of = ws.victim_lost.setdefault(key, {})
        grouped: dict[tuple[bool, int], list[tuple[float, int, RunningJob]]] = {}
        for r, lost in by_team.get(team, ()):
            if where[r.id] == cluster:
                lost_of[r.id] = lost
                grouped.setdefault((r.preemptible, r.tier_rank), []).append((lost, r.id, r))
        got = runs[team] = []
        marks = ws.victim_marks
        for (pre, rank), items in grouped.items():
            items.sort(key=lambda x: (x[0], x[1]))
            first = [0]
            got.append((pre, rank, (items, first)))
            for i, (_, _, r) in enumerate(items):
                marks.setdefault(r.id, []).append((first, i))
    return got


def _nodes_of(ws: Workspace, gpu_type: str) -> dict[str, list[RunningJob]]:
    """Per node, the running jobs of `gpu_type` on it (`Workspace.victim_nodes`)."""
    got = ws.victim_nodes.get(gpu_type)
    if got is None:
        got = ws.victim_nodes[gpu_type] = {}
        for r in ws.running_by_type.get(gpu_type, ()):
            for name in dict.fromkeys(r.nodes):
                got.setdefault(name, []).append(r)
    return got


# `_one_gpu`'s answer: its victim, the victim's rule and key; None: no node can make
# room; False: a node's way may need more than one victim (rule A6), the general search
# decides.
_One = tuple[RunningJob, PreemptionRule, _Key] | None | Literal[False]


def _one_gpu(ws: Workspace, levels: _Levels, pool: str, now: datetime,
             protect: bool, cpu: int = 0, mem: int = 0) -> _One:
    """Steps 2 and 3 of `find_victims` for a claim of one replica of one whole GPU
    (no topology asked, not over its ceiling, no free GPU in `pool`): its victim, that
    victim's rule and key, None when no node can make room, or False when the way of
    some node may need more than one victim (rule A6: `cpu`, `mem` short there).

    On a node with no free GPU, any one candidate makes room for the GPU, so each
    node's way is its first candidate in rule R4's order and its price (`_cost`) that
    candidate's - as long as that candidate's CPU and memory (rule A6) are enough. A
    way of two or more victims beats a lone candidate's only if its first victim (its
    node's first by key) comes before that candidate in the price order below (its
    farthest nearness, highest tier and total work lost are no less than its first
    victim's, and with total work lost equal it has more victims): so the search gives
    up (False) at the first candidate that is its node's first but does not make room
    there alone, and until then is the one for a claim asking no CPU or memory. The
    search keeps the first candidate, in the order of the price (nearness, tier, work
    lost, then the key), that is the first candidate by key of a node of `pool` that
    can hold the replica emptied, the node of least name among such. Level by level
    of rule Q6 (`_Levels`): a node with a candidate of a nearer level made room there.
    The candidates are read in that order from the type's running jobs kept per (team,
    preemptible, tier) sorted for the pass (`_team_runs`), merged over the level's teams:
    the search reads the few cheapest instead of every candidate of the fleet. The same
    victim as `_take_per_replica_by_level` and `_minimize` find."""
    if _KEPT and levels.tree is None:
        return _one_gpu_kept(ws, levels, pool, now, protect, cpu, mem)
    job = levels.job
    own, tier, within = job.team, job.tier_rank, levels.within
    key_runs = (job.gpu_type, now, protect, levels.cluster)
    removed, spared, cluster = ws.removed, levels.spared, levels.cluster
    by_team = levels.by_team
    lost_of = ws.victim_lost.setdefault(key_runs, {})
    priority, reclaim = PreemptionRule.PRIORITY, levels.reclaim
    for nearness, teams in levels.team_levels():
        # Per team of the level: (may it be reclaimed from, its F for the key).
        info: dict[str, tuple[bool, float]] = {}
        heads: list[tuple[int, float, float, int, int, int]] = []
        sources: list[tuple[_Run, PreemptionRule, float]] = []
        for t, reach_ok in teams:
            runs = _team_runs(ws, key_runs, by_team, t)
            if t == own:
                info[t] = (False, 0.0)
                picks = [(run, rank, priority, 0.0) for pre, rank, run in runs
                         if pre and rank < tier]
            else:
                may_reclaim = within and reach_ok
                f = levels.factor(t) if may_reclaim else 0.0
                info[t] = (may_reclaim, f)
                picks = []
                for pre, rank, run in runs:
                    if not pre:
                        if may_reclaim:
                            picks.append((run, rank, reclaim, f))
                    elif rank < tier:
                        picks.append((run, rank, priority, 0.0))
                    elif may_reclaim and rank == tier:
                        picks.append((run, rank, reclaim, f))
            for run, rank, rule, f in picks:
                sources.append((run, rule, f))
                i = _first_in(run, removed, spared)
                if i < len(run[0]):
                    lost, rid, _ = run[0][i]
                    heads.append((rank, lost, f, rid, len(sources) - 1, i))
        heapq.heapify(heads)
        key_of = partial(_level_key, nearness=nearness, info=info, own=own, tier=tier,
                         lost_of=lost_of)
        while heads:
            rank, lost, f, rid, k, at = heapq.heappop(heads)
            run, rule, _ = sources[k]
            r = ws.running_by_id[rid]
            near = 0 if r.team == own else nearness
            key: _Key = (near, rank, f, lost, rid)
            first = _first_on_a_node(ws, r, key, pool, cluster, spared, key_of, cpu, mem)
            if first is None:
                return False
            if first:
                return r, rule, key
            i = _first_in(run, removed, spared, at + 1)
            if i < len(run[0]):
                lost, rid, _ = run[0][i]
                heapq.heappush(heads, (rank, lost, f, rid, k, i))
    return None


# A kept head: (work lost, id, run number, the run's version when pushed, index in the run).
_Head = tuple[float, int, int, int, int]


class _Kept:
    """`_one_gpu`'s level in a flat forest, kept across a pass per (GPU type, now, rule R3
    applies, cluster): every team's runs (`_team_runs`, each numbered) and, per
    (preemptible, tier), a heap of the first job not removed of each run of a team that
    borrows (rules R2, Q2: the only other teams a claim reads), by (work lost, id).

    A team's runs are made when it first borrows or claims (`team`), as `_one_gpu`
    makes them when it first reads the team. A run's entry is current while its version
    is the run's (`vers`); a run whose first job or whose team's flag changed gets a new
    version and, while its team borrows, a new entry. What changes them is a victim taken
    or restored, or a booking's jobs moved (rule W4): each appends its team to
    `Ledger.running_moves`, and `sync` reads only the teams appended since it last did.
    So a search costs the categories it reads and the candidates it pops, not the
    level's teams."""

    def __init__(self, ws: Workspace, key_runs: tuple[str, datetime, bool, str],
                 by_team: dict[str, list[tuple[RunningJob, float]]]) -> None:
        self.ws, self.gpu_type, self.key_runs, self.by_team = ws, key_runs[0], key_runs, \
            by_team
        self.runs: list[_Run] = []
        self.team_of: list[str] = []
        self.cat_of: list[int] = []  # per run, its category's number
        self.vers: list[int] = []
        self.heads: list[int] = []  # per run, the index of its kept head; -1: none kept
        self.of_team: dict[str, list[int]] = {}
        self.cats: list[tuple[bool, int]] = []  # (preemptible, tier rank)
        self.cat_no: dict[tuple[bool, int], int] = {}
        self.heaps: list[list[_Head]] = []
        self.live: list[int] = []  # per category, its runs with a kept head
        self.flags: dict[str, bool] = {}
        self.cursor = len(ws.ledger.running_moves)
        for team in by_team:
            self._refresh(team)

    def team(self, team: str) -> list[int]:
        """`team`'s run numbers, its runs made and numbered the first time."""
        nos = self.of_team.get(team)
        if nos is None:
            nos = self.of_team[team] = []
            for pre, rank, run in _team_runs(self.ws, self.key_runs, self.by_team, team):
                c = self.cat_no.get((pre, rank))
                if c is None:
                    c = self.cat_no[(pre, rank)] = len(self.cats)
                    self.cats.append((pre, rank))
                    self.heaps.append([])
                    self.live.append(0)
                nos.append(len(self.runs))
                self.runs.append(run)
                self.team_of.append(team)
                self.cat_of.append(c)
                self.vers.append(0)
                self.heads.append(-1)
        return nos

    def _refresh(self, team: str) -> None:
        """Read `team`'s flag (rule R2) and each of its runs' first job not removed again;
        a run whose head changed gets a new version and entry."""
        ws = self.ws
        flag = self.flags[team] = ws.ledger.borrowing(team, self.gpu_type)
        if not flag and team not in self.of_team:
            return  # no run of it is read while it does not borrow
        removed = ws.removed
        for no in self.team(team):
            items, first = self.runs[no]
            i = first[0]
            while i < len(items) and items[i][1] in removed:
                i += 1
            first[0] = i
            head = i if flag and i < len(items) else -1
            if head == self.heads[no]:
                continue
            c = self.cat_of[no]
            self.live[c] += (head >= 0) - (self.heads[no] >= 0)
            self.heads[no] = head
            self.vers[no] += 1
            if head >= 0:
                lost, rid, _ = items[head]
                heapq.heappush(self.heaps[c], (lost, rid, no, self.vers[no], head))

    def sync(self) -> None:
        """Bring the heads up to the workspace: only the teams moved since last time."""
        moves = self.ws.ledger.running_moves
        if self.cursor == len(moves):
            return
        gt, by_team = self.gpu_type, self.by_team
        touched = {t for t, g in moves[self.cursor:] if g == gt and t in by_team}
        self.cursor = len(moves)
        for team in touched:
            self._refresh(team)
        vers = self.vers
        for c, heap in enumerate(self.heaps):
            if len(heap) > 2 * self.live[c] + _STALE:  # mostly entries no longer current
                heap[:] = [h for h in heap if h[3] == vers[h[2]]]
                heapq.heapify(heap)
            while heap and heap[0][3] != vers[heap[0][2]]:
                heapq.heappop(heap)


# An entry of `_one_gpu_kept`'s heap: (tier, work lost, 0 still to open / 1 a candidate,
# F, id, 0 a kept heap's node / 1 a run's job, the category or run number, the index).
_Todo = tuple[int, float, int, float, int, int, int, int]


def _one_gpu_kept(ws: Workspace, levels: _Levels, pool: str, now: datetime,
                  protect: bool, cpu: int = 0, mem: int = 0) -> _One:
    """`_one_gpu` in a flat forest (one level, nearness 0: rule Q6 orders nothing) from
    the heads kept across the pass (`_Kept`): the same victim, rule and key.

    The candidates are read in rule R4's price order (tier, work lost, F, id) by one heap
    `todo` over the kept heaps of the categories the claim may take (rule R1: preemptible
    of a lower tier; within its nominal, rule R2: of its tier, and non-preemptible ones of
    any) and the claimant's own lower-tier runs (`_todo_start`). An entry is a node of a
    kept heap or a run's job still to open (opening it pushes its heap children or its
    run's next job, `_todo_open`), or a candidate. A node's children and a run's next
    jobs are never less by (work lost, id), and an entry still to open sorts before any
    candidate of its tier and work lost: so a candidate is popped only when nothing
    unread comes before it, F included (the kept heaps know no claim's F: a tie of work
    lost between teams is ordered here). Each candidate popped is checked as `_one_gpu`
    checks it (`_first_on_a_node`)."""
    job = levels.job
    own, tier, within = job.team, job.tier_rank, levels.within
    key_runs = (job.gpu_type, now, protect, levels.cluster)
    got = ws.victim_kept.get(key_runs)
    if got is None:
        got = ws.victim_kept[key_runs] = _Kept(ws, key_runs, levels.by_team)
    kept = cast(_Kept, got)
    kept.sync()
    removed, spared = ws.removed, levels.spared
    lost_of = ws.victim_lost.setdefault(key_runs, {})
    flags, factor = kept.flags, levels.factor
    fs: dict[str, float] = {}

    def f_of(team: str) -> float:
        f = fs.get(team)
        if f is None:
            f = fs[team] = factor(team)
        return f

    info: dict[str, tuple[bool, float] | None] = {own: (False, 0.0)}

    def key_of(o: RunningJob) -> _Key | None:
        t = o.team
        if t not in info:
            info[t] = (within, f_of(t) if within else 0.0) if flags.get(t) else None
        return _level_key(o, 0, info, own, tier, lost_of)

    todo = _todo_start(kept, own, tier, within, removed, spared)
    while todo:
        item = heapq.heappop(todo)
        if not item[2]:
            _todo_open(kept, todo, item, own, tier, removed, spared, f_of)
            continue
        rank, lost, _, f, rid, _, no, _ = item
        r = ws.running_by_id[rid]
        rule = (PreemptionRule.PRIORITY if kept.team_of[no] == own
                or (r.preemptible and rank < tier) else levels.reclaim)
        key: _Key = (0, rank, f, lost, rid)
        first = _first_on_a_node(ws, r, key, pool, levels.cluster, spared, key_of, cpu, mem)
        if first is None:
            return False
        if first:
            return r, rule, key
    return None


def _todo_start(kept: _Kept, own: str, tier: int, within: bool, removed: Collection[int],
                spared: Collection[int]) -> list[_Todo]:
    """`_one_gpu_kept`'s heap to begin with: the root of each kept heap whose category
    a claim of team `own` and tier `tier` may take from other teams, and the first job
    of each of its own lower-tier runs, all still to open."""
    todo: list[_Todo] = []
    for c, (pre, rank) in enumerate(kept.cats):
        heap = kept.heaps[c]
        if heap and ((pre and rank < tier) or (within and (not pre or rank == tier))):
            todo.append((rank, heap[0][0], 0, 0.0, heap[0][1], 0, c, 0))
    for no in kept.team(own):
        pre, rank = kept.cats[kept.cat_of[no]]
        if pre and rank < tier:
            run = kept.runs[no]
            i = _first_in(run, removed, spared)
            if i < len(run[0]):
                todo.append((rank, run[0][i][0], 0, 0.0, run[0][i][1], 1, no, i))
    heapq.heapify(todo)
    return todo


def _todo_open(kept: _Kept, todo: list[_Todo], item: _Todo, own: str, tier: int,
               removed: Collection[int], spared: Collection[int],
               f_of: Callable[[str], float]) -> None:
    """Open an entry of `_one_gpu_kept`'s heap: a kept heap's node pushes its children
    and, when current and of another team, its run's first job neither removed nor
    spared; a run's job pushes itself as a candidate (with its F in rule R4's key: a
    reclaim's, else 0) and the run's next such job to open."""
    rank, _, _, _, _, kind, no, at = item
    if kind == 0:
        heap = kept.heaps[no]
        for child in (2 * at + 1, 2 * at + 2):
            if child < len(heap):
                h = heap[child]
                heapq.heappush(todo, (rank, h[0], 0, 0.0, h[1], 0, no, child))
        h = heap[at]
        no = h[2]
        if h[3] != kept.vers[no] or kept.team_of[no] == own:
            return  # no longer current; or the claimant's own (`_todo_start` reads it)
        at = _first_in(kept.runs[no], removed, spared, h[4])
    items = kept.runs[no][0]
    if at >= len(items):
        return
    lost, rid, _ = items[at]
    team = kept.team_of[no]
    pre, rank = kept.cats[kept.cat_of[no]]
    f = f_of(team) if team != own and (not pre or rank == tier) else 0.0
    heapq.heappush(todo, (rank, lost, 1, f, rid, 1, no, at))
    j = _first_in(kept.runs[no], removed, spared, at + 1)
    if j < len(items):
        heapq.heappush(todo, (rank, items[j][0], 0, 0.0, items[j][1], 1, no, j))


def _first_on_a_node(ws: Workspace, r: RunningJob, key: _Key, pool: str, cluster: str,
                     spared: Collection[int],
                     key_of: Callable[[RunningJob], _Key | None], cpu: int = 0,
                     mem: int = 0) -> bool | None:
    """Is candidate `r` (its key `key`) the first candidate by key of a node of `pool`
    that can hold a replica of one GPU (and `cpu`, `mem`: rule A6) emptied, and makes
    room there alone (`_one_gpu`'s test)? None when it is such a node's first only where
    its CPU or memory is not enough alone. `key_of`: another job's key as a candidate of
    the claim, None when it is none."""
    cap, removed, where = ws.capacity, ws.removed, ws.running_cluster
    on_node = _nodes_of(ws, r.gpu_type)
    short = False
    for name in sorted(dict.fromkeys(r.nodes)):
        if cap.node_pool.get(name) != pool or cap.empty_node_slots(name, 1, cpu, mem) < 1:
            continue
        if all(o is r or o.id in removed or o.id in spared or where[o.id] != cluster
               or (ko := key_of(o)) is None or ko > key for o in on_node.get(name, ())):
            if (cpu or mem) and not _alone(cap, r, name, cpu, mem):
                short = True
                continue
            return True
    return None if short else False


def _alone(cap: Capacity, r: RunningJob, name: str, cpu: int, mem: int) -> bool:
    """Rule A6: does removing `r` alone leave node `name` the CPU and memory of one
    replica (`_node_ways`' need, where `r` gives back what it holds there)?"""
    times = r.nodes.count(name)
    c, m = cap.cpu_free[name], cap.memory_free[name]
    return ((not cpu or c is None or c + (r.cpu_millicores or 0) * times >= cpu)
            and (not mem or m is None or m + (r.memory_bytes or 0) * times >= mem))


def _level_key(r: RunningJob, nearness: int,
               info: Mapping[str, tuple[bool, float] | None],
               own: str, tier: int, lost_of: dict[int, float]) -> _Key | None:
    """`_Levels._level`'s key of `r` (not removed, spared or of another cluster) as a
    candidate of the level of `nearness` whose teams `info` holds (whether each may be
    reclaimed from, its F), for a claim of team `own` and tier `tier`; None when it is
    none."""
    got = info.get(r.team)
    lost = lost_of.get(r.id)
    if got is None or lost is None:
        return None
    if r.team == own:
        return (0, r.tier_rank, 0.0, lost, r.id) if r.preemptible and r.tier_rank < tier \
            else None
    may_reclaim, f = got
    if not r.preemptible:
        return (nearness, r.tier_rank, f, lost, r.id) if may_reclaim else None
    if r.tier_rank < tier:
        return (nearness, r.tier_rank, 0.0, lost, r.id)
    if may_reclaim and r.tier_rank == tier:
        return (nearness, r.tier_rank, f, lost, r.id)
    return None


def _first_in(run: _Run, removed: Collection[int], spared: Collection[int],
              start: int | None = None) -> int:
    """The index of `run`'s first job from `start` (from its first not removed when
    None) neither removed nor spared; moves that first-not-removed index on."""
    items, first = run
    i = first[0]
    if start is None:
        while i < len(items) and items[i][1] in removed:
            i += 1
        first[0] = i
    else:
        i = max(i, start)
    while i < len(items) and (items[i][1] in removed or items[i][1] in spared):
        i += 1
    return i


def _take_per_replica_by_level(ws: Workspace, levels: _Levels,
                               take: Callable[[list[RunningJob]], None],
                               still_allowed: Callable[[RunningJob], bool], pool: str,
                               g: int, reps: int, cpu: int, mem: int) -> bool:
    """`_take_per_replica` reading the candidates one level of nearness at a time. A
    node's victims are a prefix of its candidates in rule R4 order, whose first part is
    the nearness: a node that makes room with the candidates of the levels read so far
    (the last level's nodes: the others did not before it) has the same victims as with
    all, and every node that needs a farther one costs more (rule R4's price starts
    with the farthest victim's nearness). So the first level at which some node makes
    room gives the same choice as reading every level; a search for one replica of a
    fraction usually ends among the claimant's department's teams."""
    cap = ws.capacity
    key_of = levels.key_of
    node_pool = cap.node_pool
    on_node: dict[str, list[RunningJob]] = {}
    marks: dict[str, list[tuple[int, int]]] = {}  # (level, its candidates up to it)
    touched: list[list[str]] = []
    packed = bool(cap.packed) and pool in cap.packed
    given: dict[tuple[int, str], list[tuple[int, int]]] = {}  # rule H6, per (job, node)

    kept = ws.victim_given if _BOUND else {}

    def absorb() -> None:
        level = len(touched)
        start = levels.ends[level - 1] if level else 0
        names: dict[str, None] = {}
        for _, r, _ in levels.items[start:levels.ends[level]]:
            for name in (r.nodes if len(r.nodes) == 1 else dict.fromkeys(r.nodes)):
                if node_pool.get(name) == pool and (bounds is None or name in bounds):
                    on_node.setdefault(name, []).append(r)
                    names[name] = None
                    if packed:
                        got = kept.get((r.id, name))
                        if got is None:
                            got = kept[(r.id, name)] = _given(cap, r, name)
                        given[(r.id, name)] = got
        for name in names:
            marks.setdefault(name, []).append((level, len(on_node[name])))
        touched.append(list(names))

    def upto(name: str, level: int) -> list[RunningJob]:
        n = next(k for lv, k in reversed(marks[name]) if lv <= level)
        return on_node[name][:n]

    reserved: list[tuple[str, tuple[int, ...]]] = []
    ok = True
    fraction = packed and g < min((cap.spg[n] for n in cap.nodes_of[pool]), default=0)
    bounds: dict[str, float] | None = None
    if packed and not fraction and _BOUND:
        # Victims only lower what a node's candidates could free: the bounds hold for
        # every replica.
        bounds = _packed_bounds(ws, levels, pool, g)
    for _ in range(reps):
        placed = cap.place(pool, g, 1, cpu=cpu, memory=mem)
        if placed is not None:
            reserved.append((placed[0], cap.last_slots))
            continue
        if bounds is not None and not bounds:
            ok = False  # no level's candidates empty the GPUs a replica needs anywhere
            break
        best: tuple[tuple[object, ...], str, list[RunningJob]] | None = None
        level = 0
        while best is None:
            if level == len(touched):
                if level == len(levels.ends) and not levels.more():
                    break
                absorb()
            near = levels.items[levels.ends[level] - 1][0][0]  # this level's nearness
            for name in touched[level]:
                if bounds is not None and bounds.get(name, _NEVER) > near:
                    continue  # its candidates so far cannot empty the GPUs it needs
                if cap.empty_node_slots(name, g, cpu, mem) < 1:
                    continue
                jobs = upto(name, level)
                ways = (_fraction_ways(cap, name, jobs, given, still_allowed, g, cpu, mem)
                        if fraction else
                        _node_ways(cap, name, jobs, still_allowed, g, cpu, mem, packed))
                for way in ways:
                    cost = (*_cost(way, key_of), name)
                    if best is None or cost < best[0]:
                        best = (cost, name, way)
            level += 1
        if best is None:
            ok = False
            break
        take(best[2])
        placed = cap.place(pool, g, 1, cpu=cpu, memory=mem)
        if placed is None:  # cannot happen: the chosen node now holds a replica
            ok = False
            break
        reserved.append((placed[0], cap.last_slots))
    for name, slots in reserved:
        cap.release((name,), g, cpu=cpu, memory=mem, slots=slots)
    return ok


_NEVER = float("inf")


def _packed_bounds(ws: Workspace, levels: _Levels, pool: str, g: int) -> dict[str, float]:
    """Per node of packed `pool` whose GPUs the search's candidates could empty for a
    replica of `g` slices (rule H6), the least nearness (rule Q6, the first part of rule
    R4's key) of a level by which they could: on each GPU its free slices plus what
    the candidates on it of that nearness or nearer give; `whole` GPUs' worth of them
    (a fraction: one GPU with `g`). A node absent never makes room; one whose bound is
    farther than a level cannot make room with that level's candidates, so step 2 need
    not weigh it there (`_packed_choices` would find no way). The candidates are
    `_candidates`' rules on every running job of the type, read per GPU from the
    workspace's index (`Workspace.victim_gpus`), a superset of those `still_allowed`
    lets a way take: the bound is never farther than the first level that makes room.
    A whole-GPU claim on the time-sliced type needs a GPU all of whose fractions it may
    take: it reads the fleet's level (90,000 fractions in docs/performance.md), and
    weighs only the nodes holding such a GPU."""
    job, ws_ledger, cap = levels.job, ws.ledger, ws.capacity
    gt, own, tier = job.gpu_type, job.team, job.tier_rank
    removed, where, cluster, spared = ws.removed, ws.running_cluster, levels.cluster, \
        levels.spared
    reach = levels.reach
    # Per team with jobs of the type: None when no job of it may be a candidate, else
    # (its nearness, whether it may be reclaimed from), as `_candidates` reads them.
    team_of: dict[str, tuple[int, bool] | None] = {}
    for t in levels.by_team:
        if t == own:
            team_of[t] = (0, False)
        elif ws_ledger.reclaimable(own, t, gt):
            team_of[t] = (ws_ledger.nearness(own, t, gt),
                          levels.within and (reach is None or ws_ledger.lca(own, t) in reach))
        else:
            team_of[t] = None
    index = ws.victim_gpus.get(gt)
    if index is None:
        index = ws.victim_gpus[gt] = _gpu_index(ws, gt)
    out: dict[str, float] = {}
    for name in cap.nodes_of[pool]:
        s, gf = cap.spg[name], cap.gpu_free[name]
        whole = 0 if g < s else -(-g // s)
        need = g if whole == 0 else s
        per_gpu = index.get(name, [])
        clear: list[float] = []
        for i, base in enumerate(gf):
            if base >= need:
                clear.append(-_NEVER)
                continue
            on, most = per_gpu[i] if i < len(per_gpu) else ([], 0)
            # `most`: what every job on the GPU gives; past the first job it may not
            # take, a whole-GPU claim usually cannot reach `need` - stop reading there.
            most += base
            found: list[tuple[int, int]] = []
            total = base
            for r, add in on:
                if r.id in removed:
                    continue  # what it held is in `gf` already
                info = team_of.get(r.team)
                if info is None or where[r.id] != cluster or r.id in spared:
                    most -= add
                    if most < need:
                        break
                    continue
                near, may_reclaim = info
                if r.team == own:
                    ok = r.preemptible and r.tier_rank < tier
                elif not r.preemptible:
                    ok = may_reclaim
                else:
                    ok = r.tier_rank < tier or (may_reclaim and r.tier_rank <= tier)
                if ok:
                    found.append((near, add))
                    total += add
                else:
                    most -= add
                    if most < need:
                        break
            if total < need:
                continue
            found.sort()
            got = base
            for near, add in found:
                got += add
                if got >= need:
                    clear.append(near)
                    break
        if len(clear) >= max(1, whole):
            clear.sort()
            out[name] = clear[max(1, whole) - 1]
    return out


_OnGpu = tuple[list[tuple[RunningJob, int]], int]


def _gpu_index(ws: Workspace, gpu_type: str) -> dict[str, list[_OnGpu]]:
    """Per packed node of `gpu_type`, per GPU, the running jobs on it with the slices
    each gives back there (rule H6, `_given`), and their sum: the same for the whole
    pass (a victim's slices are then in the node's free slices, and it is skipped)."""
    cap = ws.capacity
    out: dict[str, list[list[tuple[RunningJob, int]]]] = {}
    for r in ws.running_by_type.get(gpu_type, ()):
        for name in dict.fromkeys(r.nodes):
            if name not in cap.spg:
                continue
            per = out.get(name)
            if per is None:
                per = out[name] = [[] for _ in cap.gpu_free[name]]
            if len(r.nodes) == 1 and len(r.gpu_slots) == 1:  # a fraction or one GPU
                got = [(r.gpu_slots[0], min(r.gpus_per_replica, cap.spg[name]))]
            else:
                got = _given(cap, r, name)
            for i, add in got:
                if 0 <= i < len(per):
                    per[i].append((r, add))
    return {name: [(on, sum(add for _, add in on)) for on in per]
            for name, per in out.items()}


def _minimize(ws: Workspace, taken: list[RunningJob], key_of: dict[int, _Key],
              fits: Callable[[], bool]) -> list[RunningJob]:
    """Step 3 of `find_victims`: try to spare each victim, the most valuable (last in R4
    order) first; the ones kept in R4 order. Sparing a victim only raises its team's
    holdings, so the kept reclaim victims' teams still borrow (rule R2 stays true)."""
    victims = list(taken)
    for r in sorted(taken, key=lambda r: key_of[r.id], reverse=True):
        trial = [v for v in victims if v.id != r.id]
        undo = ws.simulate_removal(trial)
        spare = fits()
        undo()
        if spare:
            victims = trial
    victims.sort(key=lambda r: key_of[r.id])
    return victims


def _cost(chosen: list[RunningJob], key_of: dict[int, _Key]) -> tuple[object, ...]:
    """Rule R4's price of a set of victims: the highest tier among them (lower is
    cheaper), then the work they lose in total (GPU-hours), then how many they are,
    then their sort keys. Never the count alone: two 1-GPU jobs of a low tier that ran
    minutes are cheaper than one 8-GPU job of a higher tier that ran hours. Rule Q6
    first: the farthest victim's nearness (0 for all in a flat forest)."""
    keys = [key_of[r.id] for r in chosen]
    return (max(k[0] for k in keys), max(r.tier_rank for r in chosen),
            sum(k[3] for k in keys), len(chosen), tuple(keys))


def _take_per_replica(ws: Workspace, cands: list[_Cand],
                      take: Callable[[list[RunningJob]], None],
                      still_allowed: Callable[[RunningJob], bool], pool: str, g: int, reps: int,
                      cpu: int, mem: int) -> bool:
    """Step 2 of `find_victims`: for each replica with no room, the node of `pool` (rule
    K1) needing the fewest victims to hold its GPUs, CPU and memory (rule A6), then the
    cheapest, then the node name; takes them. False when some replica finds no such
    node."""
    cap = ws.capacity
    key_of = {r.id: k for k, r, _ in cands}
    on_node: dict[str, list[RunningJob]] = defaultdict(list)
    for _, r, _ in cands:
        for name in dict.fromkeys(r.nodes):
            if cap.node_pool.get(name) == pool:
                on_node[name].append(r)
    reserved: list[tuple[str, tuple[int, ...]]] = []
    ok = True
    packed = bool(cap.packed) and pool in cap.packed
    for _ in range(reps):
        placed = cap.place(pool, g, 1, cpu=cpu, memory=mem)
        if placed is not None:
            reserved.append((placed[0], cap.last_slots))
            continue
        best: tuple[tuple[object, ...], str, list[RunningJob]] | None = None
        for name, jobs in on_node.items():
            if cap.empty_node_slots(name, g, cpu, mem) < 1:
                continue
            for way in _node_ways(cap, name, jobs, still_allowed, g, cpu, mem, packed):
                cost = (*_cost(way, key_of), name)
                if best is None or cost < best[0]:
                    best = (cost, name, way)
        if best is None:
            ok = False
            break
        take(best[2])
        placed = cap.place(pool, g, 1, cpu=cpu, memory=mem)
        if placed is None:  # cannot happen: the chosen node now holds a replica
            ok = False
            break
        reserved.append((placed[0], cap.last_slots))
    for name, slots in reserved:
        cap.release((name,), g, cpu=cpu, memory=mem, slots=slots)
    return ok


def _node_ways(cap: Capacity, name: str, jobs: list[RunningJob],
               still_allowed: Callable[[RunningJob], bool], g: int, cpu: int, mem: int,
               packed: bool) -> list[list[RunningJob]]:
    """Step 2 of `find_victims` on one node: the victims among `jobs` (its candidates in
    rule R4 order) that make room for one replica there - rule H6's ways on a packed
    node, else the candidates in order until its GPUs, CPU and memory (rule A6) are
    enough; [] when they are not."""
    if packed:
        return _packed_choices(cap, name, jobs, still_allowed, g, cpu, mem)
    cpu_free, mem_free = cap.cpu_free[name], cap.memory_free[name]
    need = g - cap.free[name]
    need_cpu = cpu - cpu_free if cpu and cpu_free is not None else 0
    need_mem = mem - mem_free if mem and mem_free is not None else 0
    chosen: list[RunningJob] = []
    for r in jobs:
        if need <= 0 and need_cpu <= 0 and need_mem <= 0:
            break
        if still_allowed(r):
            chosen.append(r)
            times = r.nodes.count(name)
            need -= r.gpus_per_replica * times
            need_cpu -= (r.cpu_millicores or 0) * times
            need_mem -= (r.memory_bytes or 0) * times
    if need > 0 or need_cpu > 0 or need_mem > 0:
        return []
    return [chosen]


def _given(cap: Capacity, r: RunningJob, name: str) -> list[tuple[int, int]]:
    """Rule H6: (GPU, slices) `r` gives back on packed node `name` when removed."""
    s = cap.spg[name]
    per = replica_slots(r.gpu_slots, len(r.nodes))
    out: list[tuple[int, int]] = []
    for k, n in enumerate(r.nodes):
        if n != name or not per[k]:
            continue
        each = r.gpus_per_replica if len(per[k]) == 1 else s
        out.extend((i, min(each, s)) for i in per[k])
    return out


def _fraction_ways(cap: Capacity, name: str, jobs: list[RunningJob],
                   given: dict[tuple[int, str], list[tuple[int, int]]],
                   still_allowed: Callable[[RunningJob], bool], g: int, cpu: int,
                   mem: int) -> list[list[RunningJob]]:
    """`_packed_choices` for a fraction (`g` below a GPU's slices), reading each GPU's
    own candidates instead of every candidate of the node per GPU; `given`: `_given`
    of each (job, node)."""
    s, gf = cap.spg[name], cap.gpu_free[name]
    per_gpu: dict[int, list[tuple[RunningJob, list[tuple[int, int]]]]] = {}
    for r in jobs:
        got = given[(r.id, name)]
        if got and still_allowed(r):
            for i in dict.fromkeys(i for i, _ in got):
                per_gpu.setdefault(i, []).append((r, got))
    cpu_free, mem_free = cap.cpu_free[name], cap.memory_free[name]
    out: list[list[RunningJob]] = []
    for target in range(len(gf)):
        on = per_gpu.get(target)
        if not on:
            continue
        free = gf[target]
        need_cpu = cpu - cpu_free if cpu and cpu_free is not None else 0
        need_mem = mem - mem_free if mem and mem_free is not None else 0
        picked: list[RunningJob] = []
        for r, got in on:
            if free >= g and need_cpu <= 0 and need_mem <= 0:
                break
            picked.append(r)
            for i, add in got:
                if i == target:
                    free = min(s, free + add)
            times = r.nodes.count(name)
            need_cpu -= (r.cpu_millicores or 0) * times
            need_mem -= (r.memory_bytes or 0) * times
        if picked and free >= g and need_cpu <= 0 and need_mem <= 0:
            out.append(picked)
    return out


def _room(free: list[int], s: int, whole: int, target: int | None, g: int) -> bool:
    """Rule H2 on one packed node's free slices per GPU: `whole` wholly free GPUs, or
    `g` free slices on GPU `target`."""
    if whole:
        return sum(1 for f in free if f >= s) >= whole
    return target is not None and free[target] >= g


def _packed_choices(cap: Capacity, name: str, jobs: list[RunningJob],
                    still_allowed: Callable[[RunningJob], bool], g: int, cpu: int,
                    mem: int) -> list[list[RunningJob]]:
    """Rule H6 in step 2 of `find_victims`, on a packed node: a victim frees slices only
    on the GPU(s) its `gpu_slots` name, so a fraction of `g` slices needs victims on one
    GPU - per GPU, the candidates on it in rule R4 order until it has `g` free (and the
    node CPU and memory, rule A6); whole GPUs need wholly free GPUs - the candidates of
    the node in that order until enough are. Each way that works, its victims."""
    s, gf = cap.spg[name], cap.gpu_free[name]
    whole = 0 if g < s else -(-g // s)
    on: list[tuple[RunningJob, list[tuple[int, int]]]] = []  # (job, (GPU, slices) given)
    for r in jobs:
        if not still_allowed(r):
            continue
        per = replica_slots(r.gpu_slots, len(r.nodes))
        given: list[tuple[int, int]] = []
        for k, n in enumerate(r.nodes):
            if n != name or not per[k]:
                continue
            each = r.gpus_per_replica if len(per[k]) == 1 else s
            given.extend((i, min(each, s)) for i in per[k])
        if given:
            on.append((r, given))
    targets: list[int | None] = [None] if whole else list(range(len(gf)))
    cpu_free, mem_free = cap.cpu_free[name], cap.memory_free[name]
    out: list[list[RunningJob]] = []
    for target in targets:
        free = list(gf)
        need = [cpu - cpu_free if cpu and cpu_free is not None else 0,
                mem - mem_free if mem and mem_free is not None else 0]
        picked: list[RunningJob] = []
        for r, given in on:
            if _room(free, s, whole, target, g) and need[0] <= 0 and need[1] <= 0:
                break
            if target is not None and all(i != target for i, _ in given):
                continue
            picked.append(r)
            for i, add in given:
                if 0 <= i < len(free):
                    free[i] = min(s, free[i] + add)
            times = r.nodes.count(name)
            need[0] -= (r.cpu_millicores or 0) * times
            need[1] -= (r.memory_bytes or 0) * times
        if picked and _room(free, s, whole, target, g) and need[0] <= 0 and need[1] <= 0:
            out.append(picked)
    return out


def _take_in_one_domain(ws: Workspace, cands: list[_Cand],
                        take: Callable[[list[RunningJob]], None],
                        still_allowed: Callable[[RunningJob], bool], fits: Callable[[], bool],
                        pool: str, level: str) -> bool:
    """Step 2 of `find_victims` for a required topology (rule A7): per domain of the
    level, the candidates running on its nodes of `pool` (rule K1), in rule R4 order, until the gang fits in
    one domain; the domain needing the fewest victims (then the cheapest, then its name)
    wins and its victims are taken. The workspace is as before when none does."""
    cap = ws.capacity
    in_domain: dict[str, list[RunningJob]] = defaultdict(list)
    for _, r, _ in cands:
        domains = {cap.topology[n].get(level) for n in r.nodes if cap.node_pool.get(n) == pool}
        for d in sorted(x for x in domains if x is not None):
            in_domain[d].append(r)
    best: tuple[tuple[object, ...], list[RunningJob]] | None = None
    key_of = {r.id: k for k, r, _ in cands}
    for domain in sorted(in_domain):
        chosen: list[RunningJob] = []
        undos: list[Callable[[], None]] = []
        done = False
        for r in in_domain[domain]:
            if still_allowed(r):
                chosen.append(r)
                undos.append(ws.simulate_removal([r]))
                if fits():
                    done = True
                    break
        for u in reversed(undos):
            u()
        if done:
            cost = (*_cost(chosen, key_of), domain)
            if best is None or cost < best[0]:
                best = (cost, chosen)
    if best is None:
        return False
    take(best[1])
    return True


def owed_claim(snapshot: Snapshot, job: QueuedJob, gpu_type: str) -> bool:
    """Rule R11: `job` is owed its GPUs of `gpu_type` - its team's GPUs of that type held
    by its jobs of the job's tier or above, plus the job's, fit in the team's nominal
    quota (Q1). Lower tiers of its own team do not count: they are what it may preempt.
    Rule Q7: in a tree, counted the same way per department, every department above
    the team stays within its nominal too."""
    held = sum(r.total_gpus for r in snapshot.running
               if r.team == job.team and r.gpu_type == gpu_type
               and r.tier_rank >= job.tier_rank)
    if held + job.total_gpus > snapshot.quota(job.team, gpu_type).nominal:
        return False
    if not has_departments(snapshot.team_parent):
        return True
    # Rule Q7: every department above the team stays within its nominal too.
    tree = QuotaTree(snapshot.team_parent, snapshot.quotas, {})
    above: dict[str, int] = defaultdict(int)
    for r in snapshot.running:
        if r.gpu_type == gpu_type and r.tier_rank >= job.tier_rank:
            above[r.team] += r.total_gpus
    return tree.within_guarantee(job.team, gpu_type, job.total_gpus,
                                 lambda n: above[n]) >= len(tree.path(job.team))
