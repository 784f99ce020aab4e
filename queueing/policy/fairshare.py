"""Time-decayed fair-share (docs/scheduling.md, rules F1-F3).

Usage decays continuously: a GPU-second used `age` ago weighs 2^(-age / H). The decayed
integral of a constant rate over an interval has a closed form, so usage is exact (no
sampling) and a per-team accumulator (value, as_of) can be moved forward in O(1).
"""

from __future__ import annotations

import math
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
    age_start = (as_of - start).total_seconds() / SECONDS_PER_HOUR
    return rate * h / math.log(2) * (math.exp2(-age_end / h) - math.exp2(-age_start / h))


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


@dataclass(frozen=True, slots=True)
class TeamUsageInput:
    """One team's input to the standings: weight, banked usage and its running work."""

    team: str
    weight: float
    accumulator: Accumulator
    # Open intervals: (weighted GPUs, start) of attempts running now; they count up to now.
    running: tuple[tuple[float, datetime], ...] = ()
    parent: str | None = None


@dataclass(frozen=True, slots=True)
class Standing:
    team: str
    parent: str | None
    weight: float
    share: float  # S, rule F2
    usage: float  # decayed weighted GPU-hours, rule F1
    normalized_usage: float  # U, rule F2
    factor: float  # F, rule F3


def fair_share_factor(normalized_usage: float, share: float) -> float:
    """Rule F3: F = 2^(-U/S), 1.0 for no usage, 0.5 at U = S, towards 0 above it."""
    if share <= 0:
        return 0.0
    return math.exp2(-normalized_usage / share)


def team_usage_at(item: TeamUsageInput, now: datetime, half_life_hours: float) -> float:
    """Rule F1 for one team at `now`: banked usage decayed to now plus running work."""
    total = item.accumulator.at(now, half_life_hours)
    for rate, start in item.running:
        total += decayed_interval_usage(
            rate=rate, start=start, end=now, as_of=now, half_life_hours=half_life_hours
        )
    return total


def compute_standings(
    teams: Iterable[TeamUsageInput],
    *,
    now: datetime,
    half_life_hours: float,
    extra_usage: Mapping[str, float] | None = None,
) -> dict[str, Standing]:
    """Rules F1-F3 for flat teams: usage, normalized usage U, share S and factor F.

    `extra_usage` adds weighted GPU-hours per team on top of the decayed usage (the
    entry penalty of rule F6 uses it). O(teams + running attempts).
    """
    items = list(teams)
    usage = {t.team: team_usage_at(t, now, half_life_hours) for t in items}
    for team, extra in (extra_usage or {}).items():
        if team in usage:
            usage[team] += extra
    total_usage = sum(usage.values())
    total_weight = sum(t.weight for t in items)
    out: dict[str, Standing] = {}
    for t in items:
        share = t.weight / total_weight if total_weight > 0 else 0.0
        norm = usage[t.team] / total_usage if total_usage > 0 else 0.0
        out[t.team] = Standing(
            team=t.team,
            parent=t.parent,
            weight=t.weight,
            share=share,
            usage=usage[t.team],
            normalized_usage=norm,
            factor=fair_share_factor(norm, share),
        )
    return out


class FairShareState:
    """The standings of one scheduling pass, for ordering (rules F3, F6).

    `factor(team)` is always current: `charge(team, gpu_hours)` adds usage (the entry
    penalty of rule F6) and every later `factor` call sees the new totals. Copy it per
    pass; the snapshot's instance is never changed.
    """

    __slots__ = ("_share", "_total", "_usage")

    def __init__(self, usage: Mapping[str, float], share: Mapping[str, float]) -> None:
        self._usage = dict(usage)
        self._share = dict(share)
        self._total = sum(self._usage.values())

    @classmethod
    def from_standings(cls, standings: Mapping[str, Standing]) -> FairShareState:
        return cls({t: s.usage for t, s in standings.items()},
                   {t: s.share for t, s in standings.items()})

    def copy(self) -> FairShareState:
        return FairShareState(self._usage, self._share)

    def factor(self, team: str) -> float:
        """F of `team` now (1.0 for a team the standings do not know)."""
        if team not in self._share:
            return 1.0
        norm = self._usage.get(team, 0.0) / self._total if self._total > 0 else 0.0
        return fair_share_factor(norm, self._share[team])

    def charge(self, team: str, gpu_hours: float) -> None:
        """Rule F6: count `gpu_hours` of weighted usage for `team` at once."""
        self._usage[team] = self._usage.get(team, 0.0) + gpu_hours
        self._total += gpu_hours
