"""Stage 3, quota fit and borrowing: the GPUs a job's team holds of a type against its
ceiling (nominal + borrowing limit, rule Q1), a job that can never fit under it (rule
E6), and the unused nominal other teams guard beyond their lending limits (rule A1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .flavors import unheld_anywhere
from .owed import owed
from .waits import CODE, WaitReason

if TYPE_CHECKING:
    from .state import Pass, Step, Try

_QUOTA, _NEVER_FITS = CODE[WaitReason.QUOTA], CODE[WaitReason.NEVER_FITS]


def quota_fit(p: Pass, t: Try) -> Step | None:
    """Rule Q1: sets the try's `over` (its team would pass its ceiling). Over it, a job
    that could not make room by preempting its own team's lower tiers (rule R1) waits:
    for the quota, or - rule E6 - saying it can never fit (a ceiling below the job), or
    that no pool it may use could hold it even empty (a cluster disabled or gone since
    its submit), not "raise the quota", which cannot help. None: go on. An owed claim
    (rule R11) may make room even when the pass has no search left."""
    job = t.job
    ceiling = p.ceilings.get(t.key)
    if ceiling is None:
        return None
    held = p.held[t.key]
    t.over = held + t.total > ceiling
    if not t.over or ((p.may_search or owed(p, t) is not None)
                      and p.ws.lowest_tier.get(t.key, job.tier_rank) < job.tier_rank):
        return None
    unheld = unheld_anywhere(p, t)
    if unheld is not None:
        p.raw[job.id] = (unheld[0], t.index, unheld[1], unheld[2])
        return (*unheld, "")
    code = _QUOTA if t.total <= ceiling else _NEVER_FITS
    p.raw[job.id] = (code, t.index, held, ceiling)
    return (code, held, ceiling, "")


def borrowing_blocked(p: Pass, t: Try) -> bool:
    """Rule A1: would the try eat into GPUs other teams guard (their unused nominal
    beyond their lending limits)? Only asked within the ceiling."""
    return not t.over and p.ledger.guarded_total.get(t.gt, 0) > 0 and \
        p.ledger.lending_blocks(t.job.team, t.gt, t.total)
