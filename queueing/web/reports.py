"""The reports page (docs/dashboard.md, "Reports"): allocated, used, idle, preempted and
spot GPU-hours and cost per team over time, and this month's budgets. Team members see their
teams; staff every team."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, time
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.http import require_GET

from accounts.selectors import team_switcher_teams
from queueing.policy.costs import money
from queueing.selectors.budgets import budget_statuses
from queueing.selectors.costs import currency
from queueing.selectors.reports import (
    ReportSummary,
    default_period,
    default_range,
    first_usage_day,
    report_summary,
)
from queueing.web.options import team_options

# A range starts at the first day with GPU time when that is later (default_range).
PERIODS = {"month": "By month, the last 12 months", "day": "By day, the last 30 days"}
TOP_TEAMS = 8  # cost lines drawn; the rest are summed as "others"
# Staff's table of every team is paged (docs/dashboard.md, "Reports"): its figures summed
# once per request, sorted by the column asked, one page rendered.
TEAMS_PER_PAGE = 50
SORTS = {"cost": "cost_sum", "team": "team", "allocated": "allocated", "used": "used",
         "efficiency": "efficiency", "idle": "idle", "preempted": "preempted",
         "lost": "lost", "spot": "spot"}
# The per-team table's columns: (sort key or "", heading, class, title).
COLUMNS = [
    ("team", "Team", "", ""), ("", "Department", "", ""),
    ("allocated", "Allocated GPU-h", "num", ""), ("used", "Used GPU-h", "num", ""),
    ("efficiency", "Efficiency", "num", ""), ("idle", "Idle GPU-h", "num", ""),
    ("preempted", "Preempted GPU-h", "num", ""),
    ("lost", "Lost GPU-h", "num", "The work preemptions lost: from each victim's newest "
     "checkpoint (or its start) to the preemption"),
    ("cost", "Cost", "num", ""), ("", "Idle cost", "num", ""),
    ("spot", "Spot GPU-h", "num", "Of the allocated GPU-hours and cost: attempts on spot "
     "nodes, at their pools' prices (rule C4)"),
    ("", "Spot cost", "num", ""),
]


@require_GET
@login_required
def reports_page(request: HttpRequest) -> HttpResponse:
    period = request.GET.get("period") or ""
    visible = team_switcher_teams(user=request.user)
    wanted = request.GET.get("team") or ""
    errors = []
    if period and period not in PERIODS:
        errors.append(f"Unknown period {period!r}: month or day.")
        period = ""
    sort = request.GET.get("sort") or "cost"
    if sort not in SORTS:
        errors.append(f"Unknown sort {sort!r}: one of {', '.join(SORTS)}.")
        sort = "cost"
    page_asked = request.GET.get("page") or "1"
    page = int(page_asked) if page_asked.isdigit() and int(page_asked) >= 1 else 0
    if not page:
        errors.append(f"Page {page_asked!r}: a whole number from 1.")
        page = 1
    teams = visible
    if wanted:
        teams = [t for t in visible if t.slug == wanted]
        if not teams:  # not a team of the user, or none: the same words
            errors.append(f"No team {wanted!r} among yours.")
            teams, wanted = visible, ""
    # Staff's every team: the selectors read them with no list of 1,000 ids.
    every = bool(request.user.is_staff) and teams is visible
    now = timezone.now()
    today = now.astimezone(UTC).date()
    first = first_usage_day(teams=teams, now=now, every_team=every)
    period = period or default_period(first=first, today=today)
    start, end = default_range(period=period, today=today, first=first)
    summary = report_summary(teams=teams, start=start, end=end, period=period, now=now,
                             every_team=every)
    totals = _totals(summary.totals.values())
    pages = max(1, -(-len(totals) // TEAMS_PER_PAGE))
    if page > pages:
        errors.append(f"Page {page}: there are {pages}.")
        page = pages
    rows = _sorted(totals, sort)[(page - 1) * TEAMS_PER_PAGE:page * TEAMS_PER_PAGE]
    # This month's budgets: of the page's teams when the table has pages (rule B1 prices
    # every attempt of the month of each team asked), else of every team shown.
    if pages > 1:
        on_page = {r["team"] for r in rows}
        budget_teams = [t for t in teams if t.slug in on_page]
    else:
        budget_teams = teams
    ctx: dict[str, Any] = {
        "period": period, "periods": PERIODS, "teams": visible, "team": wanted,
        "team_options": team_options([t.slug for t in visible], wanted),
        "errors": errors, "currency": currency(), "start": start, "end": end,
        "from_first": start != default_range(period=period, today=today)[0],
        "totals": rows,
        "all_teams": _all_teams(totals) if len(totals) > 1 else None,
        "teams_shown": len(totals), "sort": sort, "sorts": SORTS, "page": page,
        "pages": pages, "first_row": (page - 1) * TEAMS_PER_PAGE + 1,
        "last_row": min(page * TEAMS_PER_PAGE, len(totals)), "columns": COLUMNS,
        "query": urlencode([("period", period), *([("team", wanted)] if wanted else [])]),
        "chart": _chart(summary),
        "budgets": budget_statuses(now=now, teams=budget_teams),
        "csv_from": datetime.combine(start, time(0), tzinfo=UTC).isoformat(),
        "csv_to": datetime.combine(end, time(0), tzinfo=UTC).isoformat(),
    }
    return render(request, "web/reports.html", ctx, status=400 if errors else 200)


def _totals(sums: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per team over the whole range (`ReportSummary.totals`), most expensive first, each
    with its efficiency and its amounts to the cent."""
    rows = sorted(sums, key=lambda t: (-t["cost"], -t["allocated"], t["team"]))
    out = []
    for t in rows:
        t = dict(t)
        t["cost_sum"] = t["cost"]
        t["cost"], t["idle_cost"] = money(t["cost"]), money(t["idle_cost"])
        t["spot_cost"] = money(t["spot_cost"])
        t["efficiency"] = t["used"] / t["allocated"] * 100 if t["allocated"] else None
        out.append(t)
    return out


