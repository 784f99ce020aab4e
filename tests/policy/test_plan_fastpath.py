"""The optimized `plan_admissions` against a reference: the straightforward pass as it
was before the performance work (jobs in the sort keys, `job_priority` per job, every
wait's message formatted eagerly). Same snapshot, same plan: admissions, waits (reasons
and messages), preemptions, order and standings (rules O1, F6, A1-A5, R1-R8).

The reference is a frozen copy on purpose: it proves the optimizations changed no plan.
When a rule changes, delete this file rather than port the change into the copy; the
per-rule tables and the properties in test_plan_properties.py are what guard the rules."""

from __future__ import annotations

import heapq
import random
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from queueing.policy.admission import (
    REFRESH_FRACTION,
    Admission,
    Plan,
    Wait,
    WaitReason,
    _Factors,
    _StaticFactors,
    entry_penalty,
    plan_admissions,
)
from queueing.policy.fairshare import FairShareState
from queueing.policy.preemption import (
    Preemption,
    PreemptionRule,
    Victim,
    is_protected,
    priority_rule_applies,
    reclaim_rule_applies,
    victim_order_key,
)
from queueing.policy.priority import PriorityWeights, job_priority
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)
from queueing.policy.workspace import Workspace
from tests.policy.test_plan_properties import snapshots


def _message(job_id: int, raw: Wait | tuple[WaitReason, QueuedJob, int, int]) -> Wait:
    if isinstance(raw, Wait):
        return raw
    reason, job, held, ceiling = raw
    gt = job.gpu_type
    if reason is WaitReason.QUOTA:
        msg = (f"team {job.team} holds {held} {gt} GPUs; {job.total_gpus} more would "
               f"pass its limit of {ceiling}")
    elif reason is WaitReason.NO_FIT:
        msg = f"no {gt} node has {job.gpus_per_replica} GPUs for one replica"
    elif reason is WaitReason.LENDING:
        msg = (f"the idle {gt} GPUs are other teams' nominal quota beyond their lending "
               f"limits; team {job.team} may not borrow them")
    else:
        msg = f"waiting for {job.replicas} × {job.gpus_per_replica} free {gt} GPUs on nodes"
    return Wait(job_id, reason, msg)


class _Charges:
    """The live factors with a running count of what was charged (rule F6)."""

    def __init__(self, inner: _Factors) -> None:
        self._inner = inner
        self._cache: dict[str, float] = {}
        self.charged = 0.0

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




class _QueueOrder:
    """Rule O1 as an iterator whose keys follow the live standings.

    Higher tier first; within a tier the higher priority (rule P1: weights.fair_share ×
    the team's current F + the job part), then earlier submit time, then lower id.
    A team's jobs share its F, so each (tier, team) list is sorted once by job part; a
    heap over the teams of a tier holds each team's head. After the consumer charges a
    team (rule F6) that team's next head is keyed with its new F. A charge also moves the
    total, and so every other team's F a little: all keys of the tier are recomputed once
    the charges since the last refresh pass `REFRESH_FRACTION` of the total usage.
    O(n log n) to build, O(log teams) per job plus the refreshes.
    """

    def __init__(self, jobs: Iterable[QueuedJob], *, factors: _Charges, weights: PriorityWeights,
                 now: datetime, cluster_gpus: int, first: Iterable[int] = (),
                 usage_total: float = 0.0) -> None:
        self._factors = factors
        self._w = weights.fair_share
        self._base = usage_total
        firsts = set(first)
        self.first: list[QueuedJob] = []
        groups: dict[tuple[int, str], list[tuple[float, datetime, int, QueuedJob]]] = {}
        for job in jobs:
            if firsts and job.id in firsts:
                self.first.append(job)
                continue
            part = job_priority(job, now=now, fair_share_factor=0.0, weights=weights,
                                cluster_gpus=cluster_gpus).job_part
            key = (job.tier_rank, job.team)
            items = groups.get(key)
            if items is None:
                items = groups[key] = []
            items.append((-part, job.submitted_at, job.id, job))
        self.first.sort(key=lambda j: (-j.tier_rank, j.submitted_at, j.id))
        tiers: dict[int, dict[str, list[tuple[float, datetime, int, QueuedJob]]]] = {}
        for (tier, team), items in groups.items():
            items.sort()  # (−job part, submitted, id): ids are unique, jobs never compared
            tiers.setdefault(tier, {})[team] = items
        self._tiers = [tiers[t] for t in sorted(tiers, reverse=True)]

    def __iter__(self) -> Iterator[QueuedJob]:
        yield from self.first
        charges, w = self._factors, self._w
        for by_team in self._tiers:
            head = dict.fromkeys(by_team, 0)
            heap = [self._key(team, by_team[team], 0) for team in by_team]
            heapq.heapify(heap)
            seen_charged = charges.charged
            while heap:
                since = charges.charged - seen_charged
                if since > 0 and since > REFRESH_FRACTION * self._base:
                    self._base += since
                    seen_charged = charges.charged
                    charges.refresh()
                    heap = [self._key(t, by_team[t], i) for t, i in head.items()
                            if i < len(by_team[t])]
                    heapq.heapify(heap)
                _, _, _, team, i = heap[0]
                items = by_team[team]
                head[team] = i + 1
                yield items[i][3]
                # The consumer has charged the team by now (rule F6): key its next job
                # with the new factor; one sift instead of a pop and a push.
                if i + 1 < len(items):
                    neg_part, submitted, job_id, _ = items[i + 1]
                    heapq.heapreplace(heap, (neg_part - w * charges.cached(team), submitted,
                                             job_id, team, i + 1))
                else:
                    heapq.heappop(heap)

    def _key(self, team: str, items: list[tuple[float, datetime, int, QueuedJob]],
             i: int) -> tuple[float, datetime, int, str, int]:
        neg_part, submitted, job_id, _ = items[i]
        return (neg_part - self._w * self._factors.cached(team), submitted, job_id, team, i)


