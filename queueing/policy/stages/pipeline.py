"""One queued job through the stages on one GPU type: quota fit (stage 3), flavor
assignment (stage 2: its pools), node fit (stage 4), admit (stage 6) or preemption
targets (stage 5), else its wait. The heads (stage 1) are `plan_admissions`' loop."""

from __future__ import annotations

from dataclasses import replace

from queueing.policy.snapshot import FlavorFallback, QueuedJob

from .admit import admit, final_wait
from .bookings import into_booking, lend, lends_to
from .flavors import assign
from .nodes import fit, fit_known_unfit
from .preempt import nominated_wait, preempt
from .quota import borrowing_blocked, quota_fit
from .reservation import reserve_earliest
from .state import DONE, Pass, Step, Try
from .waits import CODE, Raw, Wait, WaitReason

_CAPACITY, _LENDING = CODE[WaitReason.CAPACITY], CODE[WaitReason.LENDING]
_RESERVED = CODE[WaitReason.RESERVED]
# True: a lending wait (rules A1, Q4) is given again by the replay of waits; False: each
# through the stages (held to the whole pass by tests/policy/test_fleet_fast_paths.py).
LENDING_REPLAYED = True


def try_of(p: Pass, job: QueuedJob, index: int, gpu_type: str) -> Try:
    """A try of `job` on `gpu_type`; rule A6's CPU and memory only where the nodes of
    the type report them."""
    if gpu_type in p.cap.constrained:
        return Try(job, index, gpu_type, job.cpu_millicores or 0, job.memory_bytes or 0)
    return Try(job, index, gpu_type, 0, 0)


def attempt(p: Pass, t: Try) -> Step:
    """Rules Q1, A1-A9, K1-K4, R1-R9: the try admitted, preempting, or waiting (its wait
    in `p.raw`). Returns what the replay of waits may give again to an equal job, or
    `DONE`."""
    if p.book is not None and t.gt in p.book.held_types:
        booked = into_booking(p, t)  # rules W3, W4
        if booked is True:
            admit(p, t)
            p.ledger.remove(t.job.team, t.gt, t.total)  # rule W3: not in its quota
            return DONE
        if isinstance(booked, Wait):
            p.raw[t.job.id] = booked
            return DONE
    step = _fit_without_preempting(p, t)
    if step is not None:
        return step
    if t.placement is not None:
        admit(p, t)
        return DONE
    step = nominated_wait(p, t)
    if step is None:
        step = preempt(p, t)
    if step is not None:
        return step
    final_wait(p, t)
    raw = p.raw[t.job.id]
    if not isinstance(raw, Wait) and (t.owed > 0 or (raw[0] == _LENDING and LENDING_REPLAYED)):
        # Rule R11: an owed claim whose search found nothing waits as an equal job will
        # (its failed search is remembered); rules A1, Q4: so does a job refused GPUs
        # other teams guard (the ledger of its type as it was). The replay of waits may
        # give it again.
        return (raw[0], raw[2], raw[3], p.waits.elsewhere.get(t.job.id, ""))
    return DONE


def _fit_without_preempting(p: Pass, t: Try) -> Step | None:
    """Stages 3, 2 and 4: the try's wait when they decide it (`p.raw`), else None with
    its `placement` set, or not when only preempting could place it now."""
    step = quota_fit(p, t)
    if step is None:
        step = assign(p, t)
    if step is not None:
        return step
    t.lending = borrowing_blocked(p, t)
    if not t.lending and not t.over:
        lent = p.book is not None and lends_to(p, t)  # rule W4
        known = fit_known_unfit(p, t) if not (p.nominated or lent) else False
        if known is False:
            step = lend(p, t, fit) if lent else fit(p, t)
            if step is not None:
                return step
        elif known is not True:
            return known
    return None


