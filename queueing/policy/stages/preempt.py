"""Stage 5, preemption targets: a job that fits no pool now may preempt (rules R1-R4,
Q2; victims in one cluster, rule K7), within its team's rate limit (rule R5) and only
when worth it (rules R9, R9.1) - but an owed claim (rule R11) at once, whatever R3's
protection, R5, R9 and the pass's search budget say; the GPUs a preemption frees are
held for its preemptor (rule A5; rule E2 names them), and a failed search says when
protected candidates become victims (rule E4). The search itself is
`policy/preemption.py::find_victims`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from queueing.policy.preemption import Preemption, find_victims, work_lost_gpu_hours
from queueing.policy.snapshot import QueuedJob, RunningJob
from queueing.policy.workspace import Capacity, Workspace

from .admit import admitted_one
from .bookings import ahead_of_victims, spared_from
from .flavors import k2_order
from .owed import may_find, owed, owed_move
from .reservation import reserve, spared_until_shadow
from .waits import CODE, NO_VICTIM, NOT_WORTH, Wait, WaitReason, need_words, until_words

if TYPE_CHECKING:
    from .state import Pass, SearchKey, Step, Try

_CAPACITY = CODE[WaitReason.CAPACITY]
_Found = tuple[Preemption, Callable[[], None]]


def nominated_wait(p: Pass, t: Try) -> Step | None:
    """Rule A5 (E2 names it): a nominated preemptor whose victims still hold GPUs waits
    for them, and what is free of its planned placement is its, while its victims' GPUs
    are still being released: no later job takes it first."""
    job = t.job
    terminating = p.nominated.get(job.id, 0) if p.nominated else 0
    if terminating <= 0:
        return None
    planned = p.snapshot.nominated_placement.get(job.id)
    if planned:
        p.hold_log.append(job.id)
        hold(p.holds, p.holder, p.cap.node_pool.get(planned[0], t.gt), job.id,
             hold_placement(p.cap, t.gt, planned, job.gpus_per_replica), (),
             job.gpus_per_replica)
    nominal = owed(p, t)
    p.raw[job.id] = Wait(job.id, WaitReason.PREEMPTING,
                         (owed_words(p, t, nominal) + ": " if nominal is not None else "")
                         + f"waiting for {terminating} preempted job(s) to release their "
                         f"{t.gt} GPUs")
    return ()


def owed_words(p: Pass, t: Try, nominal: int) -> str:
    """Rule R11 in words: "owed 8 of team vision's 16 nominal h100 GPUs (rule R11)"; a
    slice-packed type's slices in GPUs (rule H4)."""
    per_gpu = p.cap.packed.get(t.gt, 1) if p.cap.packed else 1
    if per_gpu > 1:
        return (f"owed {t.total / per_gpu:g} of team {t.job.team}'s {nominal / per_gpu:g} "
                f"nominal {t.gt} GPUs (rule R11)")
    return f"owed {t.total} of team {t.job.team}'s {nominal} nominal {t.gt} GPUs (rule R11)"


