"""GET /api/v1/costs/ (JSON and finance's CSV), manage.py export_costs, GPU prices and
budgets through the API: shapes, permissions, bad input."""

from __future__ import annotations

import csv
import io
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from accounts.models import AuditEntry
from queueing.models import GpuPrice, TeamBudget
from queueing.services.costs import gpu_price_set
from tests.conftest import World
from tests.factories import TeamFactory

from .history import finished_attempt, job

OCT = {"from": "2026-10-01T00:00:00Z", "to": "2026-11-01T00:00:00Z"}


@pytest.fixture
def spent(world: World) -> World:
    gpu_price_set(actor=world.staff, gpu_type=world.h100, effective_from=date(2026, 1, 1),
                  price_per_gpu_hour=Decimal("2.5"))
    gpu_price_set(actor=world.staff, gpu_type=world.h100, effective_from=date(2026, 10, 16),
                  price_per_gpu_hour=Decimal("3"))
    research = TeamFactory(slug="research")
    world.vision.parent = research
    world.vision.save()
    world.nlp.parent = research
    world.nlp.save()
    # vision: 2 GPUs for 24 h across the price change at Oct 16 00:00 UTC.
    finished_attempt(job=job(team=world.vision, gpu_type=world.h100, gpus_per_replica=2,
                             tier=world.normal),
                     attempt=1, start=datetime(2026, 10, 15, 12, tzinfo=UTC), hours=24,
                     ended="SUCCEEDED", sm_mean=90.0)
    finished_attempt(job=job(team=world.nlp, gpu_type=world.h100, tier=world.normal),
                     attempt=1, start=datetime(2026, 10, 2, tzinfo=UTC), hours=10,
                     ended="SUCCEEDED")
    return world


def test_costs_per_team_and_month_for_staff(spent: World) -> None:
    r = spent.client(spent.staff).get("/api/v1/costs/", OCT)
    assert r.status_code == 200, r.content
    body = r.json()
    assert (body["period"], body["group"], body["currency"]) == ("month", "team", "EUR")
    assert [(x["team"], x["department"], x["allocated_gpu_hours"], x["cost"])
            for x in body["rows"]] == [
        ("nlp", "research", 10.0, "25.00"),
        ("vision", "research", 48.0, "132.00"),  # 24 GPU-h at 2.50 + 24 at 3.00
    ]
    used = body["rows"][1]["used_gpu_hours"]
    assert used == pytest.approx(43.2)


def test_costs_by_department_and_day(spent: World) -> None:
    c = spent.client(spent.staff)
    rows = c.get("/api/v1/costs/", {**OCT, "group": "department"}).json()["rows"]
    assert [(x["team"], x["allocated_gpu_hours"], x["cost"]) for x in rows] == [
        ("research", 58.0, "157.00")]
    days = c.get("/api/v1/costs/", {**OCT, "period": "day", "team": "vision"}).json()["rows"]
    assert [(x["period"], x["cost"]) for x in days] == [("2026-10-15", "60.00"),
                                                      ("2026-10-16", "72.00")]


def test_members_see_their_teams_costs_only(spent: World) -> None:
    rows = spent.client(spent.outsider).get("/api/v1/costs/", OCT).json()["rows"]
    assert [x["team"] for x in rows] == ["nlp"]
    r = spent.client(spent.outsider).get("/api/v1/costs/", {**OCT, "team": "vision"})
    assert r.status_code == 404


@pytest.mark.parametrize("who", ["anonymous", "member"])
def test_a_refused_csv_export_is_the_apis_json_error(spent: World, who: str) -> None:
    """Found by schemathesis: a 401 (or 400) asked as CSV came with `text/csv` and a JSON
    body; errors are JSON with their own content type, `?format=csv` or not."""
    from rest_framework.test import APIClient

    client = APIClient() if who == "anonymous" else spent.client(spent.member)
    r = client.get("/api/v1/costs/", {"format": "csv", "period": "week"})
    assert r.status_code == (401 if who == "anonymous" else 400)
    assert r["Content-Type"] == "application/json"
    assert r.json()["error"]["status"] == r.status_code


