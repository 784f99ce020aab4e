"""Web processes read what the worker publishes: the cluster view (each
cycle) and archived job logs (bounded, refreshed, kept after the pod is gone), never the
backend. On the simulated cluster, driven with explicit time."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.cache import cache
from django.utils import timezone

from queueing.composition import get_backend
from queueing.models import Job, JobLog
from queueing.selectors.cluster import VIEW_KEY as _VIEW_KEY
from queueing.selectors.cluster import ClusterView, cluster_view, largest_node_gpus
from queueing.services.logs import bound_log_text, job_log_read, job_logs_archive, log_storage
from queueing.services.scheduler import scheduler_cycle

from .conftest import World
from .test_cycle import submit

pytestmark = pytest.mark.django_db


def _backend_down(monkeypatch: pytest.MonkeyPatch) -> None:
    def down(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a web read went to the cluster backend")

    backend = get_backend()
    for method in ("nodes", "statuses", "logs"):
        monkeypatch.setattr(backend, method, down)


def test_the_cycle_publishes_the_view_and_web_reads_use_it_not_the_backend(
    world: World, monkeypatch: pytest.MonkeyPatch,
) -> None:
    t0 = timezone.now()
    job_id = submit(world, gpus=4, env={"FAIRQ_SIM_SECONDS": "600"})
    scheduler_cycle(now=t0)
    assert cluster_view().published_at == t0
    scheduler_cycle(now=t0 + timedelta(seconds=1))  # lists what the last one submitted
    view = cluster_view()
    assert view.published_at == t0 + timedelta(seconds=1)
    assert f"fq-{job_id}-1" in view.workloads
    assert sum(n.allocated for n in view.nodes() if n.gpu_type == "h100") == 4

    _backend_down(monkeypatch)
    queued = submit(world, gpus=8, replicas=2)  # validated against the view's nodes
    r = world.client(world.member).post("/api/v1/jobs/", {
        "team": "vision", "name": "big", "image": "ghcr.io/acme/x:1", "gpu_type": "h100",
        "gpus": 9, "tier": "normal"}, format="json")
    assert r.status_code == 400 and "largest has 8" in str(r.json())
    detail = world.client(world.member).get(f"/api/v1/jobs/{queued}/")
    assert detail.status_code == 200 and detail.json()["queue"]["position"] == 1
    assert world.client(world.member).get("/api/v1/capacity/").status_code == 200


def test_a_stale_or_missing_view_says_so(world: World, settings: Any) -> None:
    old = timezone.now() - timedelta(minutes=10)
    cache.set(_VIEW_KEY, ClusterView(published_at=old).to_dict())
    assert "600 s old" in cluster_view().stale(timezone.now())
    cache.delete(_VIEW_KEY)
    settings.FAIRQ_CLUSTER_BACKEND = "kubernetes"  # nothing published, no cluster client
    view = cluster_view()
    assert view.published_at is None and "not published" in view.error
    assert largest_node_gpus("h100") is None  # unknown: submit does not refuse on it


def test_jobs_of_an_unprovisioned_team_wait_with_the_reason(world: World) -> None:
    job_id = submit(world, team="vision")
    view = ClusterView(node_list=tuple(get_backend().nodes()), unprovisioned=frozenset({"vision"}),
                       published_at=timezone.now())
    cache.set(_VIEW_KEY, view.to_dict())
    reasons = world.client(world.member).get(f"/api/v1/jobs/{job_id}/").json()["queue"]["reasons"]
    assert [r["code"] for r in reasons] == ["namespace_not_provisioned"]


def test_the_worker_archives_logs_and_the_web_reads_only_the_copy(
    world: World, monkeypatch: pytest.MonkeyPatch, settings: Any,
) -> None:
    settings.FAIRQ_LOG_ARCHIVE_SECONDS = 30
    t0 = timezone.now() - timedelta(minutes=5)
    job_id = submit(world, env={"FAIRQ_SIM_SECONDS": "60"})
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    job = Job.objects.get(pk=job_id)
    assert job.status == "RUNNING"
    backend = get_backend()

    assert job_logs_archive(backend=backend, now=t0 + timedelta(seconds=2)).refreshed == [job_id]
    first = JobLog.objects.get(job=job, attempt=1)
    assert first.text == backend.logs(job.backend_name, tail=1000) and not first.final
    # Not due again before FAIRQ_LOG_ARCHIVE_SECONDS; due after.
    assert job_logs_archive(backend=backend, now=t0 + timedelta(seconds=10)).refreshed == []
    assert job_logs_archive(backend=backend, now=t0 + timedelta(seconds=40)).refreshed == [job_id]

    scheduler_cycle(now=t0 + timedelta(seconds=61))
    assert Job.objects.get(pk=job_id).status == "SUCCEEDED"
    # The pod is gone (TTL): the last copy stays, read once more and then never again.
    monkeypatch.setattr(backend, "logs", lambda name, tail=100: "")
    assert job_logs_archive(backend=backend, now=t0 + timedelta(seconds=62)).refreshed == [job_id]
    row = JobLog.objects.get(job=job, attempt=1)
    # Kept in the log storage once the attempt ended, no longer in the row.
    assert row.final and row.text == "" and row.stored
    assert log_storage().open(row.stored).read().decode() == first.text
    assert job_logs_archive(backend=backend, now=t0 + timedelta(seconds=99)).refreshed == []

    _backend_down(monkeypatch)
    assert job_log_read(job=Job.objects.get(pk=job_id), tail=100).lines == (
        first.text.splitlines()[-100:])
    r = world.client(world.member).get(f"/api/v1/jobs/{job_id}/logs/?tail=1")
    assert r.status_code == 200 and r.json()["lines"] == first.text.splitlines()[-1:]


def test_archived_logs_are_bounded_in_lines_and_bytes() -> None:
    text = "\n".join(f"line {i}" for i in range(5000))
    assert bound_log_text(text, lines=10, max_bytes=10_000).splitlines() == [
        f"line {i}" for i in range(4990, 5000)]
    cut = bound_log_text(text, lines=5000, max_bytes=1000)
    assert len(cut.encode()) <= 1000 and cut.endswith("line 4999")
    assert len(bound_log_text("x" * 5000, lines=10, max_bytes=100)) == 100
