"""Cost per team and department (rules C1-C3) and budgets (rules B1-B3)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from accounts.models import AuditEntry
from queueing.errors import DomainError, PermissionDenied
from queueing.models import BudgetWarning, Job, JobEvent, TeamBudget, UsageRecord
from queueing.policy.costs import money
from queueing.selectors.costs import bucket_as_dict, by_department, cost_buckets
from queueing.services.costs import budgets_check, gpu_price_set, team_budget_set
from tests.conftest import World, job_body
from tests.factories import TeamFactory

from .history import finished_attempt, job, utilization


def at(month: int, day: int, hour: int = 0) -> datetime:
    return datetime(2026, month, day, hour, tzinfo=UTC)


@pytest.fixture
def priced(world: World) -> World:
    gpu_price_set(actor=world.staff, gpu_type=world.h100, effective_from=date(2026, 1, 1),
                  price_per_gpu_hour=Decimal("2.00"))
    gpu_price_set(actor=world.staff, gpu_type=world.h100, effective_from=date(2026, 3, 1),
                  price_per_gpu_hour=Decimal("3.00"))
    gpu_price_set(actor=world.staff, gpu_type=world.a100, effective_from=date(2026, 1, 1),
                  price_per_gpu_hour=Decimal("1.00"))
    return world


def test_rule_c2_a_months_cost_splits_at_the_price_change(priced: World) -> None:
    world = priced
    research = TeamFactory(slug="research")
    world.vision.parent = research
    world.vision.save()
    j = job(team=world.vision, gpu_type=world.h100, gpus_per_replica=2, tier=world.normal,
            status="QUEUED", attempt=2)
    finished_attempt(job=j, attempt=1, start=at(2, 28, 22), hours=4, ended="PREEMPTED")
    # 240 minutes: 60 below the tier's 5% idle threshold (rule C3), mean 50%.
    utilization(job=j, attempt=1, start=at(2, 28, 22), minutes=240, sm_mean=50.0)
    j.utilization.filter(attempt=1).update(sm_hist={"2": 60, "66": 180})
    rows = [bucket_as_dict(b) for b in cost_buckets(
        teams=[world.vision], start=at(1, 1), end=at(4, 1), period="month", now=at(4, 1))]
    assert rows == [
        {"period": "2026-02-01", "team": "vision", "department": "research", "gpu_type": "h100",
         "allocated_gpu_hours": 4.0, "used_gpu_hours": 2.0, "idle_gpu_hours": 1.0,
         "preempted_gpu_hours": 4.0, "unpriced_gpu_hours": 0.0, "cost": "8.00",
         "idle_cost": "2.00", "currency": "EUR",
         "spot_gpu_hours": 0.0, "spot_cost": "0.00", "lost_gpu_hours": 0.0},
        {"period": "2026-03-01", "team": "vision", "department": "research", "gpu_type": "h100",
         "allocated_gpu_hours": 4.0, "used_gpu_hours": 2.0, "idle_gpu_hours": 1.0,
         "preempted_gpu_hours": 4.0, "unpriced_gpu_hours": 0.0, "cost": "12.00",
         "idle_cost": "3.00", "currency": "EUR",
         "spot_gpu_hours": 0.0, "spot_cost": "0.00", "lost_gpu_hours": 0.0},
    ]
    # The old month keeps its price when a newer one is set later (rule C1).
    gpu_price_set(actor=world.staff, gpu_type=world.h100, effective_from=date(2026, 3, 15),
                  price_per_gpu_hour=Decimal("9.00"))
    feb = cost_buckets(teams=[world.vision], start=at(2, 1), end=at(3, 1), period="day",
                       now=at(4, 1))
    assert [(b.period, money(b.cost)) for b in feb] == [(date(2026, 2, 28), Decimal("8.00"))]


def test_departments_sum_their_teams(priced: World) -> None:
    world = priced
    research = TeamFactory(slug="research")
    for team in (world.vision, world.nlp):
        team.parent = research
        team.save()
        finished_attempt(job=job(team=team, gpu_type=world.a100, tier=world.normal),
                         attempt=1, start=at(3, 2), hours=10, ended="SUCCEEDED")
    buckets = cost_buckets(teams=[world.vision, world.nlp, world.speech], start=at(3, 1),
                           end=at(4, 1), period="month", now=at(4, 1))
    assert [(b.team, money(b.cost)) for b in buckets] == [("nlp", Decimal("10.00")),
                                                          ("vision", Decimal("10.00"))]
    dept = by_department(buckets)
    assert [(b.team, b.allocated_gpu_hours, money(b.cost)) for b in dept] == [
        ("research", 20.0, Decimal("20.00"))]


def test_imported_usage_costs_too_and_unpriced_time_is_shown(priced: World) -> None:
    world = priced
    UsageRecord.objects.create(team=world.speech, gpu_type=world.mig, gpus=4, start=at(3, 1),
                               end=at(3, 1, 5), gpu_seconds=4 * 5 * 3600, source="import")
    (b,) = cost_buckets(teams=[world.speech], start=at(3, 1), end=at(4, 1), period="day",
                        now=at(4, 1))
    assert (b.gpu_type, b.allocated_gpu_hours, b.unpriced_gpu_hours, b.cost) == \
        ("mig-1g-10gb", 20.0, 20.0, Decimal(0))


def _spend(world: World, gpu_hours: float, start: datetime) -> None:
    j = job(team=world.vision, gpu_type=world.a100, gpus_per_replica=10, tier=world.normal)
    finished_attempt(job=j, attempt=1, start=start, hours=gpu_hours / 10, ended="SUCCEEDED")


def test_rule_b2_warnings_at_80_and_100_percent_once_each(priced: World) -> None:
    world = priced
    team_budget_set(actor=world.staff, team=world.vision, monthly_amount=Decimal("100"))
    now = at(3, 20)
    _spend(world, 79, at(3, 2))
    assert budgets_check(now=now) == []
    _spend(world, 1, at(3, 3))  # 80.00 of 100
    given = budgets_check(now=now)
    assert [(w.team.slug, w.level, w.cost) for w in given] == [("vision", 80, Decimal("80.00"))]
    assert budgets_check(now=now) == []  # once
    _spend(world, 30, at(3, 4))  # 110.00
    assert [w.level for w in budgets_check(now=now)] == [100]
    assert budgets_check(now=now + timedelta(days=5)) == []
    assert list(BudgetWarning.objects.values_list("level", flat=True)) == [80, 100]
    audit = AuditEntry.objects.filter(action="budget_warning").order_by("id")
    assert [e.changes["level"][1] for e in audit] == [80, 100]
    # A new month starts again: February's spending does not count in April.
    assert budgets_check(now=at(4, 2)) == []


def test_rule_b2_a_team_crossing_both_levels_at_once_gets_both(priced: World) -> None:
    world = priced
    team_budget_set(actor=world.staff, team=world.vision, monthly_amount=Decimal("50"))
    _spend(world, 60, at(3, 2))
    assert sorted(w.level for w in budgets_check(now=at(3, 20))) == [80, 100]


def _spent_this_month(world: World, amount_gpu_hours: float) -> None:
    now = timezone.now()
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    start = max(month, now - timedelta(minutes=30))
    hours = (now - start).total_seconds() / 3600
    gpus = max(1, int(amount_gpu_hours / max(hours, 1e-6)) + 1)
    j = job(team=world.vision, gpu_type=world.a100, gpus_per_replica=gpus, tier=world.normal)
    finished_attempt(job=j, attempt=1, start=start, hours=hours, ended="SUCCEEDED")


def test_rule_b3_an_over_budget_teams_new_jobs_drop_to_the_lowest_tier(priced: World) -> None:
    world = priced
    team_budget_set(actor=world.staff, team=world.vision, monthly_amount=Decimal("10"),
                    policy="downgrade")
    _spent_this_month(world, 20)
    r = world.client(world.admin).post("/api/v1/jobs/", job_body(tier="high"), format="json")
    assert r.status_code == 201, r.content
    new = Job.objects.get(pk=r.json()["id"])
    assert new.tier.slug == "low"
    event = JobEvent.objects.get(job=new)
    assert "tier high -> low" in event.reason and "rule B3" in event.reason
    assert event.data == {"budget_downgrade": {"from": "high", "to": "low"}}


def test_rule_b3_needs_the_policy_and_the_budget_reached(priced: World) -> None:
    world = priced
    team_budget_set(actor=world.staff, team=world.vision, monthly_amount=Decimal("10"))
    _spent_this_month(world, 20)
    c = world.client(world.admin)
    assert c.post("/api/v1/jobs/", job_body(tier="high"), format="json").json()["tier"] == "high"
    TeamBudget.objects.filter(team=world.vision).update(policy="downgrade",
                                                        monthly_amount=Decimal("100000"))
    assert c.post("/api/v1/jobs/", job_body(tier="high"), format="json").json()["tier"] == "high"


def test_prices_and_budgets_are_staff_only_and_audited(world: World) -> None:
    with pytest.raises(DomainError):
        team_budget_set(actor=world.staff, team=world.vision, monthly_amount=Decimal("0"))
    with pytest.raises(PermissionDenied):
        gpu_price_set(actor=world.admin, gpu_type=world.h100, effective_from=date(2026, 1, 1),
                      price_per_gpu_hour=Decimal("1"))
    _, created = gpu_price_set(actor=world.staff, gpu_type=world.h100,
                               effective_from=date(2026, 1, 1), price_per_gpu_hour=Decimal("1"))
    _, again = gpu_price_set(actor=world.staff, gpu_type=world.h100,
                             effective_from=date(2026, 1, 1), price_per_gpu_hour=Decimal("2"))
    assert (created, again) == (True, False)
    entries: Any = AuditEntry.objects.filter(object_type="queueing.GpuPrice").order_by("id")
    assert [e.action for e in entries] == ["create", "update"]
    old, new = entries[1].changes["price_per_gpu_hour"]
    assert (Decimal(str(old)), Decimal(str(new))) == (Decimal(1), Decimal(2))


def test_metrics_export_each_budgeted_teams_used_ratio(priced: World, client: Any) -> None:
    world = priced
    team_budget_set(actor=world.staff, team=world.vision, monthly_amount=Decimal("100"))
    _spent_this_month(world, 80)
    body = client.get("/metrics").content.decode()
    (line,) = [x for x in body.splitlines()
               if x.startswith('fairq_team_budget_used_ratio{team="vision"}')]
    assert 0.8 <= float(line.split()[-1]) < 0.9
    assert 'fairq_team_budget_used_ratio{team="nlp"}' not in body  # no budget, no series
