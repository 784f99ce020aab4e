"""Idle GPUs end to end on the real control plane with a real Prometheus
(docs/scheduling.md, "Idle GPUs"): two jobs run as Kubernetes Jobs; a DCGM-format exporter
of our own serves dcgm-exporter's metrics for their real pods (names from the API
server), a real Prometheus scrapes it, fairq's one query reads it; the idle one is
flagged within its window and requeued per its tier's rule (its Job deleted), the busy one
is untouched.

The fake kubelet has no GPUs, so the exporter is told what each pod's GPUs do; everything
else is real. Cycles run with `now` a minute apart (the rules count minutes) while the
cluster and Prometheus run on the wall clock."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from tests.envtest.test_k8s_backend import Kube, job, kube, submit, wait
from tests.prometheus_harness import (
    DcgmExporter,
    Gpu,
    PrometheusServer,
    exporter,
    prometheus,
    wait_until,
)

__all__ = ["exporter", "kube", "prometheus"]  # the fixtures, imported for this module

pytestmark = [pytest.mark.k8s, pytest.mark.django_db(transaction=True)]




def test_the_idle_job_is_flagged_and_requeued_the_busy_one_untouched(
        kube: Kube, world: Any, settings: Any, exporter: DcgmExporter,
        prometheus: PrometheusServer) -> None:
    from queueing.models import AttemptUtilization, JobEvent, Tier
    from queueing.services.scheduler import scheduler_cycle

    Tier.objects.filter(pk=world.low.pk).update(
        idle_threshold_percent=5, idle_window_minutes=2, idle_action="requeue",
        idle_grace_minutes=1)
    idle = submit(world, gpus=2, tier="low", env={"FAIRQ_SIM_SECONDS": "600"})
    busy = submit(world, gpus=2, tier="low", env={"FAIRQ_SIM_SECONDS": "600"})
    wait(lambda: job(idle).status == "RUNNING" and job(busy).status == "RUNNING",
         timeout=60, what="both jobs running")
    ns = kube.ns("vision")
    [idle_pod] = [p["metadata"]["name"] for p in kube.pods("vision", f"fq-{idle}-1")]
    [busy_pod] = [p["metadata"]["name"] for p in kube.pods("vision", f"fq-{busy}-1")]
    with exporter.lock:
        exporter.pods = {(ns, idle_pod): [Gpu(0.5, 800)] * 2,
                         (ns, busy_pod): [Gpu(92.0, 70_000), Gpu(88.0, 65_000)]}
    wait_until(lambda: len(prometheus.query(
        f'count by (pod) (DCGM_FI_DEV_FB_USED{{namespace="{ns}"}})')) == 2,
        what="Prometheus to scrape both pods")

    # From now on the cycle's utilization source is this Prometheus (built on first use;
    # the fixture's Kubernetes backend stays).
    settings.FAIRQ_PROMETHEUS_URL = prometheus.url
    t0 = timezone.now().replace(second=0, microsecond=0) + timedelta(minutes=1)
    for i in range(3):  # minutes 0..2: a run of 2 minutes below 5%: flagged (U2)
        scheduler_cycle(now=t0 + timedelta(minutes=i, seconds=1))
    assert list(JobEvent.objects.filter(kind="idle").values_list(
        "job_id", "data__rule")) == [(idle, "U2")]
    assert job(idle).status == "RUNNING"
    scheduler_cycle(now=t0 + timedelta(minutes=3, seconds=1))  # a minute of grace: U3
    requeued = job(idle)
    assert requeued.attempt == 2 and requeued.status in {"QUEUED", "ADMITTED", "RUNNING"}
    assert list(JobEvent.objects.filter(kind="idle").values_list(
        "job_id", "data__rule")) == [(idle, "U2"), (idle, "U3")]
    # Its attempt's Job is gone from the cluster (its GPUs with it).
    wait(lambda: not kube.job_exists("vision", f"fq-{idle}-1"), cycle=False,
         timeout=60, what="the idle attempt's Job deleted")
    assert (job(busy).status, job(busy).attempt) == ("RUNNING", 1)
    busy_row = AttemptUtilization.objects.get(job_id=busy, attempt=1)
    assert busy_row.samples == 4 and busy_row.idle_since is None
    assert busy_row.sm_mean == pytest.approx(90.0, abs=0.5)
    assert busy_row.mem_max_bytes == 135_000 * 2**20
    assert not JobEvent.objects.filter(job_id=busy, kind="idle").exists()
    # Both appear in the accounting (like sacct, `fairq acct`) with their efficiency: the
    # idle attempt ended (requeued) at about 0.5% SM activity, the busy one runs at 90%.
    r = world.client(world.member).get("/api/v1/accounting/", {"team": "vision"})
    assert r.status_code == 200, r.content
    rows = {(row["job_id"], row["attempt"]): row for row in r.json()["results"]}
    assert rows[(idle, 1)]["state"] in {"REQUEUED", "PREEMPTED"}
    assert rows[(idle, 1)]["efficiency"] == pytest.approx(0.005, abs=0.001)
    assert rows[(busy, 1)]["state"] == "RUNNING" and rows[(busy, 1)]["end"] is None
    assert rows[(busy, 1)]["efficiency"] == pytest.approx(0.90, abs=0.005)
