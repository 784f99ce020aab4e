"""Stage 6, admit: a job placed is admitted - its team's quota and fair share charged
(rules Q1, F6), its GPUs held if it is a nominated preemptor (rule A5), its estimate kept
for rule A9's shadow times - and a job not placed gets the wait its stages found."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from queueing.policy.fairshare import entry_penalty_gpu_hours
from queueing.policy.snapshot import QueuedJob

from .nodes import capacity_wait
from .owed import owed_move
from .quota import tree_lending_wait, tree_wait
from .reservation import reserve
from .waits import CODE, WaitReason

if TYPE_CHECKING:
    from .state import Pass, Try

_QUOTA, _NEVER_FITS = CODE[WaitReason.QUOTA], CODE[WaitReason.NEVER_FITS]
_LENDING = CODE[WaitReason.LENDING]


@dataclass(frozen=True, slots=True)
class Admission:
    job_id: int
    team: str
    gpu_type: str  # the type it was placed on
    # One node name per replica, in replica order (rule A3).
    placement: tuple[str, ...]
    cluster: str = ""  # rule K1: the one cluster of its nodes ("" = the only cluster)
    spot: bool = False  # rules K1, K4, C4: its nodes are spot nodes (all or none)
    # Shared GPUs (rule H1): the GPU indexes on its nodes, replica after replica (one per
    # fraction, each whole GPU's on a packed type); () = another type.
    gpu_slots: tuple[int, ...] = ()


def admitted_one(p: Pass, job: QueuedJob) -> None:
    """Rule A8: one more member of its array holds GPUs."""
    if job.array_id is not None:
        p.array_active[job.array_id] += 1


def admit(p: Pass, t: Try) -> None:
    """Admit the try's placement on its pool, charged as its type (rule G4: quota and the
    entry penalty of the type it lands on)."""
    job, gt, placement = t.job, t.gt, t.placement
    assert placement is not None
    g = job.gpus_per_replica
    if p.nominated and job.id in p.nominated:  # rule A5: planned first, for its GPUs
        p.hold_log.append(job.id)
        per_node = p.holds.setdefault(t.pool, {})
        for name in placement:
            per_node[name] = per_node.get(name, 0) + g
        p.holder[t.pool] = job.id
    if p.reserve_on and gt not in p.decided and job.max_runtime_seconds is not None:
        p.admitted_ends.setdefault(gt, []).append(
            (p.now + timedelta(seconds=job.max_runtime_seconds), job.id, placement, g))
    p.ledger.add(job.team, gt, t.total)
    owed_move(p, job.team, gt, job.tier_rank, t.total)  # rule R11
    s = p.snapshot
    p.factors.charge(job.team, entry_penalty_gpu_hours(  # rule H4: in GPU-equivalents
        s.gpus_of(gt, t.total) if s.units_per_gpu else t.total, s.billing_weight(gt),
        s.interval_seconds))
    info = p.pool_info[t.pool]
    p.admissions.append(Admission(job.id, job.team, gt, placement, info[1], info[2],
                                  t.slots))
    admitted_one(p, job)


def final_wait(p: Pass, t: Try) -> None:
    """The wait of a try no stage placed: its quota (rule Q1: `quota`, or `never_fits`
    when the ceiling is below the job, rule E6), GPUs other teams guard (rule A1:
    `lending_limit`), else the capacity wait of its pools (rules E2, E3, K3); a capacity
    or lending wait may reserve (rule A9)."""
    job = t.job
    if t.over and p.ledger.tree is not None:
        tree_wait(p, t)  # rule Q4
        return
    if t.over:
        ceiling = p.ceilings.get(t.key) or 0
        p.raw[job.id] = (_QUOTA if t.total <= ceiling else _NEVER_FITS, t.index,
                         p.held[t.key], ceiling)
        return
    if t.lending and p.ledger.tree is not None:
        tree_lending_wait(p, t)  # rule Q4
    elif t.lending:
        p.raw[job.id] = (_LENDING, t.index, 0, 0)
    else:
        p.raw[job.id] = capacity_wait(p, t, t.why_not)
    if t.may_reserve:
        reserve(p, t, t.k2 or ())