def reference_plan(snapshot: Snapshot) -> Plan:
    """One planning pass over the queue (rules Q1, O1, A1-A5, R1-R8).

    In queue order (O1; nominated preemptors first, A5) each job is admitted when it fits
    its team's quota (Q1) and free node capacity as a whole gang (A1-A3); each admission
    charges its team's entry penalty (F6) so the team's later jobs move down. A job that
    does not fit may preempt (R1-R4, within the rate limit R5); otherwise it waits with a
    reason and does not block smaller jobs behind it (A4). The same snapshot always gives
    the same plan; the snapshot is not changed.
    """
    now = snapshot.now
    ws = Workspace(snapshot)
    cap, ledger = ws.capacity, ws.ledger
    state = snapshot.fair_share_state
    factors = _Charges(state.copy() if state is not None
                       else _StaticFactors(snapshot.fair_share))
    usage_total = 0.0 if state is None else sum(
        state.usage(t) for t in {j.team for j in snapshot.queued})
    weights = snapshot.priority_weights or PriorityWeights()
    cluster_gpus = sum(n.capacity for n in snapshot.nodes)
    order = _QueueOrder(snapshot.queued, factors=factors, weights=weights, now=now,
                        cluster_gpus=cluster_gpus, first=snapshot.nominated,
                        usage_total=usage_total)
    pre = snapshot.preemption
    searches = 0
    preempted_by_team: dict[str, int] = defaultdict(int)
    search_failed: set[tuple[str, str, int, int, int]] = set()
    # A gang shape that did not fit stays unfit until some node gains free GPUs.
    unfit: dict[tuple[str, int, int], int] = {}
    held, ceilings = ledger.held, ledger.ceiling
    guarded_total, largest = ledger.guarded_total, cap.largest_node
    billing, interval = snapshot.billing_weight, snapshot.interval_seconds

    admissions: list[Admission] = []
    preemptions: list[Preemption] = []
    raw: dict[int, Wait | tuple[WaitReason, QueuedJob, int, int]] = {}
    seen: list[int] = []
    remember = seen.append
    nominated = snapshot.nominated
    may_search = pre.enabled and pre.max_searches > 0
    quota, no_fit, capacity = WaitReason.QUOTA, WaitReason.NO_FIT, WaitReason.CAPACITY
    lowest_tier = ws.lowest_tier
    for job in order:
        job_id = job.id
        remember(job_id)
        gt, team, g, reps = job.gpu_type, job.team, job.gpus_per_replica, job.replicas
        total = g * reps
        key = (team, gt)
        ceiling = ceilings.get(key)
        over = ceiling is not None and held[key] + total > ceiling
        if over and not (may_search and lowest_tier.get(key, job.tier_rank) < job.tier_rank):
            raw[job_id] = (quota, job, held[key], ceiling or 0)
            continue
        if g > largest.get(gt, 0):
            raw[job_id] = (no_fit, job, 0, 0)
            continue
        lending = not over and guarded_total.get(gt, 0) > 0 and \
            ledger.lending_blocks(team, gt, total)
        placement = None
        if not lending and not over:
            shape = (gt, g, reps)
            if unfit.get(shape) != cap.grown:
                placement = cap.place(gt, g, reps)
                if placement is None:
                    unfit[shape] = cap.grown
            elif not may_search and not nominated:
                raw[job_id] = (capacity, job, 0, 0)  # the common case of a long queue
                continue
        if placement is not None:
            ledger.add(team, gt, total)
            factors.charge(team, entry_penalty(total, billing(gt), interval))
            admissions.append(Admission(job_id, team, gt, placement))
            continue
        terminating = nominated.get(job_id, 0) if nominated else 0
        if terminating > 0:
            raw[job_id] = Wait(
                job_id, WaitReason.PREEMPTING,
                f"waiting for {terminating} preempted job(s) to release their {gt} GPUs",
            )
            continue
        # Rules R1-R4: only when preempting is the only way it fits. A search that failed
        # for a job of the same team, shape and tier fails again: skip it.
        result = None
        if may_search:
            search_key = (team, gt, job.tier_rank, g, reps)
            if search_key not in search_failed:
                searches += 1
                may_search = searches < pre.max_searches
                result = reference_find_victims(ws, job, now=now, factor=factors.factor)
                if result is None:
                    search_failed.add(search_key)
        if result is not None:
            found, undo = result
            left = pre.left(team)
            if left is not None and len(found.victims) > left - preempted_by_team[team]:
                undo()
                raw[job_id] = Wait(
                    job_id, WaitReason.RATE_LIMITED,
                    f"needs {len(found.victims)} preemption(s) but team {team} may preempt "
                    f"{max(0, left - preempted_by_team[team])} more in the current window",
                )
                continue
            # The victims stay removed and the job's placement stays reserved for the rest
            # of this pass; what the victims free beyond it is held back too: they still
            # run until stopped, so no job of this pass may be placed there (rule A5).
            _hold_freed(ws, found, g)
            ledger.add(team, gt, total)
            preempted_by_team[team] += len(found.victims)
            preemptions.append(found)
            raw[job_id] = Wait(
                job_id, WaitReason.PREEMPTING,
                f"preempting {len(found.victims)} job(s) "
                f"({', '.join('#' + str(v.job_id) for v in found.victims)}; "
                f"rule {', '.join(found.rules)}); admitted once their GPUs are free",
            )
            continue
        if over:
            raw[job_id] = (quota, job, held[key], ceiling or 0)
        else:
            raw[job_id] = (WaitReason.LENDING if lending else capacity, job, 0, 0)
    teams = sorted({j.team for j in snapshot.queued} | set(snapshot.fair_share))
    standings = {t: factors.factor(t) for t in teams}
    waits = {job_id: _message(job_id, w) for job_id, w in raw.items()}
    return Plan(admissions=tuple(admissions), waits=waits, preemptions=tuple(preemptions),
                order=tuple(seen), fair_share_after=standings)


