"""The reports page and its roll-up: the same numbers as GET /api/v1/costs/ over whole
days, whether the records are rolled up or not; team members see their teams."""

from __future__ import annotations

import io
import json
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from queueing.models import UsageDay, UsageRecord, UsageRollup
from queueing.selectors.costs import cost_buckets
from queueing.selectors.reports import report_buckets
from queueing.services.costs import gpu_price_set, team_budget_set
from queueing.services.reports import usage_days_roll_up
from tests.conftest import World

from .history import finished_attempt, job, utilization


def _history(world: World) -> None:
    gpu_price_set(actor=world.staff, gpu_type=world.h100, effective_from=date(2026, 1, 1),
                  price_per_gpu_hour=Decimal("2"))
    gpu_price_set(actor=world.staff, gpu_type=world.h100, effective_from=date(2026, 9, 10),
                  price_per_gpu_hour=Decimal("3"))
    j = job(team=world.vision, gpu_type=world.h100, gpus_per_replica=4, tier=world.normal,
            attempt=2)
    finished_attempt(job=j, attempt=1, start=datetime(2026, 9, 9, 20, tzinfo=UTC), hours=8,
                     ended="PREEMPTED", sm_mean=25.0)
    j.utilization.filter(attempt=1).update(sm_hist={"1": 120, "30": 360})
    finished_attempt(job=j, attempt=2, start=datetime(2026, 10, 1, tzinfo=UTC), hours=30,
                     ended="SUCCEEDED", sm_mean=70.0)
    finished_attempt(job=job(team=world.nlp, gpu_type=world.h100, tier=world.normal),
                     attempt=1, start=datetime(2026, 10, 5, tzinfo=UTC), hours=5,
                     ended="FAILED")


def _rows(buckets: list) -> list[tuple]:
    return [(b.period, b.team, b.gpu_type, round(b.allocated_gpu_hours, 6),
             round(b.used_gpu_hours, 6), round(b.idle_gpu_hours, 6),
             round(b.preempted_gpu_hours, 6), round(b.cost, 6), round(b.idle_cost, 6))
            for b in buckets]


def test_the_roll_up_gives_the_numbers_of_the_cost_api(world: World) -> None:
    _history(world)
    teams = [world.vision, world.nlp]
    now = datetime(2026, 11, 26, tzinfo=UTC)
    start, end = date(2026, 9, 1), date(2026, 11, 1)
    exact = cost_buckets(teams=teams, start=datetime(2026, 9, 1, tzinfo=UTC),
                         end=datetime(2026, 11, 1, tzinfo=UTC), period="day", now=now)
    live = report_buckets(teams=teams, start=start, end=end, period="day", now=now)
    assert live.rolled_up_to == 0
    assert _rows(live.buckets) == _rows(exact)
    assert usage_days_roll_up(now=now, batch=2) == 2  # in two runs
    assert usage_days_roll_up(now=now, batch=2) == 1
    assert usage_days_roll_up(now=now) == 0
    rolled = report_buckets(teams=teams, start=start, end=end, period="day", now=now)
    assert rolled.rolled_up_to == UsageRollup.objects.get().last_record_id > 0
    assert _rows(rolled.buckets) == _rows(exact)
    # Sept 9 at 2.00 and Sept 10 at 3.00 (rule C1), a quarter of the minutes idle (C3).
    sept = [b for b in rolled.buckets if b.period.month == 9]
    assert [(b.period.day, b.allocated_gpu_hours, b.cost, b.idle_gpu_hours) for b in sept] == [
        (9, 16.0, Decimal("32.0"), 4.0), (10, 16.0, Decimal("48.0"), 4.0)]
    monthly = report_buckets(teams=teams, start=start, end=end, period="month", now=now)
    assert [(b.period, b.team, b.allocated_gpu_hours) for b in monthly.buckets] == [
        (date(2026, 9, 1), "vision", 32.0), (date(2026, 10, 1), "nlp", 5.0),
        (date(2026, 10, 1), "vision", 120.0)]
    assert UsageDay.objects.count() == 5  # vision Sept 9, 10, Oct 1, 2; nlp Oct 5


def test_roll_up_usage_command_catches_up(world: World) -> None:
    _history(world)
    out = io.StringIO()
    call_command("roll_up_usage", stdout=out)
    assert out.getvalue().strip() == "rolled up 3 usage record(s)"


def test_running_jobs_count_live_on_the_report(world: World) -> None:
    started = timezone.now() - timedelta(hours=2)
    j = job(team=world.vision, gpu_type=world.a100, tier=world.normal, status="RUNNING",
            started_at=started)
    utilization(job=j, attempt=1, start=started, minutes=120, sm_mean=50.0)
    today = timezone.now().astimezone(UTC).date()
    r = report_buckets(teams=[world.vision], start=today - timedelta(days=1),
                       end=today + timedelta(days=1), period="month", now=timezone.now())
    assert sum(b.allocated_gpu_hours for b in r.buckets) == pytest.approx(2.0, abs=0.01)


