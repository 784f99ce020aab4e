"""The discrete-event loop that replays a workload through fairq's pure policy
(docs/simulator.md, "The loop").

A virtual clock jumps from event to event: arrivals, finishes, and the instants the
service's periodic cycle would act with no job moving (the cycle after a preemption,
which admits the preemptor, and its termination grace's end, rule R8; a job's minimum
runtime ends, rule R3; a team's oldest preemption leaves the rate-limit window, rule R5),
and, with spot pools, a spot node's interruption (a seeded Poisson process per node: its
jobs requeue, rule K6) and its replacement coming back.
At each instant, after every event of that instant is applied, one cycle runs: snapshot →
`plan_admissions` → apply, like the scheduler service, except that an admitted job starts
at once (the simulated cluster). A victim keeps its GPUs for its tier's grace (rule R10;
0 = free at once, as the simulated cluster frees them) and keeps the work up to its last
checkpoint, or all of it when it checkpoints and saves on the stop signal within its grace
(docs/simulator.md, "Checkpoints, grace and owed claims"); a running job's last checkpoint
is its `checkpointed_at` in the snapshot (rule R4). Each job is judged owed or not (rule
R11, `owed_claim`) on the snapshot of the first cycle after its arrival. The bookkeeping
rules come from `queueing.policy.cycle`, the decisions from `queueing.policy.admission`.
tests/simulator/test_same_as_cycle.py holds the decisions to the real cycle's.
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from queueing.policy.admission import Plan, plan_admissions
from queueing.policy.cycle import (
    Holding,
    Nomination,
    active_teams,
    nominated_placements,
    nominated_preemptors,
    preemptions_in_window,
    requeue_victim,
    standings_running_and_penalty,
)
from queueing.policy.fairshare import (
    Accumulator,
    FairShareState,
    TeamUsageInput,
    compute_standings,
)
from queueing.policy.preemption import owed_claim
from queueing.policy.snapshot import (
    NodeState,
    PreemptionSettings,
    QueuedJob,
    QuotaLimit,
    RunningJob,
    Snapshot,
)

from .bookings import LOOKAHEAD_SECONDS, expand, seconds
from .model import Attempt, JobRecord, RunResult, SimJob, Workload
from .slices import Hold, SliceBook

# The simulation's instant 0. Any fixed aware instant works: the policy only looks at
# differences (ages, decay).
EPOCH = datetime(2023, 1, 1, tzinfo=UTC)

Progress = Callable[[float], None]

_ARRIVAL, _FINISH, _RELEASE, _TIMER, _RECLAIM, _BACK = 0, 1, 2, 3, 4, 5


def at(seconds: float) -> datetime:
    return EPOCH + timedelta(seconds=seconds)


@dataclass(slots=True)
class _Running:
    job: RunningJob
    start: float
    interval: float | None = None  # its checkpoint interval (None: it never checkpoints)
    checkpoints: int = 0  # taken in this attempt: the last at start + checkpoints × interval

    def last_checkpoint(self, now: float) -> float | None:
        """When this attempt last checkpointed by `now` (None: not yet, or never)."""
        if not self.interval:
            return None
        k = int((now - self.start) // self.interval)
        return self.start + k * self.interval if k > 0 else None


def interruption_clock(seed: int, node: str, per_hour: float) -> random.Random:
    """Rule K6's interruptions of one spot node: its own generator, seeded by the
    scenario's seed and the node's name, so a node's interruptions do not depend on the
    others' or on the order of events."""
    return random.Random(f"{seed}:{node}:{per_hour!r}")


def estimate_seconds(job: SimJob) -> int:
    """A job's `max_runtime_seconds` as the service stores it (whole seconds, rounded up):
    rule A9's runtime estimate, EASY backfill's too."""
    return math.ceil(job.estimate)


def workload_name(job_id: int, attempt: int) -> str:
    return f"fq-{job_id}-{attempt}"