def test_the_csv_export_for_finance(spent: World) -> None:
    r = spent.client(spent.staff).get("/api/v1/costs/", {**OCT, "period": "day",
                                                         "format": "csv"})
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/csv")
    assert 'filename="fairq-costs-2026-10-01-2026-11-01.csv"' in r["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(r.content.decode())))
    assert [(x["period"], x["team"], x["department"], x["cost"], x["currency"])
            for x in rows] == [
        ("2026-10-02", "nlp", "research", "25.00", "EUR"),
        ("2026-10-15", "vision", "research", "60.00", "EUR"),
        ("2026-10-16", "vision", "research", "72.00", "EUR"),
    ]
    assert list(rows[0]) == ["period", "team", "department", "gpu_type", "allocated_gpu_hours",
                             "used_gpu_hours", "idle_gpu_hours", "preempted_gpu_hours",
                             "unpriced_gpu_hours", "cost", "idle_cost", "currency",
                             "spot_gpu_hours", "spot_cost", "lost_gpu_hours"]


def test_export_costs_writes_the_same_csv(spent: World, tmp_path: Path) -> None:
    out = tmp_path / "costs.csv"
    call_command("export_costs", str(out), "--month", "2026-10", stdout=io.StringIO())
    api = spent.client(spent.staff).get("/api/v1/costs/", {**OCT, "period": "day",
                                                           "format": "csv"})
    assert out.read_text() == api.content.decode()
    with pytest.raises(CommandError, match="YYYY-MM"):
        call_command("export_costs", "--month", "October")
    with pytest.raises(CommandError, match="no such team"):
        call_command("export_costs", "--month", "2026-10", "--team", "nope")


@pytest.mark.parametrize(("params", "field"), [
    ({"from": "soon"}, "from"),
    ({"period": "week"}, "period"),
    ({"group": "company"}, "group"),
    ({"from": "2026-11-01T00:00:00Z", "to": "2026-10-01T00:00:00Z"}, "from"),
    ({"from": "2020-01-01T00:00:00Z", "to": "2026-01-01T00:00:00Z", "period": "day"}, "from"),
])
def test_bad_cost_queries_are_a_400_on_the_field(world: World, params: dict[str, str],
                                                 field: str) -> None:
    r = world.client(world.staff).get("/api/v1/costs/", params)
    assert r.status_code == 400, r.content
    assert field in r.json()["error"]["fields"]


def test_prices_staff_write_everyone_reads(world: World) -> None:
    body = {"gpu_type": "h100", "price_per_gpu_hour": "2.75", "effective_from": "2026-10-01"}
    assert world.client(world.admin).post("/api/v1/gpu-prices/", body,
                                          format="json").status_code == 403
    staff = world.client(world.staff)
    r = staff.post("/api/v1/gpu-prices/", body, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["currency"] == "EUR"
    r = staff.post("/api/v1/gpu-prices/", {**body, "price_per_gpu_hour": "3"}, format="json")
    assert r.status_code == 200 and r.json()["price_per_gpu_hour"] == "3.0000"
    listed = world.client(world.member).get("/api/v1/gpu-prices/").json()
    assert [(p["gpu_type"], p["price_per_gpu_hour"]) for p in listed] == [("h100", "3.0000")]
    bad = staff.post("/api/v1/gpu-prices/", {**body, "price_per_gpu_hour": "-1",
                                             "gpu_type": "tpu", "effective_from": "soon"},
                     format="json")
    assert bad.status_code == 400
    assert set(bad.json()["error"]["fields"]) == {"price_per_gpu_hour", "gpu_type",
                                                  "effective_from"}
    pk = GpuPrice.objects.get().pk
    assert world.client(world.admin).delete(f"/api/v1/gpu-prices/{pk}/").status_code == 403
    assert staff.delete(f"/api/v1/gpu-prices/{pk}/").status_code == 204
    assert list(AuditEntry.objects.filter(object_type="queueing.GpuPrice")
                .order_by("id").values_list("action", flat=True)) == ["create", "update",
                                                                       "delete"]


def test_budgets_staff_write_members_read_their_teams(spent: World) -> None:
    staff = spent.client(spent.staff)
    body = {"team": "vision", "monthly_amount": "1000.00", "policy": "downgrade"}
    assert spent.client(spent.admin).post("/api/v1/budgets/", body,
                                          format="json").status_code == 403
    r = staff.post("/api/v1/budgets/", body, format="json")
    assert r.status_code == 201, r.content
    assert r.json()["policy"] == "downgrade" and r.json()["currency"] == "EUR"
    staff.post("/api/v1/budgets/", {"team": "nlp", "monthly_amount": "10"}, format="json")
    mine = spent.client(spent.member).get("/api/v1/budgets/").json()
    assert [b["team"] for b in mine] == ["vision"]
    bad = staff.post("/api/v1/budgets/", {"team": "vision", "monthly_amount": "0",
                                          "policy": "shout"}, format="json")
    assert bad.status_code == 400
    assert set(bad.json()["error"]["fields"]) == {"monthly_amount", "policy"}
    unknown = staff.post("/api/v1/budgets/", {**body, "colour": "red"}, format="json")
    assert unknown.status_code == 400
    assert staff.delete("/api/v1/budgets/nlp/").status_code == 204
    assert list(TeamBudget.objects.values_list("team__slug", flat=True)) == ["vision"]
    assert staff.delete("/api/v1/budgets/nlp/").status_code == 404
