"""The demo's reports in a real browser, right after `seed_demo` (README.md: they "show
something at once"): days with GPU time, every team's cost and efficiency, the budgets.
Screenshots: test-artifacts/screenshots/demo-reports.png (admin, every team) and
demo-reports-nlp.png (bob, team nlp: its budget past 80%)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.utils import timezone

from queueing.services.demo import (
    DEMO_PASSWORD,
    demo_clusters_seed,
    demo_history_seed,
    demo_seed,
)

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_the_demos_reports_page_shows_days_of_cost_and_efficiency_for_every_team(
        page: Any, shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    demo_seed()
    demo_clusters_seed()
    demo_history_seed(now=timezone.now())
    login(page, "admin", DEMO_PASSWORD)
    page.goto("/reports/")
    expect(page.locator("#r-period")).to_have_value("day")
    expect(page.get_by_text("from the first day with GPU time")).to_be_visible()
    # Both charts drawn (uPlot's canvases), with a legend line per kind and per team.
    expect(page.locator("#hours-chart canvas")).to_have_count(1)
    expect(page.locator("#cost-chart canvas")).to_have_count(1)
    for team in ("nlp", "recsys", "speech", "vision"):
        expect(page.locator("#cost-chart .u-legend")).to_contain_text(team)
    table = page.locator("#totals-h + div table")
    for team in ("vision", "nlp", "speech", "recsys"):
        cells = table.locator("tbody tr", has_text=team).first.locator("td")
        efficiency = cells.nth(4).inner_text()
        cost = cells.nth(8).inner_text()  # after the preempted and lost GPU-hours
        assert re.fullmatch(r"\d+%", efficiency) and int(efficiency[:-1]) >= 20, (
            team, efficiency)
        assert float(cost) > 100, (team, cost)
    budgets = page.locator("#budgets-h + div table")
    expect(budgets.locator("tr", has_text="nlp")).to_contain_text("downgrade")
    expect(budgets.locator("tr", has_text="vision")).to_contain_text("12000.00")
    shoot(page, "demo-reports")

    # A team admin's view: their team only, and its budget notice (rule B2, 80%).
    page.context.clear_cookies()
    login(page, "bob", DEMO_PASSWORD)
    page.goto("/reports/")
    expect(page.get_by_role("status")).to_contain_text("Team nlp has used")
    expect(page.locator("#totals-h + div table tbody tr")).to_have_count(1)
    shoot(page, "demo-reports-nlp")
