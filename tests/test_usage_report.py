"""GET /api/v1/usage/: GPU-hours per team, GPU type and bucket, from charged attempts and,
as fair-share counts them (rule F1), from attempts still running, up to now."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from queueing.models import UsageRecord
from queueing.selectors.usage import usage_buckets

from .conftest import World
from .factories import JobFactory

NOW = datetime(2026, 11, 22, 12, 30, tzinfo=UTC)


def _total(rows: list, field: str = "gpu_hours") -> float:
    return sum(getattr(r, field) for r in rows)


def test_a_charged_interval_is_split_across_hour_buckets(world: World) -> None:
    UsageRecord.objects.create(team=world.vision, gpu_type=world.a100, gpus=4,
                               billing_weight=1.0, start=NOW - timedelta(hours=2),
                               end=NOW - timedelta(minutes=30), gpu_seconds=4 * 5400)
    rows = usage_buckets(teams=[world.vision], start=NOW - timedelta(hours=3), end=NOW,
                         bucket="hour", now=NOW)
    assert [(r.start.hour, r.gpu_hours) for r in rows] == [(10, 2.0), (11, 4.0)]


def test_a_running_attempt_counts_up_to_now_and_once_charged_the_same(world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal,
                     status="RUNNING", gpus_per_replica=2, replicas=2,
                     started_at=NOW - timedelta(minutes=90))
    window = {"teams": [world.vision], "start": NOW - timedelta(hours=3), "end": NOW,
              "bucket": "hour"}
    running = usage_buckets(**window, now=NOW)
    assert _total(running) == pytest.approx(4 * 1.5)
    assert _total(running, "weighted_gpu_hours") == pytest.approx(4 * 1.5 * 2.0)
    assert [(r.start.hour, r.gpu_hours) for r in running] == [(11, 4.0), (12, 2.0)]
    # It finishes now and is charged: a usage record, no longer holding GPUs.
    UsageRecord.objects.create(team=world.vision, gpu_type=world.h100, job=job, attempt=1,
                               gpus=4, billing_weight=2.0, start=job.started_at, end=NOW,
                               gpu_seconds=4 * 5400)
    job.status = "SUCCEEDED"
    job.save(update_fields=["status"])
    assert usage_buckets(**window, now=NOW) == running


def test_the_api_shows_a_running_job_of_the_callers_team_only(world: World) -> None:
    JobFactory(team=world.vision, gpu_type=world.a100, tier=world.normal, status="RUNNING",
               gpus_per_replica=8, started_at=datetime.now(UTC) - timedelta(hours=1))
    r = world.client(world.member).get("/api/v1/usage/?bucket=day")
    assert r.status_code == 200
    assert sum(b["gpu_hours"] for b in r.json()["buckets"]) == pytest.approx(8.0, rel=1e-3)
    other = world.client(world.outsider).get("/api/v1/usage/?bucket=day").json()["buckets"]
    assert other == []
