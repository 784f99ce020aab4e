"""Stage 3, quota fit and borrowing: the GPUs a job's team holds of a type against its
ceiling (nominal + borrowing limit, rule Q1), a job that can never fit under it (rule
E6), and the unused nominal other teams guard beyond their lending limits (rule A1)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .flavors import unheld_anywhere
from .owed import owed
from .waits import CODE, Raw, WaitReason

if TYPE_CHECKING:
    from .state import Pass, Step, Try

_QUOTA, _NEVER_FITS = CODE[WaitReason.QUOTA], CODE[WaitReason.NEVER_FITS]
_LENDING = CODE[WaitReason.LENDING]
# True: rule Q4's lending words kept per (team, GPU type) until the type moves
# (`tree_lending_wait`); False: said anew for every wait (the reference, held to it by
# tests/policy/test_fleet_fast_paths.py).
WORDS_KEPT = True


def quota_fit(p: Pass, t: Try) -> Step | None:
    """Rule Q1: sets the try's `over` (its team would pass its ceiling). Over it, a job
    that could not make room by preempting its own team's lower tiers (rule R1) waits:
    for the quota, or - rule E6 - saying it can never fit (a ceiling below the job), or
    that no pool it may use could hold it even empty (a cluster disabled or gone since
    its submit), not "raise the quota", which cannot help. None: go on. An owed claim
    (rule R11) may make room even when the pass has no search left."""
    job = t.job
    if p.ledger.tree is not None:
        return _tree_fit(p, t)
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
    ledger = p.ledger
    return not t.over and (ledger.tree is not None or ledger.guarded_total.get(t.gt, 0) > 0) \
        and ledger.lending_blocks(t.job.team, t.gt, t.total)


def _tree_fit(p: Pass, t: Try) -> Step | None:
    """Rule Q4, `quota_fit` in a tree: over a borrowing limit of the team's path, the
    job waits naming the binding level (as over its ceiling in rule Q1) unless its own
    team's lower tiers could make room (rule R1) or, over a department's limit, a
    search may find victims under that department (rules R1, Q6)."""
    job = t.job
    binding = p.ledger.tree_limit(job.team, t.gt, t.total)
    t.over = binding is not None
    if binding is None or ((p.may_search or owed(p, t) is not None) and (
            binding[0] != job.team
            or p.ws.lowest_tier.get(t.key, job.tier_rank) < job.tier_rank)):
        return None
    unheld = unheld_anywhere(p, t)
    if unheld is not None:
        p.raw[job.id] = (unheld[0], t.index, unheld[1], unheld[2])
        return (*unheld, "")
    raw = tree_wait(p, t, binding)
    return (raw[0], raw[2], raw[3], "")


def tree_wait(p: Pass, t: Try, binding: tuple[str, int, int] | None = None) -> Raw:
    """Rule Q4's wait for a try over a borrowing limit of its path (`binding`, the
    ledger's `tree_limit` of it, when known): `quota` (rule E6: `never_fits` when the job
    alone passes it), held = what the binding node's subtree holds, ceiling = -(k + 1)
    for entry k of `Waits.tree_limits` (the words name it)."""
    job, gt = t.job, t.gt
    if binding is None:
        binding = p.ledger.tree_limit(job.team, gt, t.total)
    assert binding is not None
    node, cap, held = binding
    k = p.tree_limit_index.get((node, gt))
    if k is None:  # a node's entry is static: its nominal and borrowing limit
        tree = p.ledger.tree
        assert tree is not None
        limits = p.waits.tree_limits
        k = p.tree_limit_index[(node, gt)] = len(limits)
        limits.append((node, gt, tree.nominal(node, gt),
                       tree.quota(node, gt).borrowing_limit or 0))
    code = _NEVER_FITS if t.total > cap else _QUOTA
    raw = p.raw[job.id] = (code, t.index, held, -(k + 1))
    return raw


def tree_lending_wait(p: Pass, t: Try) -> None:
    """Rule Q4's words for a try the fleet's cap refuses while other nodes guard GPUs:
    how many are left and who guards them (their subtree quota beyond their lending
    limit). They read the type's usage alone: kept per (team, type) until the type moves
    (`WORDS_KEPT`), as entry k of `Waits.lending` that the raw wait names (its ceiling
    -(k + 1)), so the replay of waits may give it again."""
    job, gt = t.job, t.gt
    stamp = p.ledger.type_moves[gt]
    kept = p.lending_words.get(t.key) if WORDS_KEPT else None
    if kept is None or kept[0] != stamp:
        lending = p.waits.lending
        kept = p.lending_words[t.key] = (stamp, len(lending))
        lending.append(_lending_words(p, t))
    p.raw[job.id] = (_LENDING, t.index, 0, -(kept[1] + 1))


def _lending_words(p: Pass, t: Try) -> str:
    job, gt = t.job, t.gt
    tree = p.ledger.tree
    assert tree is not None
    left = max(0, p.ledger.capacity_total.get(gt, 0) - p.ledger.used[gt])
    top, count, total = tree.guard_summary(gt, job.team)  # `guarders`, summed
    names = [f"{'department' if tree.is_department(n) else 'team'} {n} ({k})"
             for n, k in top]
    if count > 3:
        names.append(f"{count - 3} more")
    guarded = min(left, total)
    return (f"{guarded} of the {left} {gt} GPUs left are guarded by "
            f"{', '.join(names) or 'other teams'} (their lending limits); team {job.team} "
            "may not borrow them (rule Q4)")
