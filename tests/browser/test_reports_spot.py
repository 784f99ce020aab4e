"""Rule C4 in a real browser: the reports page's per-team table shows the spot GPU-hours
and their cost apart. Screenshot: test-artifacts/screenshots/reports-spot.png."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from queueing.models import GpuPrice, UsageRecord
from tests.accounting.history import finished_attempt
from tests.accounting.history import job as history_job
from tests.conftest import World

from .conftest import login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@transaction.atomic  # (charging locks the team's accumulator)
def _history(world: World) -> None:
    """Two days ago (within the last 30 days): vision 2 GPUs × 5 h on spot at 0.90 and
    1 GPU × 4 h on demand at the list's 2.00; nlp 1 GPU × 3 h on demand."""
    GpuPrice.objects.create(gpu_type=world.a100, effective_from=date(2020, 1, 1),
                            price_per_gpu_hour=Decimal("2.00"))
    day = (timezone.now().astimezone(UTC) - timedelta(days=2)).replace(
        hour=8, minute=0, second=0, microsecond=0)
    spot = finished_attempt(job=history_job(team=world.vision, gpu_type=world.a100,
                                            gpus_per_replica=2, tier=world.low),
                            attempt=1, start=day, hours=5, ended="SUCCEEDED")
    UsageRecord.objects.filter(pk=spot.pk).update(spot=True,
                                                  price_per_gpu_hour=Decimal("0.90"))
    finished_attempt(job=history_job(team=world.vision, gpu_type=world.a100,
                                     tier=world.normal),
                     attempt=1, start=day, hours=4, ended="SUCCEEDED")
    finished_attempt(job=history_job(team=world.nlp, gpu_type=world.a100, tier=world.normal),
                     attempt=1, start=day, hours=3, ended="SUCCEEDED")


def test_rule_c4_the_reports_page_shows_spot_gpu_hours_and_cost_apart(
        page: Any, world: World, shoot: Callable[[Any, str], Any]) -> None:
    from playwright.sync_api import expect

    _history(world)
    login(page, "root")
    page.goto("/reports/?period=day")
    table = page.locator("#totals-h + div table")
    expect(table.locator("thead")).to_contain_text("Spot GPU-h")
    expect(table.locator("thead")).to_contain_text("Spot cost")
    vision = table.locator("tr", has_text="vision")
    # 14 GPU-hours costing 17.00, of which 10 on spot costing 9.00.
    expect(vision.locator("td")).to_have_text(
        ["vision", "vision", "14.0", "0.0", "0%", "0.0", "0.0", "0.00", "17.00", "0.00", "10.0",
         "9.00"])  # "0.00" after the preempted GPU-hours: the lost GPU-hours
    expect(table.locator("tr", has_text="nlp").locator("td").nth(10)).to_have_text("0.0")
    shoot(page, "reports-spot")
