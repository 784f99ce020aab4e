"""Time-decayed hierarchical fair-share (docs/scheduling.md, rules F1-F6).

Usage decays continuously: a GPU-second used `age` ago weighs 2^(-age / H). The decayed
integral of a constant rate over an interval has a closed form, so usage is exact (no
sampling) and a per-team accumulator (value, as_of) can be moved forward in O(1).
Standings cost O(teams + running attempts) whatever the length of the history.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

SECONDS_PER_HOUR = 3600.0


def decay_factor(seconds: float, half_life_hours: float) -> float:
    """2^(-seconds / H): what one unit of usage is worth `seconds` later (rule F1)."""
    return math.exp2(-seconds / (half_life_hours * SECONDS_PER_HOUR))


def decayed_interval_usage(
    *, rate: float, start: datetime, end: datetime, as_of: datetime, half_life_hours: float
) -> float:
    """Rule F1: ∫ rate · 2^(-(as_of - t)/H) dt over [start, end], in rate-hours.

    `rate` is weighted GPUs (GPUs × billing weight). Closed form:
    rate · H/ln2 · (2^(-(as_of-end)/H) - 2^(-(as_of-start)/H)). `end` may be after `as_of`
    (the exponent then grows past 1): callers move as_of forward first.
    """
    if end <= start or rate == 0:
        return 0.0
    h = half_life_hours
    age_end = (as_of - end).total_seconds() / SECONDS_PER_HOUR
    duration = (end - start).total_seconds() / SECONDS_PER_HOUR
    # The same closed form, as 2^(-age_end/H) · (1 - 2^(-duration/H)) with expm1: no
    # cancellation for intervals much shorter than H.
    return rate * h / math.log(2) * math.exp2(-age_end / h) * -math.expm1(
        -duration * math.log(2) / h
    )


@dataclass(frozen=True, slots=True)
class Accumulator:
    """A team's decayed usage `value` (weighted GPU-hours) as it stood at `as_of`."""

    value: float
    as_of: datetime

    def at(self, when: datetime, half_life_hours: float) -> float:
        """The value decayed (or, for an earlier instant, un-decayed) to `when`."""
        return self.value * decay_factor((when - self.as_of).total_seconds(), half_life_hours)

    def add_interval(
        self, *, rate: float, start: datetime, end: datetime, half_life_hours: float
    ) -> Accumulator:
        """The accumulator with one finished interval of usage added (rule F1).

        as_of moves to max(as_of, end) so the result never refers to the future of its
        own data; adding intervals in any order gives the same value up to rounding.
        """
        as_of = max(self.as_of, end)
        value = self.at(as_of, half_life_hours) + decayed_interval_usage(
            rate=rate, start=start, end=end, as_of=as_of, half_life_hours=half_life_hours
        )
        return Accumulator(value=value, as_of=as_of)

    def merge(self, other: Accumulator, half_life_hours: float) -> Accumulator:
        """The sum of two accumulators (rule F1), as of the later of their instants."""
        as_of = max(self.as_of, other.as_of)
        return Accumulator(
            value=self.at(as_of, half_life_hours) + other.at(as_of, half_life_hours),
            as_of=as_of,
        )


def entry_penalty_gpu_hours(gpus: float, billing_weight: float,
                            interval_seconds: float) -> float:
    """Rule F6: the weighted GPU-hours one admission charges at once, as if the job had
    run for one recompute interval: GPUs × billing weight × interval (in hours).

    Undecayed: over one interval (seconds) the decay changes the value by less than
    interval/H, far below anything that reorders teams.
    """
    if gpus <= 0 or billing_weight <= 0 or interval_seconds <= 0:
        return 0.0
    return gpus * billing_weight * interval_seconds / SECONDS_PER_HOUR


@dataclass(frozen=True, slots=True)
class TeamUsageInput:
    """One team's input to the standings: weight, banked usage and its running work."""

    team: str
    weight: float
    accumulator: Accumulator
    # Open intervals: (weighted GPUs, start) of attempts running now; they count up to now.
    running: tuple[tuple[float, datetime], ...] = ()
    parent: str | None = None
    # Rule F2: only active teams share the cluster. A team with usage is always active;
    # callers also mark teams with queued or admitted work (see docs).
    active: bool = True


@dataclass(frozen=True, slots=True)
class Standing:
    """One team's line of the standings (what `sshare` prints).

    For a team with a parent (rule F4), `usage` is the decayed usage of its whole subtree
    (its own and its descendants'), `share` the normalized share down the tree and
    `normalized_usage` the effective usage; for flat teams these are exactly F1-F3.
    """

    team: str
    parent: str | None
    weight: float
    share: float  # S, rules F2/F4
    usage: float  # decayed weighted GPU-hours, rule F1 (of the subtree, rule F4)
    normalized_usage: float  # U, rule F2 (effective usage U_E under a parent, rule F4)
    factor: float  # F, rule F3
    # Rule F4: weight / Σ weights of the active siblings (None: equal to `share`, flat).
    level_share: float | None = None
    # Rule F4: usage / Σ usage of all teams (None: equal to `normalized_usage`, flat).
    usage_fraction: float | None = None
    active: bool = True


