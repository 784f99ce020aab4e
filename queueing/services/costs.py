"""Cost writes (docs/scheduling.md, rules C1 and B1-B3): GPU prices and team budgets
(staff only, audited), and the budget check that gives the 80% and 100% warnings once
each per team and month."""

from __future__ import annotations

import logging
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from django.db import IntegrityError, transaction

from accounts.models import Team
from accounts.services import audit_record, audited_upsert, model_changes
from queueing.errors import DomainError
from queueing.models import BudgetPolicy, BudgetWarning, GpuPrice, GpuType, TeamBudget
from queueing.selectors.budgets import WARNING_LEVELS, budget_statuses

from .access import check_staff

log = logging.getLogger(__name__)


@transaction.atomic
def gpu_price_set(*, actor: Any, gpu_type: GpuType, effective_from: date,
                  price_per_gpu_hour: Decimal) -> tuple[GpuPrice, bool]:
    """Rule C1: the price of `gpu_type` from `effective_from` (a UTC day) on, created or
    changed (one price per type and day), audited. Returns (price, created). Staff only."""
    check_staff(actor=actor, doing="set GPU prices")
    if price_per_gpu_hour < 0:
        raise DomainError("Invalid fields.",
                          fields={"price_per_gpu_hour": ["Must be 0 or more."]})
    return audited_upsert(actor=actor, model=GpuPrice,
                          lookup={"gpu_type": gpu_type, "effective_from": effective_from},
                          values={"price_per_gpu_hour": price_per_gpu_hour})


@transaction.atomic
def gpu_price_delete(*, actor: Any, price: GpuPrice) -> None:
    """Remove a price (the one before it then runs on); audited. Staff only."""
    check_staff(actor=actor, doing="delete GPU prices")
    audit_record(actor=actor, action="delete", instance=price,
                 changes=model_changes(None, price))
    price.delete()


@transaction.atomic
def team_budget_set(*, actor: Any, team: Team, monthly_amount: Decimal,
                    policy: str = BudgetPolicy.NONE) -> tuple[TeamBudget, bool]:
    """Rules B1-B3: the monthly budget of `team` and its policy, created or changed,
    audited. Returns (budget, created). Staff only."""
    check_staff(actor=actor, doing="set team budgets")
    problems: dict[str, list[str]] = {}
    if monthly_amount <= 0:
        problems["monthly_amount"] = ["Must be more than 0."]
    if policy not in BudgetPolicy.values:
        problems["policy"] = [f"One of {', '.join(BudgetPolicy.values)}."]
    if problems:
        raise DomainError("Invalid fields.", fields=problems)
    return audited_upsert(actor=actor, model=TeamBudget, lookup={"team": team},
                          values={"monthly_amount": monthly_amount, "policy": policy})


@transaction.atomic
def team_budget_delete(*, actor: Any, budget: TeamBudget) -> None:
    check_staff(actor=actor, doing="delete team budgets")
    audit_record(actor=actor, action="delete", instance=budget,
                 changes=model_changes(None, budget))
    budget.delete()


def budgets_check(*, now: datetime) -> list[BudgetWarning]:
    """Rule B2: for every team whose cost this month has reached 80% or 100% of its
    budget, the warning of each level reached, given once per team, month and level:
    a BudgetWarning row and its audit entry in one transaction (a concurrent check
    loses the unique constraint and writes nothing). Returns the warnings given now."""
    given: list[BudgetWarning] = []
    for status in budget_statuses(now=now):
        for level in WARNING_LEVELS:
            if status.ratio * 100 < level or level in status.warned:
                continue
            try:
                with transaction.atomic():
                    warning = BudgetWarning.objects.create(
                        team=Team.objects.get(slug=status.team), month=status.month.date(),
                        level=level, at=now, cost=status.cost, budget=status.amount)
                    audit_record(actor=None, action="budget_warning", instance=warning,
                                 changes={"level": [None, level],
                                          "cost": [None, str(status.cost)],
                                          "budget": [None, str(status.amount)],
                                          "currency": [None, status.currency]})
            except IntegrityError:
                continue  # another check gave it first
            log.warning("team %s reached %d%% of its %s budget (%s of %s %s)", status.team,
                        level, status.month.strftime("%Y-%m"), status.cost, status.amount,
                        status.currency)
            given.append(warning)
    return given
