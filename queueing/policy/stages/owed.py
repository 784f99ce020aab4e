"""Rule R11 on the pass: is a try an owed claim that preempts at once? The team's GPUs of
the type held by jobs of the job's tier or above, plus the job's, fit in the team's
nominal quota (`preemption.owed_claim` on the snapshot), counting what this very pass
admitted or preempted for the team and not the victims it took, so two jobs of a team
are never both owed the same nominal GPUs; and the job's tier is not one whose owed
claims wait (`PreemptionSettings.owed_waits_tiers`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .state import Pass, Try


def owed(p: Pass, t: Try) -> int | None:
    """Rule R11: the team's nominal quota of the try's GPU type when the try is an owed
    claim that preempts at once (rules R3's protection, R5 and R9 do not refuse it; it
    searches when the pass has no search left), else None. Asked once per try."""
    if t.owed < 0:
        t.owed = _owed_nominal(p, t)
    return t.owed or None


def _owed_nominal(p: Pass, t: Try) -> int:
    if not p.owed_on:
        return 0
    quota = p.snapshot.quotas.get(t.key)
    job = t.job
    if quota is None or quota.nominal < t.total or job.tier_rank in p.pre.owed_waits_tiers:
        return 0
    by_tier = _tier_held(p).get(t.key)
    rank = job.tier_rank
    held = sum(g for r, g in by_tier.items() if r >= rank) if by_tier else 0
    return quota.nominal if held + t.total <= quota.nominal else 0


def _tier_held(p: Pass) -> dict[tuple[str, str], dict[int, int]]:
    """Per (team, GPU type), GPUs held per tier rank now in the pass: the snapshot's
    running jobs but the victims taken (`ws.removed`: no search is under way when this
    is asked), plus the pass's admissions and preemptors so far (`owed_log`)."""
    held = p.tier_held
    if held is None:
        held = p.tier_held = {}
        removed = p.ws.removed
        for r in p.snapshot.running:
            if r.id not in removed:
                by_tier = held.setdefault((r.team, r.gpu_type), {})
                by_tier[r.tier_rank] = by_tier.get(r.tier_rank, 0) + r.total_gpus
        for team, gpu_type, rank, gpus in p.owed_log:
            by_tier = held.setdefault((team, gpu_type), {})
            by_tier[rank] = by_tier.get(rank, 0) + gpus
        p.owed_log.clear()
    return held


def owed_move(p: Pass, team: str, gpu_type: str, tier_rank: int, gpus: int) -> None:
    """Rule R11's count of what a pass admits (`gpus` > 0) or takes as a victim (< 0).
    Before the count is built a victim needs no entry: it is in `ws.removed` by then."""
    if not p.owed_on:
        return
    held = p.tier_held
    if held is None:
        if gpus > 0:
            p.owed_log.append((team, gpu_type, tier_rank, gpus))
        return
    by_tier = held.setdefault((team, gpu_type), {})
    by_tier[tier_rank] = by_tier.get(tier_rank, 0) + gpus