def fair_share_factor(normalized_usage: float, share: float) -> float:
    """Rule F3: F = 2^(-U/S), 1.0 for no usage, 0.5 at U = S, towards 0 above it.

    Always in (0, 1]: where 2^(-U/S) underflows (a tiny share far over-used) F is the
    smallest positive float, so such a team still ranks, last.
    """
    if normalized_usage <= 0:
        return 1.0
    if share <= 0:
        return sys.float_info.min
    return max(math.exp2(-normalized_usage / share), sys.float_info.min)


def team_usage_at(item: TeamUsageInput, now: datetime, half_life_hours: float) -> float:
    """Rule F1 for one team at `now`: banked usage decayed to now plus running work."""
    total = item.accumulator.at(now, half_life_hours)
    for rate, start in item.running:
        total += decayed_interval_usage(
            rate=rate, start=start, end=now, as_of=now, half_life_hours=half_life_hours
        )
    return total


def hierarchy_cycles(parent: Mapping[str, str | None]) -> frozenset[str]:
    """Rule F4: the teams whose chain of parents comes back to themselves (a team its own
    parent, A -> B -> A, ...). Teams below a cycle are not on it. O(teams)."""
    on_cycle: set[str] = set()
    done: set[str] = set()
    for start in parent:
        path: list[str] = []
        index: dict[str, int] = {}
        t: str | None = start
        while t is not None and t in parent and t not in done:
            if t in index:  # came back to a team of this walk: the rest of it is a cycle
                on_cycle.update(path[index[t]:])
                break
            index[t] = len(path)
            path.append(t)
            t = parent[t]
        done.update(path)
    return frozenset(on_cycle)


def forest_parents(parent: Mapping[str, str | None]) -> dict[str, str | None]:
    """Rule F4 made safe: each team's parent, or None for a team whose parent the input
    does not know or which is on a cycle (`hierarchy_cycles`). A cycle only comes from a
    write that skipped `Team.clean()`; its teams then count as top-level (flat), those
    below it keep their place, whatever the input order, and no walk up the result loops.
    """
    cycles = hierarchy_cycles(parent)
    return {t: p if p is not None and p in parent and t not in cycles else None
            for t, p in parent.items()}


class _Tree:
    """The team forest of rule F4: parents, children, subtree usage, level shares.

    A parent the input does not know, or a team on a parent cycle, makes the team a
    top-level one (`forest_parents`: the standings never loop and never lose a team).
    """

    __slots__ = ("_ue", "active", "ancestors", "level_share", "share", "subtree", "total")

    def __init__(
        self,
        parent: Mapping[str, str | None],
        weight: Mapping[str, float],
        usage: Mapping[str, float],
        active: Mapping[str, bool],
    ) -> None:
        teams = list(parent)
        par = forest_parents(parent)
        self.ancestors: dict[str, tuple[str, ...]] = {}
        for t in teams:
            chain: list[str] = []
            p = par[t]
            while p is not None:
                chain.append(p)
                p = par[p]
            self.ancestors[t] = tuple(chain)  # nearest first
        self.subtree: dict[str, float] = {t: max(0.0, usage.get(t, 0.0)) for t in teams}
        is_active = {t: bool(active.get(t, True)) or self.subtree[t] > 0 for t in teams}
        for t in teams:
            for a in self.ancestors[t]:
                self.subtree[a] += max(0.0, usage.get(t, 0.0))
                if is_active[t]:
                    is_active[a] = True
        self.total = sum(max(0.0, usage.get(t, 0.0)) for t in teams)
        siblings: dict[str | None, float] = {}
        for t in teams:
            if is_active[t]:
                siblings[par[t]] = siblings.get(par[t], 0.0) + weight[t]
        self.level_share: dict[str, float] = {}
        for t in teams:
            level = siblings.get(par[t], 0.0) + (0.0 if is_active[t] else weight[t])
            self.level_share[t] = weight[t] / level if level > 0 else 0.0
        self.active = is_active
        # Top-down (parents before children), so each team reads its parent's values.
        self.share: dict[str, float] = {}
        self._ue: dict[str, float] = {}
        total = self.total
        for t in sorted(teams, key=lambda t: len(self.ancestors[t])):
            ua = self.subtree[t] / total if total > 0 else 0.0
            p = par[t]
            if p is None:
                self.share[t] = self.level_share[t]
                self._ue[t] = ua
            else:
                self.share[t] = self.level_share[t] * self.share[p]
                self._ue[t] = ua + (self._ue[p] - ua) * self.level_share[t]

    def usage_fraction(self, team: str) -> float:
        return self.subtree.get(team, 0.0) / self.total if self.total > 0 else 0.0

    def effective_usage(self, team: str) -> float:
        """Rule F4 (Slurm's classic formula): U_E = U_A for a top-level team, else
        U_E = U_A + (U_E(parent) - U_A) × s (s: the team's level share)."""
        return self._ue[team]

    def factor(self, team: str) -> float:
        return fair_share_factor(self.effective_usage(team), self.share[team])


