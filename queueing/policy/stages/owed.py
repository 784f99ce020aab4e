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
    if held + t.total > quota.nominal:
        return 0
    return quota.nominal if _ancestors_within(p, t) else 0


def _ancestors_within(p: Pass, t: Try) -> bool:
    """Rule Q7: with the try, every department above its team stays within its nominal,
    counting per department what rule R11 counts for a team (GPUs held by tiers at or
    above the job's, the pass's admissions and victims included), each other child's
    subtree up to that child's nominal (`QuotaTree.within_guarantee`)."""
    tree = p.ledger.tree
    if tree is None:
        return True
    held_by_tier = _tier_held(p)
    rank, gt, team = t.job.tier_rank, t.gt, t.job.team
    key = (team, gt, rank, t.total)
    # Only a move under the team's top-level node changes the answer.
    stamp = p.owed_moves_under.get(tree.path(team)[-1], 0)
    seen = p.q7_seen.get(key)
    if seen is not None and seen[0] == stamp:
        return seen[1]

    def held(node: str) -> int:
        by_tier = held_by_tier.get((node, gt))
        return sum(g for r, g in by_tier.items() if r >= rank) if by_tier else 0

    ok = tree.within_guarantee(team, gt, t.total, held) >= len(tree.path(team))
    p.q7_seen[key] = (stamp, ok)
    return ok


def _tier_held(p: Pass) -> dict[tuple[str, str], dict[int, int]]:
    """Per (team, GPU type), GPUs held per tier rank now in the pass: the snapshot's
    running jobs but the victims taken (`ws.removed`: no search is under way when this
    is asked), plus the pass's admissions and preemptors so far (`owed_log`)."""
    held = p.tier_held
    if held is None:
        # One flat count first (this reads every running job once), then grouped.
        flat: dict[tuple[str, str, int], int] = {}
        get, removed = flat.get, p.ws.removed
        for r in p.snapshot.running:
            key = (r.team, r.gpu_type, r.tier_rank)
            flat[key] = get(key, 0) + (0 if r.id in removed
                                       else r.gpus_per_replica * r.replicas)
        for team, gpu_type, rank, gpus in p.owed_log:
            key = (team, gpu_type, rank)
            flat[key] = get(key, 0) + gpus
        p.owed_log.clear()
        held = p.tier_held = {}
        for (team, gpu_type, rank), gpus in flat.items():
            held.setdefault((team, gpu_type), {})[rank] = gpus
    return held


def owed_move(p: Pass, team: str, gpu_type: str, tier_rank: int, gpus: int) -> None:
    """Rule R11's count of what a pass admits (`gpus` > 0) or takes as a victim (< 0).
    Before the count is built a victim needs no entry: it is in `ws.removed` by then."""
    if not p.owed_on:
        return
    tree = p.ledger.tree
    if tree is not None:
        top = tree.path(team)[-1]
        p.owed_moves_under[top] = p.owed_moves_under.get(top, 0) + 1
    held = p.tier_held
    if held is None:
        if gpus > 0:
            p.owed_log.append((team, gpu_type, tier_rank, gpus))
        return
    by_tier = held.setdefault((team, gpu_type), {})
    by_tier[tier_rank] = by_tier.get(tier_rank, 0) + gpus


# False: every owed claim's search runs, the reference the tests hold `may_find` to.
_BOUND = True


def may_find(p: Pass, t: Try) -> bool:
    """Could an owed claim's victim search (rule R11) succeed at all? Its candidates are
    its team's lower-tier jobs (rule R1) and jobs of teams that borrow beyond their
    nominal (rules R1, R2, Q2): False when there are none, or when they and every free
    GPU of the type together are fewer than the job's GPUs - then `find_victims` finds
    nothing, and the search is skipped (a pass may hold many owed claims, of many teams
    and shapes, on a full cluster nobody borrows in: each search reads every running job
    of the type)."""
    if not _BOUND:
        return True
    job, gt = t.job, t.gt
    by_tier = _tier_held(p).get(t.key)
    own_lower = sum(g for r, g in by_tier.items() if r < job.tier_rank) if by_tier else 0
    borrowed = _borrowed(p, gt)
    borrowed_total = borrowed[1] - borrowed[2].get(job.team, 0)
    if own_lower <= 0 and borrowed_total <= 0:
        return False
    cap = p.cap
    free = sum(cap.pool_free[q] for q in cap.pools_of_type.get(gt, ()))
    return own_lower + borrowed_total + free >= t.total


# False: `_borrowed` is summed again over every team after each preemption, the
# reference the tests hold the count kept per team (`_borrowed_kept`) to.
_KEPT = True


def _borrowed(p: Pass, gpu_type: str) -> tuple[int, int, dict[str, int]]:
    """(stamp, GPUs held by teams borrowing beyond their nominal, those teams' GPUs) of
    `gpu_type`, from the running jobs but the victims taken; kept until the pass takes
    victims again (`len(p.preemptions)`: what running jobs hold changes only then)."""
    if _KEPT and p.ledger.running_tree is None:
        return _borrowed_kept(p, gpu_type)
    stamp = len(p.preemptions)
    seen = p.borrowed.get(gpu_type)
    if seen is None or seen[0] != stamp:
        quota, tree = p.snapshot.quota, p.ledger.running_tree
        if tree is None:
            teams = {team: held for (team, gt), held in p.ledger.running_held.items()
                     if gt == gpu_type and held > quota(team, gt).nominal}
        else:  # rule Q6: a team is a source while some node on its path borrows
            flags: dict[str, bool] = {}  # per node: its departments are on many paths

            def source(team: str) -> bool:
                for n in tree.path(team):
                    got = flags.get(n)
                    if got is None:
                        got = flags[n] = tree.borrowing(n, gpu_type)
                    if got:
                        return True
                return False

            teams = {team: held for (team, gt), held in p.ledger.running_held.items()
                     if gt == gpu_type and held > 0 and source(team)}
        seen = p.borrowed[gpu_type] = (stamp, sum(teams.values()), teams)
    return seen


def _borrowed_kept(p: Pass, gpu_type: str) -> tuple[int, int, dict[str, int]]:
    """`_borrowed` in a flat forest (rule R2: a team is a source while it borrows itself),
    kept for the pass and read again only for the teams whose running jobs moved since
    the last call (`Ledger.running_moves`; its length is the stamp): a preemption moves
    one or two teams, the sum over every team is made once."""
    ledger, quota = p.ledger, p.snapshot.quota
    moves = ledger.running_moves
    seen = p.borrowed.get(gpu_type)
    if seen is None:
        teams = {team: held for (team, gt), held in ledger.running_held.items()
                 if gt == gpu_type and held > quota(team, gt).nominal}
        seen = p.borrowed[gpu_type] = (len(moves), sum(teams.values()), teams)
    elif seen[0] != len(moves):
        at, total, teams = seen
        held_of = ledger.running_held
        for team in {t for t, gt in moves[at:] if gt == gpu_type}:
            total -= teams.pop(team, 0)
            held = held_of[(team, gpu_type)]
            if held > quota(team, gpu_type).nominal:
                teams[team] = held
                total += held
        seen = p.borrowed[gpu_type] = (len(moves), total, teams)
    return seen