def _hold_freed(ws: Workspace, found: Preemption, gpus_per_replica: int) -> None:
    """Rule A5: GPUs a preemption frees beyond its preemptor's placement are not free
    during this pass (the victims are only stopped after it)."""
    extra: dict[str, int] = defaultdict(int)
    for v in found.victims:
        r = ws.running_by_id[v.job_id]
        for name in r.nodes:
            extra[name] += r.gpus_per_replica
    for name in found.placement:
        extra[name] -= gpus_per_replica
    for name, hold in sorted(extra.items()):
        if hold > 0 and name in ws.capacity.free:
            ws.capacity.set_free(name, max(0, ws.capacity.free[name] - hold))


def reference_find_victims(
    ws: Workspace, job: QueuedJob, *, now: datetime, factor: Callable[[str], float],
) -> tuple[Preemption, Callable[[], None]] | None:
    """Rules R1-R4: a minimal set of victims whose removal lets `job` fit, or None.

    On success the victims are removed from the workspace and the job's placement is
    reserved on it; the returned function undoes both. On None nothing changed.

    1. Candidates: running jobs of the job's GPU type that rule R1 or (when the job's
       team stays within its nominal) rule R2 allows, minus the protected ones (R3),
       ordered by `victim_order_key` (R4). When the job's own team is at its ceiling
       (Q1), first its own lower-tier jobs, in that order, until the ceiling allows it.
    2. Node-aware greedy: for each replica that has no room, pick the node that needs
       the fewest victims (then the cheapest ones by R4, then node name) and take them.
       While the quota pool (rule Q1) still refuses the job, take more in R4 order.
    3. Minimize: put back each victim, most valuable first, whenever the job still fits
       without it, so no victim in the result can be spared.
    The same workspace always gives the same answer.
    """
    gt, g, reps, team = job.gpu_type, job.gpus_per_replica, job.replicas, job.team
    within_nominal = ws.ledger.within_nominal(team, gt, job.total_gpus)
    cands: list[tuple[tuple[object, ...], RunningJob, PreemptionRule]] = []
    for r in ws.running_by_type.get(gt, ()):
        if r.id in ws.removed or is_protected(r, now):
            continue
        if priority_rule_applies(job, r):
            rule = PreemptionRule.PRIORITY
        elif within_nominal and reclaim_rule_applies(job, r, ws):
            rule = PreemptionRule.RECLAIM
        else:
            continue
        cands.append((victim_order_key(r, rule, factor), r, rule))
    if not cands:
        return None
    cands.sort(key=lambda c: c[0])
    rule_of = {r.id: rule for _, r, rule in cands}
    key_of = {r.id: k for k, r, _ in cands}

    taken: list[RunningJob] = []
    undos: list[Callable[[], None]] = []

    def take(victims: list[RunningJob]) -> None:
        taken.extend(victims)
        undos.append(ws.simulate_removal(victims))

    def undo_all() -> None:
        for u in reversed(undos):
            u()

    def still_allowed(r: RunningJob) -> bool:
        if r.id in ws.removed:
            return False
        # Rule R2 is re-checked as victims go: a team stops being reclaimable once it
        # no longer borrows.
        return rule_of[r.id] is PreemptionRule.PRIORITY or ws.ledger.borrowing(r.team, gt)

    # 1b. Its own team's ceiling (Q1): only the team's own lower-tier jobs make room.
    for _, r, _ in cands:
        if ws.ledger.over_ceiling(team, gt, job.total_gpus) is None:
            break
        if r.team == team and still_allowed(r):
            take([r])
    if ws.ledger.over_ceiling(team, gt, job.total_gpus) is not None:
        undo_all()
        return None

    # 2. node-aware greedy, one replica at a time, reserving each placed replica.
    on_node: dict[str, list[RunningJob]] = defaultdict(list)
    for _, r, _ in cands:
        for name in dict.fromkeys(r.nodes):
            if ws.capacity.node_type.get(name) == gt:
                on_node[name].append(r)
    reserved: list[str] = []
    ok = True
    for _ in range(reps):
        placed = ws.capacity.place(gt, g, 1)
        if placed is not None:
            reserved.extend(placed)
            continue
        best: tuple[tuple[object, ...], str, list[RunningJob]] | None = None
        for name, jobs in on_node.items():
            free = ws.capacity.free[name]
            if ws.capacity.capacity[name] < g:
                continue
            need, chosen = g - free, []
            for r in jobs:
                if need <= 0:
                    break
                if still_allowed(r):
                    chosen.append(r)
                    need -= r.gpus_per_replica * r.nodes.count(name)
            if need > 0:
                continue
            cost = (len(chosen), tuple(key_of[r.id] for r in chosen), name)
            if best is None or cost < best[0]:
                best = (cost, name, chosen)
        if best is None:
            ok = False
            break
        take(best[2])
        placed = ws.capacity.place(gt, g, 1)
        if placed is None:  # cannot happen: the chosen node now holds a replica
            ok = False
            break
        reserved.extend(placed)
    ws.capacity.release(reserved, g)
    if ok:
        for _, r, _ in cands:
            if ws.fits(team, gt, g, reps):
                break
            if still_allowed(r):
                take([r])
        ok = ws.fits(team, gt, g, reps)
    if not ok or not taken:
        undo_all()
        return None

    undo_all()

    # 3. minimize: try to spare each victim, the most valuable (last in R4 order) first.
    # Sparing a victim only raises its team's holdings, so the kept reclaim victims'
    # teams still borrow (rule R2 stays true).
    victims = list(taken)
    for r in sorted(taken, key=lambda r: key_of[r.id], reverse=True):
        trial = [v for v in victims if v.id != r.id]
        undo = ws.simulate_removal(trial)
        spare = ws.fits(team, gt, g, reps)
        undo()
        if spare:
            victims = trial
    victims.sort(key=lambda r: key_of[r.id])
    undo_victims = ws.simulate_removal(victims)
    placement = ws.capacity.place(gt, g, reps)
    if placement is None:  # pragma: no cover - fits() said it does
        undo_victims()
        return None
    found = Preemption(
        job.id, team, gt,
        tuple(Victim(r.id, r.team, r.tier_rank, r.total_gpus, rule_of[r.id]) for r in victims),
        placement,
    )

    def undo_found() -> None:
        ws.capacity.release(placement, g)
        undo_victims()

    return found, undo_found


