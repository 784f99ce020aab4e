"""Staff's reports page in a real browser with more teams than one page holds: the
per-team table shows 50 rows, a total line over every team, a pager and sortable
headings (docs/dashboard.md, "Reports"). Screenshots: test-artifacts/screenshots/
reports-paged-1.png, reports-paged-2.png."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from queueing.models import GpuPrice
from tests.accounting.history import finished_attempt
from tests.accounting.history import job as history_job
from tests.conftest import World
from tests.factories import TeamFactory

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@transaction.atomic  # (charging locks the team's accumulator)
def _history(world: World) -> None:
    """57 teams, team tNN with NN + 1 GPU-hours on A100s at 2.00 three days ago."""
    GpuPrice.objects.create(gpu_type=world.a100, effective_from=date(2020, 1, 1),
                            price_per_gpu_hour=Decimal("2.00"))
    day = (timezone.now().astimezone(UTC) - timedelta(days=3)).replace(
        hour=8, minute=0, second=0, microsecond=0)
    for i in range(57):
        finished_attempt(job=history_job(team=TeamFactory(slug=f"t{i:02d}"),
                                         gpu_type=world.a100, tier=world.normal),
                         attempt=1, start=day, hours=1 + i, ended="SUCCEEDED")


def test_staffs_per_team_table_pages_through_every_team(
        page: Any, world: World, shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    _history(world)
    login(page, "root")
    page.goto("/reports/?period=day")
    table = page.locator("#team-totals")
    expect(page.locator("#totals-h")).to_contain_text("1-50 of 57, by cost")
    # The total line (every team: 1 + 2 + ... + 57 GPU-hours), then the dearest first.
    expect(table.locator("tbody tr").first.locator("td")).to_contain_text(
        ["All 57 teams", "", "1653.0"])
    expect(table.locator("tbody tr").nth(1).locator("td").first).to_have_text("t56")
    expect(table.locator("tbody tr")).to_have_count(51)
    shoot(page, "reports-paged-1")
    page.get_by_role("link", name="Next →").click()
    expect(page.locator("#totals-h")).to_contain_text("51-57 of 57")
    expect(table.locator("tbody tr").last.locator("td").first).to_have_text("t00")
    table.get_by_role("link", name="Team", exact=True).click()
    expect(page.locator("#totals-h")).to_contain_text("1-50 of 57, by team")
    expect(table.locator("tbody tr").nth(1).locator("td").first).to_have_text("t00")
    shoot(page, "reports-paged-2")