def _page(world: World, user: object, **params: str) -> tuple[int, str]:
    c = Client()
    c.force_login(user)  # type: ignore[arg-type]
    r = c.get("/reports/", params)
    return r.status_code, r.content.decode()


def test_the_page_shows_a_members_teams_only(world: World) -> None:
    _history(world)
    # The page shows the last 12 months: move the history into them.
    shift = timezone.now() - datetime(2026, 10, 10, tzinfo=UTC)
    for r in UsageRecord.objects.all():
        r.start, r.end = r.start + shift, r.end + shift
        r.save()
    status, html = _page(world, world.outsider)
    assert status == 200
    series = json.loads(html.split('id="report-series" type="application/json">')[1]
                        .split("</script>")[0])
    assert list(series["cost"]) == ["nlp"]
    assert "<td>vision</td>" not in html and "<td>nlp</td>" in html
    assert "One line: the team's cost." in html  # the cost chart's caption, one team
    status, html = _page(world, world.staff)
    assert "<td>vision</td>" in html and "<td>nlp</td>" in html
    assert "The 2 lines: the most expensive teams." in html
    status, html = _page(world, world.outsider, team="vision")
    assert status == 400 and "No team" in html
    status, _ = _page(world, world.member, period="week")
    assert status == 400


def test_the_page_warns_of_a_reached_budget(world: World) -> None:
    gpu_price_set(actor=world.staff, gpu_type=world.a100, effective_from=date(2020, 1, 1),
                  price_per_gpu_hour=Decimal("1"))
    team_budget_set(actor=world.staff, team=world.vision, monthly_amount=Decimal("1"),
                    policy="downgrade")
    now = timezone.now()
    start = max(now.replace(day=1, hour=0, minute=0, second=0, microsecond=0),
                now - timedelta(minutes=30))
    hours = max((now - start).total_seconds() / 3600, 1 / 60)
    finished_attempt(job=job(team=world.vision, gpu_type=world.a100, gpus_per_replica=100,
                             tier=world.normal),
                     attempt=1, start=now - timedelta(hours=hours), hours=hours,
                     ended="SUCCEEDED")
    _, html = _page(world, world.member)
    assert "new jobs drop to the lowest tier" in html


def test_the_team_page_shows_the_budget_notice_from_80_percent(world: World) -> None:
    gpu_price_set(actor=world.staff, gpu_type=world.a100, effective_from=date(2020, 1, 1),
                  price_per_gpu_hour=Decimal("1"))
    team_budget_set(actor=world.staff, team=world.vision, monthly_amount=Decimal("1000"))
    c = Client()
    c.force_login(world.member)
    assert 'id="budget-notice"' not in c.get("/teams/vision/").content.decode()
    now = timezone.now()
    start = max(now.replace(day=1, hour=0, minute=0, second=0, microsecond=0),
                now - timedelta(minutes=30))
    hours = max((now - start).total_seconds() / 3600, 1 / 60)
    finished_attempt(job=job(team=world.vision, gpu_type=world.a100,
                             gpus_per_replica=int(850 / hours) + 1, tier=world.normal),
                     attempt=1, start=now - timedelta(hours=hours), hours=hours,
                     ended="SUCCEEDED")
    html = c.get("/teams/vision/").content.decode()
    assert 'id="budget-notice"' in html and "of its monthly GPU budget" in html
    assert "lowest tier" not in html  # 85%: not over, and no downgrade policy


def test_the_default_range_starts_at_the_first_day_with_gpu_time() -> None:
    from queueing.selectors.reports import default_period, default_range

    today = date(2026, 12, 6)
    # Four days of data: by day, from their first day; by month, from their month.
    assert default_period(first=date(2026, 12, 2), today=today) == "day"
    assert default_range(period="day", today=today, first=date(2026, 12, 2)) == (
        date(2026, 12, 2), date(2026, 12, 7))
    assert default_range(period="month", today=today, first=date(2026, 11, 20)) == (
        date(2026, 11, 1), date(2026, 12, 7))
    # A year of data: by month, the last 12 months; no data: the whole windows.
    assert default_period(first=date(2025, 6, 1), today=today) == "month"
    assert default_range(period="month", today=today, first=date(2025, 6, 1)) == (
        date(2026, 1, 1), date(2026, 12, 7))
    assert default_period(first=None, today=today) == "month"
    assert default_range(period="day", today=today) == (date(2026, 11, 7), date(2026, 12, 7))
