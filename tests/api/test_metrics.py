"""/metrics: gauges and counters read from the database at scrape time, the cycle
histogram from the cache (docs/metrics.md)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from queueing.models import JobEvent
from queueing.services.metrics import record_cycle
from tests.conftest import World
from tests.factories import JobFactory


def _scrape() -> str:
    r = Client().get("/metrics")
    assert r.status_code == 200
    assert r["Content-Type"].startswith("text/plain")
    return r.content.decode()


def test_queue_depth_factor_and_allocation_are_exported(world: World) -> None:
    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.high)
    JobFactory(team=world.nlp, gpu_type=world.a100, tier=world.high, status="RUNNING",
               gpus_per_replica=4, replicas=2, started_at=timezone.now())
    text = _scrape()
    assert 'fairq_queue_depth{team="vision",tier="normal"} 2.0' in text
    assert 'fairq_queue_depth{team="nlp",tier="high"} 1.0' in text
    assert 'fairq_gpus_allocated{gpu_type="a100"} 8.0' in text
    for team in ("vision", "nlp", "speech"):
        assert f'fairq_fair_share_factor{{team="{team}"}}' in text


def test_admissions_and_preemptions_by_rule_count_events(world: World) -> None:
    job = JobFactory(team=world.vision, gpu_type=world.h100, tier=world.normal)
    now = timezone.now()
    JobEvent.objects.create(job=job, at=now, kind=JobEvent.Kind.TRANSITION, from_status="QUEUED",
                            to_status="ADMITTED")
    for rule in ("R1", "R1", "R3"):
        JobEvent.objects.create(job=job, at=now, kind=JobEvent.Kind.PREEMPTED, data={"rule": rule})
    text = _scrape()
    assert "fairq_admissions_total 1.0" in text
    assert 'fairq_preemptions_total{rule="R1"} 2.0' in text
    assert 'fairq_preemptions_total{rule="R3"} 1.0' in text


def test_cycle_durations_land_in_histogram_buckets(world: World) -> None:
    record_cycle(SimpleNamespace(ran=True, timings={"total": 0.02}))
    record_cycle(SimpleNamespace(ran=True, timings={"total": 0.3}))
    record_cycle(SimpleNamespace(ran=False, timings={}))
    text = _scrape()
    assert 'fairq_cycle_duration_seconds_bucket{le="0.025"} 1.0' in text
    assert 'fairq_cycle_duration_seconds_bucket{le="0.5"} 2.0' in text
    assert 'fairq_cycle_duration_seconds_bucket{le="+Inf"} 2.0' in text
    assert "fairq_cycle_duration_seconds_count 2.0" in text
    assert "fairq_cycle_duration_seconds_sum 0.32" in text


def test_the_cycle_task_records_its_duration(world: World) -> None:
    from queueing.tasks import scheduler_cycle_task

    scheduler_cycle_task()
    assert "fairq_cycle_duration_seconds_count 1.0" in _scrape()


@pytest.mark.parametrize(("header", "status"), [("", 401), ("Bearer nope", 401),
                                                ("Bearer s3cret", 200)])
def test_a_metrics_token_is_required_when_configured(world: World, header: str,
                                                     status: int) -> None:
    with override_settings(FAIRQ_METRICS_TOKEN="s3cret"):
        r = Client().get("/metrics", HTTP_AUTHORIZATION=header)
    assert r.status_code == status