def preempt(p: Pass, t: Try) -> Step | None:
    """Rules R1-R5, R9, R11, K7: only when preempting is the only way the try fits. A
    search that failed for a job of the same team, shape and tier (and cluster pool) fails
    again: it is skipped. An owed claim (rule R11) searches even with no search left in
    the pass, its victims unprotected by rule R3, and neither rule R5 nor R9 refuses what
    it finds. Returns the step when the job is decided (a preemption, or a wait of rule
    R5 or R9), None when it waits as it would without preemption (`waited`)."""
    job = t.job
    # Rule A9 applies if it ends up waiting for capacity (not quota, not preempting).
    t.may_reserve = (p.reserve_on and not t.over and not t.lending
                     and t.why_not == _CAPACITY and t.gt not in p.decided)
    if t.k2 is None:
        t.k2 = t.fitting if len(t.fitting) == 1 else k2_order(p, t.fitting, job.id)
    nominal = owed(p, t)
    if not p.may_search and nominal is None:
        return None
    search_key: SearchKey = (job.team, t.gt, job.tier_rank, job.gpus_per_replica,
                             job.replicas, t.cpu, t.mem, job.topology)
    if nominal is None and (_rate_limited_before(p, t, search_key)
                            or _refused_before(p, t, search_key)):
        return ()
    result = _search(p, t, search_key, owed=nominal is not None)
    if result is not None and nominal is None and \
            p.pre.lost_per_wait_of(job.tier_rank) is not None:
        result = _worth_it(p, t, result, search_key)
        if result is None:
            return ()
    if result is not None:
        if nominal is None and _rate_limited_after(p, t, result, search_key):
            return ()
        if p.book is not None:
            ahead_of_victims(p, t, result[0], take=True)  # rule W1: its room at the starts
        _take(p, t, result[0], nominal)
        return ()
    if nominal is not None:
        p.waits.owed[(job.id, t.gt)] = nominal
    return None


def _rate_limited_before(p: Pass, t: Try, search_key: SearchKey) -> bool:
    """Rule R5 before the search: a team with no preemption left in the window does not
    search at all, and one whose search needed more victims than it has left does not
    search again for the same shape in this pass (what it may still preempt only shrinks
    within a pass)."""
    team = t.job.team
    left = p.pre.left(team)
    if left is None:
        return False
    left -= p.preempted_by_team[team]
    needed = p.rate_refused.get(search_key)
    if not (left <= 0 or (needed is not None and needed > left)):
        return False
    until = p.pre.free_again_at(team, needed=needed or 1,
                                made_in_pass=p.preempted_by_team[team], now=p.now)
    if t.may_reserve:
        reserve(p, t, t.k2 or ())
    p.raw[t.job.id] = Wait(
        t.job.id, WaitReason.RATE_LIMITED,
        f"team {team} may preempt {max(0, left)} more job(s) in the current "
        "window" + (f"; it needs {needed}" if needed is not None else "")
        + (f"; until {until_words(until, p.now)}" if until else ""), until)
    return True


def _waited(p: Pass, job: QueuedJob) -> float:
    """Rule R9: how long the job has waited, in seconds (from its current attempt)."""
    return max(0.0, (p.now - (job.queued_at or job.submitted_at)).total_seconds())


def _refused_before(p: Pass, t: Try, search_key: SearchKey) -> bool:
    """Rule R9 (a refusal remembered): a search of this team, shape and tier that R9
    refused in this pass found victims losing `lost` GPU-seconds; a job whose wait allows
    less would be refused the same victims: it waits, no search."""
    job = t.job
    refused_lost = p.r9_refused.get((search_key, job.clusters))
    lost_per_wait = p.pre.lost_per_wait_of(job.tier_rank)
    if refused_lost is None or lost_per_wait is None or \
            refused_lost <= lost_per_wait * t.total * _waited(p, job):
        return False
    if t.may_reserve:
        reserve(p, t, t.k2 or ())
    p.waits.refused[job.id] = NOT_WORTH
    p.raw[job.id] = Wait(
        job.id, WaitReason.CAPACITY,
        f"{need_words(job, t.gt, p.cap.packed)}; "
        f"preempting now would lose about {refused_lost / 3600.0:.2f} GPU-hours of other "
        "jobs' work (the victims found for an equal job of its team in this pass), more "
        "than its wait so far is worth (rule R9)")
    return True


