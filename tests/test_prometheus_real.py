"""End to end through a real Prometheus (tests/prometheus_harness.py): dcgm-exporter's
metrics for fairq's pods are scraped, fairq's one query reads them, and rules U1-U4 flag
and reclaim the idle job while the busy ones are left alone (docs/scheduling.md, "Idle
GPUs"). The cluster is the simulated one (its workloads are the jobs); the readings come
only from Prometheus."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import override_settings
from django.utils import timezone

from queueing.backends.prometheus import PrometheusUtilization
from queueing.composition import get_utilization_source, reset_backends
from queueing.models import AttemptUtilization, Job, JobEvent, Tier
from queueing.services.scheduler import scheduler_cycle

from .conftest import World, job_body
from .prometheus_harness import (
    DcgmExporter,
    Gpu,
    PrometheusServer,
    exporter,
    prometheus,
    wait_until,
)

__all__ = ["exporter", "prometheus"]  # the fixtures, imported for this module

pytestmark = pytest.mark.django_db




def submit(world: World, **overrides: Any) -> int:
    r = world.client(world.member).post("/api/v1/jobs/", job_body(**overrides), format="json")
    assert r.status_code == 201, r.json()
    return int(r.json()["id"])


def test_idle_job_flagged_and_requeued_through_prometheus_busy_ones_untouched(
        world: World, exporter: DcgmExporter, prometheus: PrometheusServer) -> None:
    Tier.objects.filter(pk=world.low.pk).update(
        idle_threshold_percent=5, idle_window_minutes=3, idle_action="requeue",
        idle_grace_minutes=2)
    long_run = {"FAIRQ_SIM_SECONDS": "7200"}
    idle = submit(world, tier="low", env=long_run)
    busy = submit(world, tier="low", env=long_run)
    fallback = submit(world, tier="low", env=long_run)  # no profiling metrics on its GPUs
    ns = "fairq-vision"
    with exporter.lock:
        exporter.pods = {
            (ns, f"fq-{idle}-1-x7k2p"): [Gpu(1.0, 900), Gpu(2.0, 900)],
            (ns, f"fq-{busy}-1-b4zq9"): [Gpu(90.0, 60_000), Gpu(80.0, 50_000)],
            (ns, f"fq-{fallback}-1-k8m2n"): [Gpu(70.0, 1000, profiling=False)] * 2,
            # Not fairq's: another namespace, another pod name.
            ("kube-system", f"fq-{idle}-1-aaaaa"): [Gpu(99.0, 1)],
            (ns, "jupyter-abcde"): [Gpu(0.0, 1)],
        }
    wait_until(lambda: len(prometheus.query('count by (pod) (DCGM_FI_DEV_FB_USED)')) == 5,
               what="Prometheus to scrape the exporter")

    t0 = timezone.now().replace(second=0, microsecond=0)
    with override_settings(FAIRQ_PROMETHEUS_URL=prometheus.url):
        reset_backends()
        source = get_utilization_source()
        assert isinstance(source, PrometheusUtilization)
        # The one query answers every pod at once (and only fairq's).
        readings = {(r.job_id, r.attempt): r for r in source.readings(now=t0)}
        assert set(readings) == {(idle, 1), (busy, 1), (fallback, 1)}
        assert readings[(busy, 1)].sm_percent == pytest.approx(85.0, abs=0.01)
        assert readings[(busy, 1)].fb_used_bytes == 110_000 * 2**20
        assert readings[(fallback, 1)].sm_percent == pytest.approx(70.0)
        assert readings[(idle, 1)].sm_percent == pytest.approx(1.5, abs=0.01)

        scheduler_cycle(now=t0 - timedelta(seconds=30))  # admitted and started
        scheduler_cycle(now=t0 - timedelta(seconds=29))  # seen running
        assert set(Job.objects.values_list("status", flat=True)) == {"RUNNING"}

        def minute(i: int) -> datetime:
            return t0 + timedelta(minutes=i, seconds=1)

        for i in range(3):
            scheduler_cycle(now=minute(i))
        assert not JobEvent.objects.filter(kind=JobEvent.Kind.IDLE).exists()
        scheduler_cycle(now=minute(3))  # three minutes below 5%: flagged (rule U2)
        assert list(JobEvent.objects.filter(kind=JobEvent.Kind.IDLE).values_list(
            "job_id", "data__rule")) == [(idle, "U2")]
        scheduler_cycle(now=minute(4))
        assert Job.objects.get(pk=idle).status == "RUNNING"
        scheduler_cycle(now=minute(5))  # two minutes of grace: requeued (rule U3)
        job = Job.objects.get(pk=idle)
        assert job.attempt == 2 and job.status in {"QUEUED", "ADMITTED"}
        assert list(JobEvent.objects.filter(kind=JobEvent.Kind.IDLE).values_list(
            "job_id", "data__rule")) == [(idle, "U2"), (idle, "U3")]

    for job_id, sm in ((busy, 85.0), (fallback, 70.0)):
        job = Job.objects.get(pk=job_id)
        assert (job.status, job.attempt) == ("RUNNING", 1)
        row = AttemptUtilization.objects.get(job_id=job_id, attempt=1)
        assert row.samples == 6 and row.idle_since is None
        assert row.sm_mean == pytest.approx(sm, abs=0.5)
    idle_row = AttemptUtilization.objects.get(job_id=idle, attempt=1)
    assert idle_row.samples == 6 and idle_row.sm_p95 == 1.0
    assert idle_row.idle_since == t0 + timedelta(minutes=3)


def test_a_prometheus_that_does_not_answer_is_no_data_not_idleness(world: World) -> None:
    from .prometheus_harness import free_port

    Tier.objects.filter(pk=world.normal.pk).update(idle_window_minutes=1,
                                                   idle_action="fail", idle_grace_minutes=0)
    job_id = submit(world, env={"FAIRQ_SIM_SECONDS": "7200"})
    t0 = timezone.now().replace(second=0, microsecond=0)
    with override_settings(FAIRQ_PROMETHEUS_URL=f"http://127.0.0.1:{free_port()}"):
        reset_backends()
        scheduler_cycle(now=t0 - timedelta(seconds=30))
        for i in range(4):
            result = scheduler_cycle(now=t0 + timedelta(minutes=i, seconds=1))
            assert result.ran and not result.job_errors
    assert Job.objects.get(pk=job_id).status == "RUNNING"
    assert not AttemptUtilization.objects.exists()
