"""The reports page (docs/dashboard.md, "Reports"): allocated, used, idle, preempted and
spot GPU-hours and cost per team over time, and this month's budgets. Team members see their
teams; staff every team."""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime, time
from decimal import Decimal
from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from accounts.selectors import teams_for_user_by_slug
from queueing.policy.costs import money
from queueing.selectors.budgets import budget_statuses
from queueing.selectors.costs import CostBucket, currency
from queueing.selectors.reports import (
    default_period,
    default_range,
    first_usage_day,
    report_buckets,
)

# A range starts at the first day with GPU time when that is later (default_range).
PERIODS = {"month": "By month, the last 12 months", "day": "By day, the last 30 days"}
TOP_TEAMS = 8  # cost lines drawn; the rest are summed as "others"


@require_GET
@login_required
def reports_page(request: HttpRequest) -> HttpResponse:
    period = request.GET.get("period") or ""
    visible = list(teams_for_user_by_slug(user=request.user))
    wanted = request.GET.get("team") or ""
    errors = []
    if period and period not in PERIODS:
        errors.append(f"Unknown period {period!r}: month or day.")
        period = ""
    teams = visible
    if wanted:
        teams = [t for t in visible if t.slug == wanted]
        if not teams:  # not a team of the user, or none: the same words
            errors.append(f"No team {wanted!r} among yours.")
            teams, wanted = visible, ""
    now = timezone.now()
    today = now.astimezone(UTC).date()
    first = first_usage_day(teams=teams, now=now)
    period = period or default_period(first=first, today=today)
    start, end = default_range(period=period, today=today, first=first)
    report = report_buckets(teams=teams, start=start, end=end, period=period, now=now)
    ctx: dict[str, Any] = {
        "period": period, "periods": PERIODS, "teams": visible, "team": wanted,
        "errors": errors, "currency": currency(), "start": start, "end": end,
        "from_first": start != default_range(period=period, today=today)[0],
        "totals": _totals(report.buckets),
        "chart": _chart(report.buckets, start=start, end=end, period=period),
        "budgets": budget_statuses(now=now, teams=teams),
        "csv_from": datetime.combine(start, time(0), tzinfo=UTC).isoformat(),
        "csv_to": datetime.combine(end, time(0), tzinfo=UTC).isoformat(),
    }
    return render(request, "web/reports.html", ctx, status=400 if errors else 200)


def _totals(buckets: list[CostBucket]) -> list[dict[str, Any]]:
    """Per team over the whole range, most expensive first."""
    acc: dict[str, dict[str, Any]] = {}
    for b in buckets:
        t = acc.setdefault(b.team, {"team": b.team, "department": b.department,
                                    "allocated": 0.0, "used": 0.0, "idle": 0.0,
                                    "preempted": 0.0, "cost": Decimal(0),
                                    "idle_cost": Decimal(0), "spot": 0.0,
                                    "spot_cost": Decimal(0), "lost": 0.0})
        t["allocated"] += b.allocated_gpu_hours
        t["used"] += b.used_gpu_hours
        t["idle"] += b.idle_gpu_hours
        t["preempted"] += b.preempted_gpu_hours
        t["cost"] += b.cost
        t["idle_cost"] += b.idle_cost
        t["spot"] += b.spot_gpu_hours  # rule C4: spot time apart
        t["spot_cost"] += b.spot_cost
        t["lost"] += b.lost_gpu_hours  # preemptions' lost work (from checkpoints)
    rows = sorted(acc.values(), key=lambda t: (-t["cost"], -t["allocated"], t["team"]))
    for t in rows:
        t["cost"], t["idle_cost"] = money(t["cost"]), money(t["idle_cost"])
        t["spot_cost"] = money(t["spot_cost"])
        t["efficiency"] = t["used"] / t["allocated"] * 100 if t["allocated"] else None
    return rows


def _periods(start: Any, end: Any, period: str) -> list[Any]:
    out = []
    d = start
    while d < end:
        out.append(d)
        if period == "day":
            d = d.fromordinal(d.toordinal() + 1)
        else:
            d = d.replace(year=d.year + 1, month=1) if d.month == 12 else d.replace(month=d.month + 1)
    return out


def _chart(buckets: list[CostBucket], *, start: Any, end: Any, period: str) -> dict[str, Any]:
    """uPlot's columns: the periods (Unix seconds), GPU-hours by kind (all shown teams
    summed) and cost per team (the TOP_TEAMS most expensive, the rest as "others")."""
    periods = _periods(start if period == "day" else start.replace(day=1), end, period)
    index = {p: i for i, p in enumerate(periods)}
    kinds: dict[str, list[float]] = {k: [0.0] * len(periods)
                                     for k in ("allocated", "used", "idle", "preempted")}
    cost: dict[str, list[float]] = defaultdict(lambda: [0.0] * len(periods))
    spend: dict[str, Decimal] = defaultdict(Decimal)
    for b in buckets:
        i = index.get(b.period)
        if i is None:
            continue
        kinds["allocated"][i] += b.allocated_gpu_hours
        kinds["used"][i] += b.used_gpu_hours
        kinds["idle"][i] += b.idle_gpu_hours
        kinds["preempted"][i] += b.preempted_gpu_hours
        cost[b.team][i] += float(b.cost)
        spend[b.team] += b.cost
    top = sorted(spend, key=lambda t: (-spend[t], t))[:TOP_TEAMS]
    series = {t: [round(v, 2) for v in cost[t]] for t in sorted(top)}
    rest = [t for t in cost if t not in top]
    if rest:
        series["others"] = [round(sum(cost[t][i] for t in rest), 2) for i in range(len(periods))]
    return {
        "t": [int(datetime.combine(p, time(0), tzinfo=UTC).timestamp()) for p in periods],
        "hours": {k: [round(v, 2) for v in vals] for k, vals in kinds.items()},
        "cost": series,
    }