def _search(p: Pass, t: Try, search_key: SearchKey, *, owed: bool = False) -> _Found | None:
    """Rule K7: the victims in one cluster, the first pool in rule K2 order where a
    victim set exists (rule R4: within the pass's search budget, which an owed claim of
    rule R11 may pass, its candidates unprotected by rule R3). A failed search notes rule
    E4's protected candidates."""
    job, result = t.job, None
    failed = p.owed_search_failed if owed else p.search_failed
    hopeless: bool | None = None  # an owed search that cannot succeed: counted, not run
    for q in t.k2 or ():
        pool_search = (job.team, q, job.tier_rank, job.gpus_per_replica, job.replicas,
                       t.cpu, t.mem, job.topology)
        if pool_search in failed:
            continue
        if not p.may_search and not owed:
            break
        if hopeless is None:
            hopeless = owed and not may_find(p, t)
        p.searches += 1
        p.may_search = p.searches < p.pre.max_searches
        if not hopeless:
            result = find_victims(p.ws, job, now=p.now, factor=p.factors.factor, pool=q,
                                  protect=not owed, spared=spared_from(p, t))
            if result is not None and p.book is not None and \
                    not ahead_of_victims(p, t, result[0]):
                result[1]()  # rule W1 would refuse the placement: no preemption for it
                result = None
        if result is not None:
            t.pool = q
            break
        failed.add(pool_search)
        if owed:
            continue  # rule R3 protected none of its candidates
        if (search_key, job.clusters) not in p.protected_for:
            candidates = p.protected_of_type.get(t.gt)
            if candidates is None:
                candidates = p.protected_of_type[t.gt] = protected_of_type(p.ws, t.gt, p.now)
            p.protected_for[(search_key, job.clusters)] = protected_among(p.ws, job, candidates)
    if result is None:
        p.waits.refused[job.id] = NO_VICTIM
        protected = None if owed else p.protected_for.get((search_key, job.clusters))
        if protected is not None:
            p.waits.protected[job.id] = protected
    return result


def _worth_it(p: Pass, t: Try, result: _Found, search_key: SearchKey) -> _Found | None:
    """Rule R9: preempt only when it is worth it - the work the victims lose is at most
    `lost_per_wait` × what the job has waited, in GPU-seconds. Else it waits for a finish
    (and searches again, its wait grown, in a later cycle): None, its wait said."""
    job, lost_per_wait = t.job, p.pre.lost_per_wait_of(t.job.tier_rank)
    assert lost_per_wait is not None
    found, undo = result
    upg = p.snapshot.units_per_gpu.get(t.gt, 1)  # rule H4: in GPU-equivalents
    lost = sum(work_lost_gpu_hours(p.ws.running_by_id[v.job_id], p.now, upg)
               for v in found.victims) * 3600.0
    waited = _waited(p, job)
    gpus = t.total / upg
    allowed = lost_per_wait * gpus * waited
    if lost > allowed and t.may_reserve and not t.cpu and not t.mem \
            and job.topology is None and t.total >= p.largest.get(t.gt, 0):
        # Rule R9.1: the large gang rule A9 reserves for also counts the wait this
        # preemption spares it - until its shadow time, at most as long again as it has
        # waited (shadow time without the victims found: they are restored).
        undo()
        spared = spared_until_shadow(p.ws, job, p.now, p.admitted_ends.get(t.gt, ()),
                                     t.k2 or (), t.gt)
        again = find_victims(p.ws, job, now=p.now, factor=p.factors.factor, pool=t.pool,
                             spared=spared_from(p, t))
        assert again is not None  # the same workspace as the search above
        result = again
        found, undo = again
        allowed = lost_per_wait * gpus * (waited + min(spared, waited))
    if lost <= allowed:
        return result
    undo()
    p.waits.refused[job.id] = NOT_WORTH
    refused_key = (search_key, job.clusters)
    p.r9_refused[refused_key] = min(lost, p.r9_refused.get(refused_key, lost))
    if t.may_reserve:
        reserve(p, t, t.k2 or ())
    p.raw[job.id] = Wait(
        job.id, WaitReason.CAPACITY,
        f"{need_words(job, t.gt, p.cap.packed)}; "
        f"preempting now would lose {lost / 3600.0:.2f} GPU-hours of other jobs' work, more "
        "than its wait so far is worth (rule R9)")
    return None


