"""fairq's own usage history as a workload (queueing/simulator/history.py;
docs/simulator.md, "fairq's own history"): the CSV `manage.py export_usage` writes,
replayed on a scenario's cluster."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from queueing.models import UsageRecord
from queueing.simulator.cli import main
from queueing.simulator.history import load_usage_history
from queueing.simulator.scenario import ScenarioError, parse_scenario
from tests.factories import GpuTypeFactory, TeamFactory

SCENARIO: dict[str, Any] = {
    "cluster": {"node_pools": [{"name": "h", "gpu_type": "h100", "nodes": 2, "gpus_per_node": 8}]},
    "teams": [{"name": "vision", "weight": 3}, {"name": "nlp", "weight": 1}],
    "tiers": [{"name": "high", "rank": 30}, {"name": "normal", "rank": 20}],
}
HEADER = "team,gpu_type,gpus,start,end\n"


def _csv(tmp_path: Path, rows: str) -> Path:
    f = tmp_path / "usage.csv"
    f.write_text(HEADER + rows)
    return f


def test_each_usage_row_becomes_a_job_from_the_first_start(tmp_path: Path) -> None:
    f = _csv(tmp_path, "vision,h100,16,2026-01-01T01:00:00+00:00,2026-01-01T03:00:00+00:00\n"
                       "nlp,h100,3,2026-01-01T00:00:00+00:00,2026-01-01T00:30:00+00:00\n"
                       "nlp,h100,1,2026-01-01T00:10:00+00:00,2026-01-01T00:10:00+00:00\n")
    w = load_usage_history(f, parse_scenario(SCENARIO))
    assert [(j.team, j.submit, j.runtime, j.gpus_per_replica, j.replicas, j.tier)
            for j in w.jobs] == [("nlp", 0, 1800, 3, 1, "normal"),
                                 ("vision", 3600, 7200, 8, 2, "normal")]
    assert w.horizon == 3600
    assert load_usage_history(f, parse_scenario(SCENARIO), tier="high").jobs[0].tier == "high"


@pytest.mark.parametrize(("rows", "message"), [
    ("ops,h100,1,2026-01-01T00:00:00+00:00,2026-01-01T01:00:00+00:00\n", ":2: team 'ops'"),
    ("nlp,a100,1,2026-01-01T00:00:00+00:00,2026-01-01T01:00:00+00:00\n", ":2: no node pool"),
    ("nlp,h100,x,2026-01-01T00:00:00+00:00,2026-01-01T01:00:00+00:00\n", ":2: gpus 'x'"),
    ("nlp,h100,17,2026-01-01T00:00:00+00:00,2026-01-01T01:00:00+00:00\n", ":2: 17 h100 GPUs never"),
    ("nlp,h100,1,2026-01-01T00:00:00,2026-01-01T01:00:00+00:00\n", ":2: '2026-01-01T00:00:00' has no"),
    ("nlp,h100,1,yesterday,2026-01-01T01:00:00+00:00\n", ":2: 'yesterday' is not"),
])
def test_a_bad_row_is_refused_with_its_line(tmp_path: Path, rows: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        load_usage_history(_csv(tmp_path, rows), parse_scenario(SCENARIO))


@pytest.mark.django_db
def test_what_if_on_the_export_of_real_usage(tmp_path: Path) -> None:
    gt = GpuTypeFactory(slug="h100")
    vision, nlp = TeamFactory(slug="vision", weight=3), TeamFactory(slug="nlp", weight=1)
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    for i in range(6):
        for team, gpus in ((vision, 8), (nlp, 4)):
            start = t0 + timedelta(minutes=20 * i)
            end = start + timedelta(hours=1)
            UsageRecord.objects.create(team=team, gpu_type=gt, gpus=gpus, start=start, end=end,
                                       gpu_seconds=gpus * 3600.0)
    usage = tmp_path / "usage.csv"
    call_command("export_usage", str(usage))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(json.dumps(SCENARIO))  # JSON is YAML
    out = tmp_path / "out.json"
    assert main(["--scenario", str(scenario), "--history", str(usage), "--quiet",
                 "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["source"]["kind"] == "usage-history" and doc["source"]["rows"] == 12
    for p in doc["policies"].values():
        assert p["overall"]["jobs"] == 12 and p["unfinished_jobs"] == 0
    # 72 GPU-h asked of 16 GPUs from 0 to 100 min: nobody can deliver more than that.
    assert doc["policies"]["greedy"]["overall"]["delivered_gpu_hours"] <= 16 * 100 / 60
    assert main(["--history", str(usage), "--quiet"]) == 2
