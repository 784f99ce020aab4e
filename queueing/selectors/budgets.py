"""Reads of team budgets (docs/scheduling.md, rules B1-B3): this month's cost against the
monthly amount, for the team page, /metrics, the budget check and the submit rule."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal

from django.db.models import Q

from accounts.models import Team
from queueing.models import BudgetPolicy, BudgetWarning, TeamBudget, Tier
from queueing.policy.costs import money
from queueing.selectors.costs import cost_buckets, currency, month_range

WARNING_LEVELS = (80, 100)  # rule B2, percent of the monthly amount


@dataclass(frozen=True)
class BudgetStatus:
    team: str
    month: datetime  # the first instant of the UTC month
    amount: Decimal
    cost: Decimal  # this month so far (rule B1), to the cent
    policy: str
    currency: str
    warned: tuple[int, ...]  # rule B2's levels already given this month

    @property
    def ratio(self) -> float:
        return float(self.cost / self.amount) if self.amount > 0 else 0.0

    @property
    def reached(self) -> int | None:
        """The highest warning level reached (80 or 100), None below 80%."""
        hit = [lv for lv in WARNING_LEVELS if self.ratio * 100 >= lv]
        return hit[-1] if hit else None

    @property
    def over(self) -> bool:
        return self.ratio >= 1.0


def budget_statuses(*, now: datetime, teams: Iterable[Team] | None = None) -> list[BudgetStatus]:
    """Rule B1 for every team with a budget (of `teams`, when given), by team slug:
    the cost of the UTC month of `now` up to `now`. One cost pass for all of them."""
    budgets = TeamBudget.objects.select_related("team").order_by("team__slug")
    if teams is not None:
        budgets = budgets.filter(team__in=list(teams))
    rows = list(budgets)
    if not rows:
        return []
    start, _ = month_range(now.astimezone(UTC).date())
    spent: dict[str, Decimal] = defaultdict(Decimal)
    for b in cost_buckets(teams=[r.team for r in rows], start=start, end=now, period="month",
                          now=now):
        spent[b.team] += b.cost
    warned: dict[int, list[int]] = defaultdict(list)
    for team_id, level in BudgetWarning.objects.filter(
            team__in=[r.team for r in rows], month=start.date()).values_list("team_id", "level"):
        warned[team_id].append(level)
    return [
        BudgetStatus(team=r.team.slug, month=start, amount=r.monthly_amount,
                     cost=money(spent[r.team.slug]), policy=r.policy, currency=currency(),
                     warned=tuple(sorted(warned[r.team_id])))
        for r in rows
    ]


def team_budget_status(*, team: Team, now: datetime) -> BudgetStatus | None:
    found = budget_statuses(now=now, teams=[team])
    return found[0] if found else None


def budget_downgrade_tier(*, team: Team, tier: Tier, now: datetime) -> Tier | None:
    """Rule B3: the tier a new job of `team` asking for `tier` drops to — the lowest-ranked
    tier the team may use — when the team's budget has the downgrade policy and this
    month's cost has reached it; None when the job keeps its tier. Costs nothing for
    teams without such a budget (one query; none when `team` carries
    `has_downgrade_budget`, as `lookups.team_for_submitter` reads it)."""
    known = getattr(team, "has_downgrade_budget", None)
    if known is False or (known is None and not TeamBudget.objects.filter(
            team=team, policy=BudgetPolicy.DOWNGRADE).exists()):
        return None
    status = team_budget_status(team=team, now=now)
    if status is None or not status.over:
        return None
    lowest = (Tier.objects.filter(Q(open_to_all_teams=True) | Q(grants__team=team))
              .order_by("rank", "id").first())
    if lowest is None or lowest.rank >= tier.rank:
        return None
    return lowest


def team_budget_by_slug(*, slug: str) -> TeamBudget | None:
    """The budget of the team with this slug; None without one."""
    return TeamBudget.objects.filter(team__slug=slug).first()