def _rate_limited_after(p: Pass, t: Try, result: _Found, search_key: SearchKey) -> bool:
    """Rule R5 after the search: victims found beyond what the team may still preempt in
    the window are put back, and the job waits for the window."""
    found, undo = result
    team = t.job.team
    left = p.pre.left(team)
    if left is None or len(found.victims) <= left - p.preempted_by_team[team]:
        return False
    undo()
    p.rate_refused[search_key] = len(found.victims)
    until = p.pre.free_again_at(team, needed=len(found.victims),
                                made_in_pass=p.preempted_by_team[team], now=p.now)
    if t.may_reserve:
        reserve(p, t, t.k2 or ())
    p.raw[t.job.id] = Wait(
        t.job.id, WaitReason.RATE_LIMITED,
        f"needs {len(found.victims)} preemption(s) but team {team} may preempt "
        f"{max(0, left - p.preempted_by_team[team])} more in the current window"
        + (f"; until {until_words(until, p.now)}" if until else ""), until)
    return True


def _take(p: Pass, t: Try, found: Preemption, owed_nominal: int | None = None) -> None:
    """The victims stay removed and the job's placement stays reserved for the rest of
    this pass; what the victims free beyond it is held back too: they still run until
    stopped, so no job of this pass may be placed there (rule A5). An owed claim (rule
    R11, `owed_nominal` its team's nominal) says so, and how long its victims may take
    to leave (their termination grace, rule R8)."""
    job = t.job
    freed = hold_freed(p.ws, found, job.gpus_per_replica, t.cpu, t.mem)
    p.hold_log.append(job.id)
    hold(p.holds, p.holder, t.pool, job.id, freed, found.placement, job.gpus_per_replica)
    p.ledger.add(job.team, t.gt, t.total)
    owed_move(p, job.team, t.gt, job.tier_rank, t.total)
    for v in found.victims:
        owed_move(p, v.team, t.gt, v.tier_rank, -v.gpus)
    p.preempted_by_team[job.team] += len(found.victims)
    p.preemptions.append(found if owed_nominal is None else replace(found, owed=True))
    admitted_one(p, job)
    words = (f"preempting {len(found.victims)} job(s) "
             f"({', '.join('#' + str(v.job_id) for v in found.victims)}; "
             f"rule {', '.join(found.rules)}); admitted once their GPUs are free")
    if owed_nominal is not None:
        graces = [p.ws.running_by_id[v.job_id].grace_seconds for v in found.victims]
        words = (f"{owed_words(p, t, owed_nominal)}: {words}, within their termination grace"
                 + (f" ({max(g for g in graces if g is not None)} s)"
                    if all(g is not None for g in graces) else ""))
    p.raw[job.id] = Wait(job.id, WaitReason.PREEMPTING, words)


def hold(holds: dict[str, dict[str, int]], holder: dict[str, int], gpu_type: str,
          job_id: int, extra: Mapping[str, int], placement: Iterable[str], gpus: int) -> None:
    """Rule E2's record of rule A5: `job_id` holds `extra` GPUs per node beyond its
    `placement` of `gpus` per replica."""
    per_node = holds.setdefault(gpu_type, {})
    for name, n in extra.items():
        if n > 0:
            per_node[name] = per_node.get(name, 0) + n
    for name in placement:
        per_node[name] = per_node.get(name, 0) + gpus
    holder[gpu_type] = job_id


def hold_placement(cap: Capacity, gpu_type: str, placement: Iterable[str],
                    gpus: int) -> dict[str, int]:
    """Rule A5 for a nominated preemptor still waiting for its victims: take what is free
    of `gpus` per replica on its planned nodes (of its type) out of this pass's capacity;
    returns the GPUs held per node."""
    want: dict[str, int] = defaultdict(int)
    for name in placement:
        if cap.node_type.get(name) == gpu_type:
            want[name] += gpus
    held: dict[str, int] = {}
    for name, n in sorted(want.items()):
        take = cap.take_free(name, n)  # rule H6: slices of a packed node's GPUs
        if take > 0:
            held[name] = take
    return held