NOW = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


def _assert_same_plan(s: Snapshot) -> None:
    want, got = reference_plan(s), plan_admissions(s)
    assert got.admissions == want.admissions
    assert got.preemptions == want.preemptions
    assert got.order == want.order
    assert got.fair_share_after == want.fair_share_after
    assert list(got.waits) == list(want.waits)
    for job_id, wait in want.waits.items():
        assert got.waits[job_id] == wait
    assert got == want


@settings(max_examples=300, deadline=None)
@given(snapshots())
def test_same_plan_as_the_reference_on_small_snapshots(s: Snapshot) -> None:
    _assert_same_plan(s)


@st.composite
def busy_snapshots(draw: st.DrawFn) -> Snapshot:
    """Many teams and jobs (so charges pass the refresh fraction), nominated jobs,
    static or live factors, other priority weights."""
    rnd = random.Random(draw(st.integers(0, 2**32)))
    types = ("t0", "t1", "t2")[: rnd.randint(1, 3)]
    teams = [f"team-{k}" for k in range(rnd.randint(1, 40))]
    tiers = (0, 100, 200)
    nodes: list[NodeState] = []
    running: list[RunningJob] = []
    job_id = 1
    for t in types:
        for i in range(rnd.randint(1, 12)):
            name, cap = f"{t}-{i:02d}", rnd.choice((4, 8))
            used = 0
            while used < cap * rnd.random():
                g = rnd.choice((1, 2, 4))
                if used + g > cap:
                    break
                running.append(RunningJob(
                    id=job_id, team=rnd.choice(teams), gpu_type=t, gpus_per_replica=g,
                    replicas=1, tier_rank=rnd.choice(tiers), preemptible=rnd.random() < 0.9,
                    started_at=NOW - timedelta(seconds=rnd.choice((0, 60, 3600))),
                    min_runtime_seconds=rnd.choice((0, 0, 600)), nodes=(name,)))
                job_id += 1
                used += g
            nodes.append(NodeState(name, t, cap, cap - used))
    queued = tuple(
        QueuedJob(id=10_000 + i, team=rnd.choice(teams), gpu_type=rnd.choice(types),
                  gpus_per_replica=rnd.choice((1, 1, 2, 4, 8, 16)),
                  replicas=rnd.choice((1, 1, 1, 2, 4)), tier_rank=rnd.choice(tiers),
                  submitted_at=NOW - timedelta(seconds=rnd.choice(
                      (0.0, 5.0, rnd.uniform(-60, 8 * 86400)))))
        for i in range(rnd.randint(0, 400))
    )
    nominated = {q.id: rnd.choice((0, 0, 1)) for q in queued if rnd.random() < 0.02}
    quotas = {(team, t): QuotaLimit(nominal=rnd.choice((0, 2, 4)),
                                    borrowing_limit=rnd.choice((None, 2, 6)),
                                    lending_limit=rnd.choice((None, None, 0, 1)))
              for team in teams for t in types if rnd.random() < 0.8}
    live = rnd.random() < 0.8
    state = FairShareState({t: rnd.expovariate(1 / 20.0) for t in teams},
                           {t: 1 / len(teams) for t in teams}) if live else None
    static = {} if live else {t: rnd.random() for t in teams if rnd.random() < 0.7}
    weights = rnd.choice((
        PriorityWeights(),
        PriorityWeights(size=500.0),
        PriorityWeights(size=500.0, favor_small=True, max_age_seconds=3600.0),
        PriorityWeights(age=0.0, max_age_seconds=0.0),
    ))
    return Snapshot(
        now=NOW, nodes=tuple(nodes), queued=queued, running=tuple(running), quotas=quotas,
        fair_share=static, fair_share_state=state, priority_weights=weights,
        billing_weights={t: 1.0 + i for i, t in enumerate(types)},
        interval_seconds=rnd.choice((0.0, 3.0, 600.0, 36_000.0)), nominated=nominated,
        preemption=PreemptionSettings(enabled=rnd.random() < 0.9,
                                      max_per_team=rnd.choice((None, 2, 20)),
                                      max_searches=rnd.choice((0, 4, 32))),
    )


@settings(max_examples=150, deadline=None)
@given(busy_snapshots())
def test_same_plan_as_the_reference_on_busy_snapshots(s: Snapshot) -> None:
    _assert_same_plan(s)
