"""Shared GPUs counted in GPU-hours exactly (docs/scheduling.md, "Shared GPUs"): a 0.25
GPU job is charged 0.25 GPU-hour per hour - its usage record, the fair-share
accumulator, running usage, costs, the CSV export and import - and holds 0.25 GPU on
the capacity view, the dashboard and /metrics; a time-sliced pool is shown in GPUs with
its slices; a team's ResourceQuota counts its quota of such a type in slices."""

from __future__ import annotations

import io
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.db import transaction
from django.utils import timezone

from queueing.backends.base import NodeInfo
from queueing.models import FairShareAccumulator, GpuPrice, Job, UsageRecord
from queueing.policy.states import JobState
from queueing.selectors.capacity import capacity_by_gpu_type, gpus_held_by_type
from queueing.selectors.costs import cost_buckets
from queueing.selectors.usage import usage_buckets, usage_export_csv
from queueing.services.provisioning import team_gpu_limits
from queueing.services.usage import parse_usage_csv, usage_record_attempt
from tests.conftest import World
from tests.factories import GpuTypeFactory, JobFactory, QuotaFactory

T0 = datetime(2026, 11, 2, 8, tzinfo=UTC)


@pytest.fixture
def ts(world: World) -> Any:
    gpu_type = GpuTypeFactory(slug="ts-a10", sharing="time-sliced", slices_per_gpu=4,
                              resource_name="nvidia.com/gpu.shared", billing_weight=1.0)
    QuotaFactory(team=world.vision, gpu_type=gpu_type, nominal=2, borrowing_limit=1)
    return gpu_type


def _fraction(world: World, ts: Any, *, slices: int = 1, **fields: Any) -> Job:
    values: dict[str, Any] = {"team": world.vision, "tier": world.normal, "gpu_type": ts,
                              "gpus_per_replica": 1, "gpu_slices": slices}
    values.update(fields)
    return JobFactory(**values)


@transaction.atomic
def _charge(job: Job, hours: float) -> UsageRecord | None:
    return usage_record_attempt(job=job, start=T0, end=T0 + timedelta(hours=hours), attempt=1)


def test_a_quarter_gpu_for_two_hours_is_charged_half_a_gpu_hour(world: World, ts: Any) -> None:
    job = _fraction(world, ts, status=JobState.SUCCEEDED, attempt=1)
    record = _charge(job, 2)
    assert record is not None
    assert record.gpus == 0.25
    assert record.gpu_seconds == 0.25 * 2 * 3600
    acc = FairShareAccumulator.objects.get(team=world.vision)
    whole = _fraction(world, ts, slices=0, gpus_per_replica=1, status=JobState.SUCCEEDED,
                      attempt=1, team=world.nlp)
    _charge(whole, 2)
    # The fraction's decayed usage is a quarter of a whole GPU's over the same interval.
    assert acc.value == pytest.approx(
        FairShareAccumulator.objects.get(team=world.nlp).value / 4, rel=1e-9)


def test_running_fractions_count_their_share_in_usage_and_costs(world: World, ts: Any) -> None:
    GpuPrice.objects.create(gpu_type=ts, effective_from=date(2020, 1, 1),
                            price_per_gpu_hour=Decimal("1.00"))
    _fraction(world, ts, slices=2, status=JobState.RUNNING, started_at=T0, attempt=1)
    now = T0 + timedelta(hours=3)
    buckets = usage_buckets(teams=[world.vision], start=T0, end=now, bucket="day", now=now)
    assert sum(b.gpu_hours for b in buckets) == pytest.approx(1.5)  # 0.5 GPU x 3 h
    costs = cost_buckets(teams=[world.vision], start=T0, end=now, period="day", now=now)
    assert sum(b.allocated_gpu_hours for b in costs) == pytest.approx(1.5)
    assert sum(b.cost for b in costs) == pytest.approx(Decimal("1.50"))


def test_the_usage_csv_carries_a_fraction_there_and_back(world: World, ts: Any) -> None:
    _charge(_fraction(world, ts, status=JobState.SUCCEEDED, attempt=1), 1)
    out = io.StringIO()
    usage_export_csv(out=out)
    line = out.getvalue().splitlines()[1]
    assert line.startswith("vision,ts-a10,0.25,")
    rows, errors = parse_usage_csv(io.StringIO(out.getvalue()), now=timezone.now())
    assert errors == [] and rows[0].gpus == 0.25


def test_a_time_sliced_pool_is_shown_in_gpus_with_its_slices(world: World, ts: Any) -> None:
    for _ in range(3):
        _fraction(world, ts, status=JobState.RUNNING, started_at=T0)  # 3 quarters
    _fraction(world, ts, slices=2, status=JobState.QUEUED)
    nodes = [NodeInfo("ts-0", "ts-a10", 8, 3), NodeInfo("ts-1", "ts-a10", 8, 0)]
    rows, _ = capacity_by_gpu_type(nodes=nodes)
    row = next(r for r in rows if r.gpu_type == "ts-a10")
    assert (row.capacity, row.allocated, row.free) == (4, 0.75, 3.25)
    assert (row.capacity_slices, row.allocated_slices) == (16, 3)
    assert row.held_by_jobs == 0.75 and row.by_team == {"vision": 0.75}
    assert row.queued_demand == 0.5
    assert row.by_node[0] == {"name": "ts-0", "gpu_type": "ts-a10", "capacity": 2,
                              "allocated": 0.75, "free": 1.25, "draining": False}
    assert gpus_held_by_type()["ts-a10"] == 0.75


def test_the_capacity_api_and_metrics_say_the_share(world: World, ts: Any) -> None:
    _fraction(world, ts, status=JobState.RUNNING, started_at=T0)
    rows = world.client(world.staff).get("/api/v1/capacity/").json()
    row = next(r for r in rows if r["gpu_type"] == "ts-a10")
    assert row["held_by_jobs"] == 0.25
    assert row["sharing"] == "time-sliced" and row["slices_per_gpu"] == 4
    metrics = world.client(world.staff).get("/metrics").content.decode()
    assert 'fairq_gpus_allocated{gpu_type="ts-a10"} 0.25' in metrics


def test_a_teams_resource_quota_counts_a_time_sliced_quota_in_slices(
        world: World, ts: Any) -> None:
    limits = team_gpu_limits("vision")
    assert limits["nvidia.com/gpu.shared"] == (2 + 1) * 4
    assert "nvidia.com/gpu" not in limits  # a100 shares it, unlimited for vision
