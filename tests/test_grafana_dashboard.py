"""platform/grafana/fairq-dashboard.json: a well-formed Grafana dashboard whose queries use
only metrics fairq exports and that a real Prometheus parses."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from .prometheus_harness import prometheus_server

DASHBOARD = Path(__file__).resolve().parents[1] / "platform" / "grafana" / "fairq-dashboard.json"


def dashboard() -> dict[str, Any]:
    doc = json.loads(DASHBOARD.read_text())
    assert isinstance(doc, dict)
    return doc


def exprs() -> list[str]:
    return [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]


def test_the_dashboard_is_well_formed() -> None:
    doc = dashboard()
    assert doc["uid"] == "fairq-overview" and doc["title"] and doc["schemaVersion"] >= 36
    panels = doc["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for p in panels:
        assert p["type"] in {"timeseries", "stat"} and p["title"] and p["targets"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
        assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
    assert {v["name"] for v in doc["templating"]["list"]} == {"datasource", "team"}


@pytest.mark.django_db
def test_every_query_uses_metrics_fairq_exports() -> None:
    from queueing.metrics import FairqCollector
    from queueing.services.metrics import record_cycle, record_cycle_failure, record_queue_waits
    from queueing.services.scheduler import CycleResult
    from tests.factories import GpuTypeFactory, JobFactory, TeamFactory, TierFactory

    team, gpu, tier = TeamFactory(slug="vision"), GpuTypeFactory(slug="h100"), \
        TierFactory(slug="normal")
    from django.utils import timezone

    from queueing.models import AttemptUtilization, JobEvent

    now = timezone.now()
    running = JobFactory(team=team, gpu_type=gpu, tier=tier, status="RUNNING", admitted_at=now)
    JobFactory(team=team, gpu_type=gpu, tier=tier)
    JobEvent.objects.create(job=running, at=now, kind="transition", to_status="QUEUED")
    JobEvent.objects.create(job=running, at=now, kind="preempted", data={"rule": "R1"})
    AttemptUtilization.objects.create(job=running, attempt=1, first_at=now, last_at=now,
                                      samples=1, sm_last=50.0)
    record_queue_waits([running.pk])
    record_cycle(CycleResult(timings={"total": 0.1}))
    record_cycle_failure("c0ffee")
    exported = {s.name for m in FairqCollector().collect() for s in m.samples}
    for expr in exprs():
        names = set(re.findall(r"\bfairq_[a-z0-9_]+", expr))
        assert names and names <= exported, (expr, names - exported)


def test_a_real_prometheus_parses_every_query(tmp_path: Path) -> None:
    with prometheus_server(tmp_path, targets=[]) as prometheus:
        for expr in exprs():
            concrete = expr.replace("$__rate_interval", "1m").replace("$team", ".*")
            prometheus.query(concrete)  # raises unless Prometheus answers "success"