def type_order(p: Pass, job: QueuedJob) -> tuple[str, ...]:
    """Rules G1, G2: the order a job accepting several GPU types tries them. `borrow`
    (Kueue's whenCanBorrow: Borrow): its types in preference order, each with its
    team's nominal quota or by borrowing, whichever it has. `next_type`: first the types
    on which it stays within its team's nominal, in preference order, then those on
    which it would borrow. A nominated preemptor (rule A5) first tries the type of the
    placement its preemption planned."""
    types = job.accepted_types
    if p.snapshot.fallback(job.team, job.tier_rank) is FlavorFallback.NEXT_TYPE:
        within = p.ledger.within_nominal
        total = job.gpus_per_replica * job.replicas
        nominal = [gt for gt in types if within(job.team, gt, total)]
        types = (*nominal, *(gt for gt in types if gt not in nominal))
    planned = p.snapshot.nominated_placement.get(job.id) if p.nominated else None
    if planned:
        first = p.cap.node_type.get(planned[0])
        if first in types:
            types = (first, *(gt for gt in types if gt != first))
    return types


def attempt_types(p: Pass, job: QueuedJob, index: int) -> Step:
    """Rules G1-G5 for a job accepting several GPU types: tried on each type in
    `type_order` without preempting, admitted on the first it fits (rule G4: charged as
    that type); else, when no type fits without it, preemption on each type in
    preference order (rule G3: Kueue's whenCanPreempt TryNextFlavor); else it waits with
    each type's blocker (rule G5) and rule A9 reserves on the type where its shadow time
    comes first. Returns `DONE`, or when it waits with every blocker a raw wait (no
    search, no preemptor, no reservation in the way: what the replay of waits may give
    again) its first type's step."""
    tries: dict[str, Try] = {}
    blockers: dict[str, Wait | Raw] = {}
    may_preempt: list[str] = []
    for gt in type_order(p, job):
        view = job if gt == job.gpu_type else replace(job, gpu_type=gt)
        t = tries[gt] = try_of(p, view, index, gt)
        t.multi = True
        if _fit_without_preempting(p, t) is None:
            if t.placement is not None:
                admit(p, t)
                _forget_waits(p, job.id)  # what earlier types said is moot
                return DONE
            may_preempt.append(gt)
            final_wait(p, t)  # what it waits for on this type unless it preempts
        blockers[gt] = p.raw[job.id]
    types = job.accepted_types
    if may_preempt and nominated_wait(p, tries[may_preempt[0]]) is not None:
        return DONE
    for gt in types:
        if gt not in may_preempt:
            continue
        before = len(p.preemptions)
        if preempt(p, tries[gt]) is not None:
            if len(p.preemptions) > before:
                return DONE
            blockers[gt] = p.raw[job.id]  # rule R5 or R9 said no on this type
    if p.reserve_on:
        reserve_earliest(p, [t for t in (tries[gt] for gt in types) if t.fitting
                             and not t.over and not t.lending and t.why_not == _CAPACITY])
    first = p.raw[job.id] = blockers[types[0]]
    several = [(gt, blockers[gt]) for gt in types]
    p.waits.per_type[job.id] = (index, several)
    if isinstance(first, Wait) or any(isinstance(raw, Wait) for _, raw in several) or \
            any(tries[gt].owed > 0 for gt in types):  # rule R11's words are not replayed
        return DONE
    if any(not isinstance(raw, Wait) and raw[0] == _RESERVED for _, raw in several):
        # Rule A9 reads the job's max_runtime_seconds, which an equal job need not share:
        # not replayed, as `fit` does not give it for a job of one type.
        return DONE
    return (first[0], first[2], first[3], p.waits.elsewhere.get(job.id, ""))


def _forget_waits(p: Pass, job_id: int) -> None:
    """An admitted job waits for nothing: the blockers of the types tried before go."""
    p.raw.pop(job_id, None)
    for said in (p.waits.elsewhere, p.waits.refused, p.waits.protected):
        said.pop(job_id, None)