def compute_standings(
    teams: Iterable[TeamUsageInput],
    *,
    now: datetime,
    half_life_hours: float,
    extra_usage: Mapping[str, float] | None = None,
) -> dict[str, Standing]:
    """Rules F1-F4: usage, normalized usage U, share S and factor F of every team.

    Flat teams (no parent) give exactly rules F1-F3; under a parent, shares and usage
    follow rule F4. `extra_usage` adds weighted GPU-hours per team on top of the decayed
    usage (the entry penalty of rule F6). O(teams × depth + running attempts).
    """
    items = list(teams)
    usage = {t.team: team_usage_at(t, now, half_life_hours) for t in items}
    for team, extra in (extra_usage or {}).items():
        if team in usage:
            usage[team] += extra
    tree = _Tree(
        parent={t.team: t.parent for t in items},
        weight={t.team: t.weight for t in items},
        usage=usage,
        active={t.team: t.active for t in items},
    )
    out: dict[str, Standing] = {}
    for t in items:
        ue = tree.effective_usage(t.team)
        parent = tree.ancestors[t.team][0] if tree.ancestors[t.team] else None
        out[t.team] = Standing(
            team=t.team,
            parent=parent,
            weight=t.weight,
            share=tree.share[t.team],
            usage=tree.subtree[t.team],
            normalized_usage=ue,
            factor=fair_share_factor(ue, tree.share[t.team]),
            level_share=tree.level_share[t.team],
            usage_fraction=tree.usage_fraction(t.team),
            active=tree.active[t.team],
        )
    return out


class FairShareState:
    """The standings of one scheduling pass, for ordering (rules F3, F4, F6).

    `factor(team)` is always current: `charge(team, gpu_hours)` adds usage (the entry
    penalty of rule F6) to the team and its ancestors, and every later `factor` call sees
    the new totals. Copy it per pass; the snapshot's instance is never changed.
    `factor` costs O(depth of the team in the tree), `charge` the same.
    """

    __slots__ = ("_ancestors", "_level", "_share", "_subtree", "_total")

    def __init__(
        self,
        usage: Mapping[str, float],
        share: Mapping[str, float],
        *,
        parent: Mapping[str, str | None] | None = None,
        level_share: Mapping[str, float] | None = None,
    ) -> None:
        """`usage`: decayed usage per team (of its subtree when it has children);
        `share`: S per team; `parent` and `level_share` (rule F4) default to flat."""
        self._subtree = dict(usage)
        self._share = dict(share)
        self._level = dict(level_share) if level_share is not None else dict(share)
        parents = forest_parents({t: (parent or {}).get(t) for t in self._share})
        self._ancestors: dict[str, tuple[str, ...]] = {}
        for team in self._share:
            chain: list[str] = []
            p = parents[team]
            while p is not None:
                chain.append(p)
                p = parents[p]
            self._ancestors[team] = tuple(chain)
        self._total = sum(v for t, v in self._subtree.items() if not self._ancestors.get(t))

    @classmethod
    def from_standings(cls, standings: Mapping[str, Standing]) -> FairShareState:
        return cls(
            {t: s.usage for t, s in standings.items()},
            {t: s.share for t, s in standings.items()},
            parent={t: s.parent for t, s in standings.items()},
            level_share={
                t: s.share if s.level_share is None else s.level_share
                for t, s in standings.items()
            },
        )

    def copy(self) -> FairShareState:
        new = FairShareState.__new__(FairShareState)
        new._subtree = dict(self._subtree)
        new._share = self._share  # never mutated
        new._level = self._level
        new._ancestors = self._ancestors
        new._total = self._total
        return new

    def usage(self, team: str) -> float:
        """Decayed usage of `team` (and its subtree) including charges so far."""
        return self._subtree.get(team, 0.0)

    def factor(self, team: str) -> float:
        """F of `team` now (1.0 for a team the standings do not know)."""
        if team not in self._share:
            return 1.0
        total = self._total
        ue = 0.0
        for i, t in enumerate((*reversed(self._ancestors[team]), team)):
            ua = self._subtree.get(t, 0.0) / total if total > 0 else 0.0
            ue = ua if i == 0 else ua + (ue - ua) * self._level[t]
        return fair_share_factor(ue, self._share[team])

    def charge(self, team: str, gpu_hours: float) -> None:
        """Rule F6: count `gpu_hours` of weighted usage for `team` at once."""
        self._subtree[team] = self._subtree.get(team, 0.0) + gpu_hours
        for a in self._ancestors.get(team, ()):
            self._subtree[a] = self._subtree.get(a, 0.0) + gpu_hours
        self._total += gpu_hours