def protected_until(ws: Workspace, job: QueuedJob, now: datetime) -> tuple[datetime, int] | None:
    """Rule E4: of the running jobs of `job`'s GPU type it might preempt (preemptible, and
    of a lower tier or another team: rules R1, R2), those its tier's minimum runtime still
    protects (rule R3): when the first protection ends, and how many are protected. None
    when none is (or none has started: its protection has no known end). Only jobs of
    the clusters it may use count (rule K7: victims are in the preemptor's cluster).
    The reference for `protected_among`, which the plan calls."""
    allowed = job.clusters
    ends = [r.started_at + timedelta(seconds=r.min_runtime_seconds)
            for r in ws.running_by_type.get(job.gpu_type, ())
            if r.preemptible and r.id not in ws.removed and r.started_at is not None
            and (allowed is None or ws.running_cluster[r.id] in allowed)
            and (r.tier_rank < job.tier_rank or r.team != job.team)
            and r.ran_seconds(now) < r.min_runtime_seconds]
    return (min(ends), len(ends)) if ends else None


# Rule E4's candidates of one GPU type: (job, the end of its protection) per running job
# that is preemptible, has started and is still protected by rule R3 at `now`.
Protected = list[tuple[RunningJob, datetime]]


def protected_of_type(ws: Workspace, gpu_type: str, now: datetime) -> Protected:
    """The running jobs of `gpu_type` that rule R3 protects at `now` (preemptible and
    started), with when their protection ends: what `protected_until` keeps of them
    before it looks at the job, the same for every search of a pass (no job starts or
    ages within it). A job with no minimum runtime is never protected (its run time is
    never negative)."""
    return [(r, r.started_at + timedelta(seconds=r.min_runtime_seconds))
            for r in ws.running_by_type.get(gpu_type, ())
            if r.min_runtime_seconds > 0 and r.preemptible and r.started_at is not None
            and r.ran_seconds(now) < r.min_runtime_seconds]


def protected_among(ws: Workspace, job: QueuedJob,
                     candidates: Protected) -> tuple[datetime, int] | None:
    """`protected_until(ws, job, now)` from `protected_of_type(ws, job.gpu_type, now)`:
    a long queue's failed searches (up to rule R4's budget per pass) each read the few
    protected jobs instead of every running job of the type."""
    allowed, removed, where = job.clusters, ws.removed, ws.running_cluster
    tier, team = job.tier_rank, job.team
    ends = [end for r, end in candidates
            if r.id not in removed and (allowed is None or where[r.id] in allowed)
            and (r.tier_rank < tier or r.team != team)]
    return (min(ends), len(ends)) if ends else None


def hold_freed(ws: Workspace, found: Preemption, gpus_per_replica: int, cpu: int,
                memory: int) -> dict[str, int]:
    """Rule A5: GPUs (and CPU and memory, rule A6) a preemption frees beyond its
    preemptor's placement are not free during this pass (the victims are only stopped
    after it). Returns the GPUs held back per node (rule E2 names them)."""
    extra: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for v in found.victims:
        r = ws.running_by_id[v.job_id]
        for name in r.nodes:
            e = extra[name]
            e[0] += r.gpus_per_replica
            e[1] += r.cpu_millicores or 0
            e[2] += r.memory_bytes or 0
    for name in found.placement:
        e = extra[name]
        e[0] -= gpus_per_replica
        e[1] -= cpu
        e[2] -= memory
    cap = ws.capacity
    held: dict[str, int] = {}
    for name, (hold, hold_cpu, hold_memory) in sorted(extra.items()):
        if name not in cap.free:
            continue
        if hold > 0:
            held[name] = cap.take_free(name, hold)
        c, m = cap.cpu_free[name], cap.memory_free[name]
        cap.add_cpu_memory(name, -min(max(0, hold_cpu), c or 0),
                           -min(max(0, hold_memory), m or 0))
    return held
