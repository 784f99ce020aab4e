"""`{% load fairq_costs %}{% team_budget_notice team %}`: the team page's budget notice
(rules B1-B3), shown from 80% of the month's budget on."""

from __future__ import annotations

from typing import Any

from django import template
from django.utils import timezone

from queueing.selectors.budgets import team_budget_status

register = template.Library()


@register.inclusion_tag("web/_budget_notice.html")
def team_budget_notice(team: Any) -> dict[str, Any]:
    status = team_budget_status(team=team, now=timezone.now())
    return {"budget": status if status is not None and status.reached else None}