def in_units(quotas: Mapping[tuple[str, str], QuotaLimit],
             slices: Mapping[str, int]) -> dict[tuple[str, str], QuotaLimit]:
    """Quotas in the policy's units: a time-sliced type's nominal, borrowing and lending
    limits (GPUs) x its slices per GPU, as the service builds its snapshot."""
    def times(v: int | None, s: int) -> int | None:
        return None if v is None else v * s

    out = {}
    for (team, gt), q in quotas.items():
        s = slices.get(gt, 1)
        out[(team, gt)] = q if s == 1 else QuotaLimit(
            q.nominal * s, times(q.borrowing_limit, s), times(q.lending_limit, s))
    return out


def charged(job: SimJob, billing_weight: float) -> tuple[int, float]:
    """(GPUs, weight) the fair-share rules charge a running job at (rule F1, GPUs x
    weight per hour): a fraction's GPU-equivalents k / S folded into the weight, since
    the pure rules take whole GPUs; a whole-GPU job exactly as before."""
    if job.gpu_slices:
        return 1, billing_weight * job.share
    return job.gpus, billing_weight


def run_fairq(workload: Workload, *, progress: Progress | None = None,
              max_seconds: float | None = None,
              on_cycle: Callable[[float, Plan], None] | None = None,
              on_snapshot: Callable[[Snapshot], None] | None = None) -> RunResult:
    """Replay `workload` through `plan_admissions`, a cycle at each event instant, until
    every job has finished (or the virtual clock passes `max_seconds`). `on_cycle` is
    called with each cycle's instant and plan, `on_snapshot` with what it planned on."""
    t_wall = time.perf_counter()
    sc = workload.scenario
    st = sc.settings
    pre = st.preemption
    tiers = {t.name: t for t in sc.tiers}
    jobs = {j.id: j for j in workload.jobs}
    billing = st.billing_weights
    h = st.half_life_hours
    teams = {t.name: t for t in sc.teams}
    team_parent = {t.name: t.parent for t in sc.teams}
    acc = {t: Accumulator(0.0, EPOCH) for t in teams}
    # Free units per node: GPUs, or slices on a time-sliced type (S per GPU); `book`
    # keeps which GPU of such a node has which slices free (docs/simulator.md,
    # "Fractional GPUs"), `held` what each job running there holds.
    units = {n.name: n.gpus * sc.slices_per_gpu(n.gpu_type) for n in sc.nodes}
    free = dict(units)
    book = SliceBook(sc.nodes, sc.slices)
    quotas = in_units(sc.quotas, sc.slices)
    held: dict[int, list[Hold]] = {}
    node_specs = sc.nodes
    # Rules K1-K7: the clusters' ranks; spot nodes now down (rule K6).
    ranks = {c.name: c.cost_rank for c in sc.clusters}
    # Rules R9, R11 per tier, as the service reads them from the tiers.
    by_tier = {t.rank: (None if t.lost_per_wait == -1 else t.lost_per_wait)
               for t in sc.tiers if t.lost_per_wait is not None}
    owed_waits = frozenset(t.rank for t in sc.tiers if not t.owed_preempts_at_once)
    down: set[str] = set()
    interruptions = 0
    clocks = {n.name: interruption_clock(sc.seed, n.name, n.interruptions_per_hour)
              for n in sc.nodes if n.spot and n.interruptions_per_hour > 0}
    spec_of = {n.name: n for n in sc.nodes}

    events: list[tuple[float, int, int, int, int]] = []
    seq = 0

    # Events other than spot interruptions and replacements still in the heap: once none
    # is left and nothing runs, interruptions change nothing and the run ends.
    work_events = 0

    def push(t: float, kind: int, job_id: int = 0, attempt: int = 0) -> None:
        nonlocal seq, work_events
        seq += 1
        if kind < _RECLAIM:
            work_events += 1
        heapq.heappush(events, (t, kind, seq, job_id, attempt))

    for j in workload.jobs:
        push(j.submit, _ARRIVAL, j.id)
    # Booked GPUs: every occurrence starting in the measuring window. A cycle runs at
    # each start and end (rules W2-W4 act then), and at every event instant while one is
    # active, even with nothing queued (rule W2 empties the booked GPUs).
    booked = expand(sc.bookings, workload.horizon)
    # Rule W4: the preemptible tiers' jobs may run on a booking's unused GPUs.
    lend_tiers = frozenset(t.rank for t in sc.tiers if t.preemptible)
    booked_s = [seconds(b) for b in booked]
    for s_, e_ in booked_s:
        push(s_, _TIMER)
        push(e_, _TIMER)
    node_index = {n.name: i for i, n in enumerate(sc.nodes)}

    def next_interruption(name: str, after: float) -> None:
        rate = spec_of[name].interruptions_per_hour / 3600.0
        push(after + clocks[name].expovariate(rate), _RECLAIM, node_index[name])

    for name in sorted(clocks):
        next_interruption(name, 0.0)

    queued: dict[int, QueuedJob] = {}
    running: dict[int, _Running] = {}
    # Work left per job (its runtime less what its saved checkpoints hold).
    left: dict[int, float] = {j.id: j.runtime for j in workload.jobs}
    grace = {t.name: sc.grace(t.name) for t in sc.tiers}
    # Victims' workloads still stopping (in their grace): name -> (nodes, units per
    # replica, what they hold on time-sliced nodes).
    terminating: dict[str, tuple[list[str], int, list[Hold]]] = {}
    # Rule R11: jobs not yet judged owed or not (arrived since the last cycle), and the owed.
    fresh: list[int] = []
    owed: set[int] = set()
    attempt_no: dict[int, int] = {j.id: 0 for j in workload.jobs}
    attempts: dict[int, list[Attempt]] = {j.id: [] for j in workload.jobs}
    finished: dict[int, float] = {}
    made: list[tuple[datetime, str]] = []  # (instant, preemptor team) per victim (R5)
    nominations: list[Nomination] = []
    cycles = 0
    now_s = 0.0

    timers: set[float] = set()

    def timer(t: float) -> None:
        if t > now_s and t not in timers:
            timers.add(t)
            push(t, _TIMER)

    def queue_job(j: SimJob, queued_at: float | None = None) -> None:
        tier = tiers[j.tier]
        queued[j.id] = QueuedJob(
            id=j.id, team=j.team, gpu_type=j.gpu_type, gpus_per_replica=j.units_per_replica,
            gpu_types=j.gpu_types,  # every accepted type, first = gpu_type
            replicas=j.replicas, tier_rank=tier.rank, submitted_at=at(j.submit),
            queued_at=None if queued_at is None else at(queued_at),
            max_runtime_seconds=estimate_seconds(j),
            clusters=None if j.cluster is None else frozenset((j.cluster,)),  # rule K3
            spot_ok=tier.preemptible or j.allow_spot)  # rule K4
        if queued_at is None:
            fresh.append(j.id)

    def keep_work(r: _Running, saved: float | None) -> None:
        """The attempt's work up to `saved` is kept: that much less is left to run."""
        if saved is not None and saved > r.start:
            left[r.job.id] = max(0.0, left[r.job.id] - (saved - r.start))

    def reclaim(name: str) -> None:
        """Rule K6: spot node `name` is interrupted: down until its replacement is back;
        each job on it goes back to the queue as attempt + 1, its GPU time charged (like
        a victim's, rule R6), the attempt's work lost to spot."""
        nonlocal interruptions
        interruptions += 1
        down.add(name)
        now = at(now_s)
        for entry in terminating.values():
            # A victim stopping there: those GPUs go with the node (the replacement is new).
            entry[0][:] = [n for n in entry[0] if n != name]
            entry[2][:] = [x for x in entry[2] if x[0] != name]
        for job_id in sorted(i for i, r in running.items() if name in r.job.nodes):
            r = running.pop(job_id)
            release(r.job)
            # No time to save: the work up to its last periodic checkpoint is kept.
            saved = r.last_checkpoint(now_s)
            keep_work(r, saved)
            j = jobs[job_id]
            gpus, weight = charged(j, billing.get(r.job.gpu_type, 1.0))
            requeued = requeue_victim(
                attempt=attempt_no[job_id], submitted_at=at(j.submit),
                started_at=r.job.started_at, now=now, gpus=gpus,
                billing_weight=weight, accumulator=acc[j.team],
                half_life_hours=h)
            assert requeued.accumulator is not None  # given one, it gives one back
            acc[j.team] = requeued.accumulator
            attempt_no[job_id] = requeued.attempt
            attempts[job_id].append(Attempt(r.start, now_s, preempted=False, reclaimed=True,
                                            cluster=r.job.cluster, gpu_type=r.job.gpu_type,
                                            saved=saved))
            queue_job(j, queued_at=now_s)
        free[name] = 0
        if book.shared(name):
            book.set_all(name, free=False)
        push(now_s + spec_of[name].replacement_seconds, _BACK, node_index[name])

    def charge(j: SimJob, gpu_type: str, start: float, end: float) -> None:
        if end > start:
            gpus, weight = charged(j, billing.get(gpu_type, 1.0))
            acc[j.team] = acc[j.team].add_interval(
                rate=gpus * weight, start=at(start), end=at(end), half_life_hours=h)

    def give_back(nodes: list[str] | tuple[str, ...], per_replica: int,
                  holds: list[Hold]) -> None:
        for name in nodes:
            free[name] += per_replica
        for x in holds:
            book.give(x)

    def release(r: RunningJob) -> None:
        give_back(r.nodes, r.gpus_per_replica, held.pop(r.id, []))

    while events:
        if clocks and not work_events and (len(finished) == len(jobs)
                                           or (not running and not down)):
            # Only spot interruptions are left, and nothing they could change (what is
            # queued, if anything, can never start): the run ends here.
            break
        now_s = events[0][0]
        if max_seconds is not None and now_s > max_seconds:
            break
        while events and events[0][0] == now_s:
            _, kind, _, job_id, attempt = heapq.heappop(events)
            if kind < _RECLAIM:
                work_events -= 1
            if kind == _TIMER:
                timers.discard(now_s)
            elif kind == _RECLAIM:
                reclaim(node_specs[job_id].name)
            elif kind == _BACK:
                name = node_specs[job_id].name
                down.discard(name)
                free[name] = units[name]  # a fresh node: nothing runs on it
                if book.shared(name):
                    book.set_all(name, free=True)
                if len(finished) < len(jobs):
                    next_interruption(name, now_s)
            elif kind == _ARRIVAL:
                queue_job(jobs[job_id])
            elif kind == _RELEASE:
                stopped = terminating.pop(workload_name(job_id, attempt), None)
                if stopped is not None:
                    give_back(*stopped)
            elif kind == _FINISH:
                r = running.get(job_id)
                if r is None or attempt_no[job_id] != attempt:
                    continue  # a preempted attempt's stale finish
                del running[job_id]
                release(r.job)
                j = jobs[job_id]
                charge(j, r.job.gpu_type, r.start, now_s)
                attempts[job_id].append(Attempt(r.start, now_s, preempted=False,
                                                cluster=r.job.cluster, gpu_type=r.job.gpu_type))
                finished[job_id] = now_s
        now = at(now_s)
        showing = tuple(b for b, (s_, e_) in zip(booked, booked_s, strict=True)
                        if e_ > now_s and s_ < now_s + LOOKAHEAD_SECONDS) if booked else ()
        if not queued and not any(s_ <= now_s < e_ for s_, e_ in booked_s):
            continue
        cycles += 1
        # --- snapshot (the selectors' part of the service, on the simulator's state)
        for r in running.values():
            if r.interval:  # rule R4: the attempt's last checkpoint, as the job reported it
                k = int((now_s - r.start) // r.interval)
                if k != r.checkpoints:
                    r.checkpoints = k
                    r.job = replace(r.job, checkpointed_at=at(r.start + k * r.interval))
        holding = [Holding(r.job.team,
                           *charged(jobs[r.job.id], billing.get(r.job.gpu_type, 1.0)),
                           r.job.started_at) for r in running.values()]
        open_intervals, penalty = standings_running_and_penalty(
            holding, now=now, interval_seconds=st.interval_seconds)
        with_work = {q.team for q in queued.values()} | {r.job.team for r in running.values()}
        usage_now = {t: a.at(now, h) for t, a in acc.items()}
        active = active_teams(usage=usage_now, with_work=with_work)
        standings = compute_standings(
            [TeamUsageInput(team=t, weight=spec.weight, accumulator=acc[t],
                            running=tuple(open_intervals.get(t, ())), parent=spec.parent,
                            active=t in active)
             for t, spec in teams.items()],
            now=now, half_life_hours=h, extra_usage=penalty)
        made = [m for m in made if (now - m[0]).total_seconds() < pre.window_seconds]
        nominations = [n for n in nominations
                       if (now - n.at).total_seconds() <= pre.nomination_seconds]
        nominated = nominated_preemptors(
            nominations, now=now,
            queued_attempts={n.job_id: attempt_no[n.job_id] for n in nominations
                             if n.job_id in queued},
            live_workloads=terminating.keys(), grace_seconds=pre.termination_grace_seconds,
            nomination_seconds=pre.nomination_seconds)
        snapshot = Snapshot(
            now=now,
            nodes=tuple(NodeState(n.name, n.gpu_type, units[n.name], free[n.name],
                                  cluster=n.cluster, spot=n.spot,
                                  slices_per_gpu=book.per_gpu.get(n.name, 1),
                                  gpu_free=book.gpu_free(n.name) if book.shared(n.name) else ())
                        for n in node_specs if not down or n.name not in down),
            queued=tuple(queued.values()),
            running=tuple(r.job for r in running.values()),
            quotas=quotas,
            team_parent=team_parent,  # rules F4, Q3-Q7: as the service's snapshot
            fair_share={t: s.factor for t, s in standings.items()},
            fair_share_state=FairShareState.from_standings(standings),
            priority_weights=st.priority,
            billing_weights=billing,
            interval_seconds=st.interval_seconds,
            nominated=nominated,
            nominated_placement=nominated_placements(nominations, nominated),
            preemption=PreemptionSettings.of(
                pre, used=preemptions_in_window(made, now=now, window_seconds=pre.window_seconds),
                lost_per_wait_by_tier=by_tier, owed_waits_tiers=owed_waits),
            reservation=st.reservation,
            cluster_ranks=ranks,
            units_per_gpu=dict(sc.slices),
            bookings=showing,
            lend_tiers=lend_tiers,
        )
        # Rule R11: owed when submitted, judged on the first snapshot that has the job.
        for job_id in fresh:
            q = queued.get(job_id)
            if q is not None and any(owed_claim(snapshot, q, t)
                                     for t in q.accepted_types):
                owed.add(job_id)
        fresh.clear()
        # --- decide
        if on_snapshot is not None:
            on_snapshot(snapshot)
        plan = plan_admissions(snapshot)
        if on_cycle is not None:
            on_cycle(now_s, plan)
        # --- apply: victims first (R6), so their GPUs are free for nothing this pass; the
        # admissions were placed on GPUs that were free at the snapshot (rule A5).
        for p in plan.preemptions:
            if p.preemptor_id not in queued:
                continue
            names = []
            for v in p.victims:
                r = running.pop(v.job_id)
                j = jobs[v.job_id]
                old = attempt_no[v.job_id]
                names.append(workload_name(v.job_id, old))
                g = grace[j.tier]
                if g > 0:  # rule R10: it keeps its GPUs while it stops
                    terminating[names[-1]] = (list(r.job.nodes), r.job.gpus_per_replica,
                                              held.pop(r.job.id, []))
                    push(now_s + g, _RELEASE, v.job_id, old)
                else:
                    release(r.job)
                # A checkpointing job saves on the stop signal when its grace allows the
                # save; else its last periodic checkpoint is what it keeps.
                saved = now_s if r.interval and sc.save_seconds <= g else \
                    r.last_checkpoint(now_s)
                keep_work(r, saved)
                gpus, weight = charged(j, billing.get(r.job.gpu_type, 1.0))
                requeued = requeue_victim(
                    attempt=old, submitted_at=at(j.submit), started_at=r.job.started_at,
                    now=now, gpus=gpus, billing_weight=weight,
                    accumulator=acc[j.team], half_life_hours=h)
                assert requeued.accumulator is not None  # given one, it gives one back
                acc[j.team] = requeued.accumulator
                attempt_no[v.job_id] = requeued.attempt
                attempts[v.job_id].append(Attempt(r.start, now_s, preempted=True,
                                                  cluster=r.job.cluster,
                                                  gpu_type=r.job.gpu_type, saved=saved,
                                                  released=now_s + g))
                queue_job(j, queued_at=now_s)
                made.append((now, p.team))
            nominations.append(Nomination(p.preemptor_id, attempt_no[p.preemptor_id], now,
                                          tuple(names), tuple(p.placement)))
            # Rule R8: the preemptor is admitted by a later cycle: the service's next
            # periodic one, or once the grace is over if it still does not fit then.
            timer(now_s + st.cycle_seconds)
            timer(now_s + pre.termination_grace_seconds)
        for a in plan.admissions:
            q = queued.pop(a.job_id)
            j = jobs[a.job_id]
            tier = tiers[j.tier]
            per = j.units_per_replica
            slots: list[int] = []
            # Rule H1: the plan's gpu_slots name the GPU of each replica's fraction, or
            # each of its whole GPUs, replica after replica.
            step = 1 if j.gpu_slices else j.gpus_per_replica
            for i, name in enumerate(a.placement):
                free[name] -= per
                if book.shared(name):
                    said = tuple(a.gpu_slots[i * step:(i + 1) * step]) if a.gpu_slots else ()
                    x = book.take(name, slices=j.gpu_slices,
                                  whole=0 if j.gpu_slices else j.gpus_per_replica,
                                  gpu=said[0] if said and j.gpu_slices else None,
                                  gpus=() if j.gpu_slices else said)
                    held.setdefault(j.id, []).append(x)
                    slots.extend(x[1])
            running[a.job_id] = _Running(
                # The type the plan chose among the job's accepted ones.
                RunningJob(id=j.id, team=j.team, gpu_type=a.gpu_type,
                           gpus_per_replica=per, replicas=j.replicas,
                           tier_rank=q.tier_rank, preemptible=tier.preemptible, started_at=now,
                           gpu_slots=tuple(slots),
                           min_runtime_seconds=tier.min_runtime_seconds, nodes=a.placement,
                           preemptions=sum(1 for x in attempts[j.id] if x.preempted),
                           max_runtime_seconds=estimate_seconds(j), cluster=a.cluster,
                           grace_seconds=math.ceil(grace[j.tier])),
                now_s, j.checkpoint_interval)
            push(now_s + left[j.id], _FINISH, j.id, attempt_no[j.id])
            if tier.preemptible and tier.min_runtime_seconds > 0:
                timer(now_s + tier.min_runtime_seconds)
        if pre.max_per_team is not None and made:
            # Rule R5: a team at its limit may preempt again once its oldest preemption
            # leaves the window; the service's periodic cycle would notice, so wake up then.
            used = preemptions_in_window(made, now=now, window_seconds=pre.window_seconds)
            for team, n in sorted(used.items()):
                if n >= pre.max_per_team:
                    oldest = min(m[0] for m in made if m[1] == team)
                    timer((oldest - EPOCH).total_seconds() + pre.window_seconds)
        if progress is not None:
            progress(now_s)

    records = tuple(JobRecord(j, tuple(attempts[j.id]), finished.get(j.id))
                    for j in workload.jobs)
    return RunResult("fairq", records, cycles, now_s, time.perf_counter() - t_wall,
                     interruptions=interruptions, owed=frozenset(owed),
                     grace_seconds=max((grace[t.name] for t in sc.tiers if t.preemptible),
                                       default=0.0))