def _sorted(rows: list[dict[str, Any]], sort: str) -> list[dict[str, Any]]:
    """The per-team table in the order asked: by team slug, or by a figure, largest
    first (ties by cost, then team); `cost` is `_totals`' own order."""
    if sort == "cost":
        return rows
    if sort == "team":
        return sorted(rows, key=lambda t: t["team"])
    field = SORTS[sort]
    return sorted(rows, key=lambda t: (t[field] is None, -(t[field] or 0), -t["cost_sum"],
                                       t["team"]))


def _all_teams(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The table's total line: every team of the range summed (not only the page's)."""
    acc: dict[str, Any] = dict.fromkeys(("allocated", "used", "idle", "preempted", "spot",
                                         "lost"), 0.0)
    acc.update({k: Decimal(0) for k in ("cost", "idle_cost", "spot_cost")})
    for t in rows:
        for k in acc:
            acc[k] += t[k]
    acc["efficiency"] = acc["used"] / acc["allocated"] * 100 if acc["allocated"] else None
    for k in ("cost", "idle_cost", "spot_cost"):
        acc[k] = money(acc[k])
    return acc


def _chart(summary: ReportSummary) -> dict[str, Any]:
    """uPlot's columns: the periods (Unix seconds), GPU-hours by kind (all shown teams
    summed) and cost per team (the TOP_TEAMS most expensive, the rest as "others")."""
    periods, cost, spend = summary.periods, summary.cost, summary.spend
    top = sorted(spend, key=lambda t: (-spend[t], t))[:TOP_TEAMS]
    series = {t: [round(v, 2) for v in cost[t]] for t in sorted(top)}
    rest = [t for t in cost if t not in top]
    if rest:
        series["others"] = [round(sum(cost[t][i] for t in rest), 2) for i in range(len(periods))]
    return {
        "t": [int(datetime.combine(p, time(0), tzinfo=UTC).timestamp()) for p in periods],
        "hours": {k: [round(v, 2) for v in vals] for k, vals in summary.hours.items()},
        "cost": series,
    }
