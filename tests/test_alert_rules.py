"""platform/prometheus/fairq-alerts.yaml: well-formed rules that only use metrics fairq
exports (a renamed metric must not leave an alert that can never fire)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

RULES = Path(__file__).resolve().parents[1] / "platform" / "prometheus" / "fairq-alerts.yaml"


@pytest.mark.django_db
def test_every_alert_uses_a_metric_fairq_exports() -> None:
    from queueing.metrics import FairqCollector, record_submit_error

    record_submit_error("403")  # a counter appears once it has counted something
    exported = {s.name for m in FairqCollector().collect() for s in m.samples}
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} >= {"FairqKubernetesRefusesJobs",
                                           "FairqKubernetesSubmitErrors"}
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]
        names = set(re.findall(r"\bfairq_[a-z0-9_]+", rule["expr"]))
        assert names and names <= exported, (rule["alert"], names - exported)
