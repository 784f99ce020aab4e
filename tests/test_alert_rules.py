"""platform/prometheus/fairq-alerts.yaml: well-formed rules that only use metrics fairq
exports (a renamed metric must not leave an alert that can never fire)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

RULES = Path(__file__).resolve().parents[1] / "platform" / "prometheus" / "fairq-alerts.yaml"


@pytest.mark.django_db
def test_every_alert_uses_a_metric_fairq_exports() -> None:
    from queueing.metrics import FairqCollector
    from queueing.services.metrics import (
        record_cycle,
        record_cycle_failure,
        record_submit_error,
    )
    from queueing.services.scheduler import CycleResult

    # Counters appear once they have counted something.
    record_submit_error("403")
    record_cycle(CycleResult(timings={"total": 0.1}, job_errors={1: "ValueError"}))
    record_cycle_failure("c0ffee")
    # The per-team GPU gauges appear for teams holding GPUs, the depth for queued jobs.
    from tests.factories import GpuTypeFactory, JobFactory, TeamFactory, TierFactory

    for status in ("RUNNING", "QUEUED"):
        JobFactory(team=TeamFactory(slug="vision"), gpu_type=GpuTypeFactory(slug="h100"),
                   tier=TierFactory(slug="normal"), status=status)
    # The budget gauge appears for teams with a budget.
    from decimal import Decimal

    from queueing.models import TeamBudget

    TeamBudget.objects.create(team=TeamFactory(slug="nlp"), monthly_amount=Decimal(100))
    # The reachability gauge appears for configured clusters (rule K5).
    from queueing.models import Cluster

    Cluster.objects.create(name="onprem", sim_nodes="1x8xh100")
    exported = {s.name for m in FairqCollector().collect() for s in m.samples}
    doc = yaml.safe_load(RULES.read_text())
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == {
        "FairqSchedulerStale", "FairqSchedulerBehind", "FairqSchedulerNeverCompleted",
        "FairqCycleFailures",
        "FairqJobsIsolated", "FairqKubernetesRefusesJobs", "FairqKubernetesSubmitErrors",
        "FairqIdleGpus", "FairqQueueStuck", "FairqBudgetReached", "FairqClusterUnreachable"}
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert rule["labels"]["severity"] in ("warning", "critical")
        assert rule["annotations"]["summary"]
        names = set(re.findall(r"\bfairq_[a-z0-9_]+", rule["expr"]))
        assert names and names <= exported, (rule["alert"], names - exported)


# --- promtool: the file loads in Prometheus, and each alert fires when it should ---------

def _promtool() -> str:
    import os
    import shutil

    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("FAIRQ_REQUIRE_PROMETHEUS") == "1":
            pytest.fail("promtool is missing and FAIRQ_REQUIRE_PROMETHEUS=1 (run `make prometheus`)")
        pytest.skip("promtool is missing (Debian's prometheus: `make prometheus`); "
                    "set FAIRQ_REQUIRE_PROMETHEUS=1 to make this a failure")
    return found


def test_the_rules_file_passes_promtool_check() -> None:
    import subprocess

    out = subprocess.run([_promtool(), "check", "rules", str(RULES)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS: 11 rules found" in out.stdout, out.stdout


# Each case: input series (promtool's expanding notation, 1 m steps), when to evaluate,
# and the alerts expected then (empty: quiet). A fired alert is named with its labels.
PROMTOOL_TESTS = """
rule_files: [{rules}]
evaluation_interval: 1m
tests:
  # The last success keeps pace with the clock (t = 60 s * step): quiet. Then it stops
  # at 600 s while time goes on: stale after 60 s plus the rule's 1 m.
  - interval: 1m
    input_series:
      - series: fairq_cycle_last_success_timestamp_seconds
        values: "0+60x10 600x10"
    alert_rule_test:
      - {{eval_time: 9m, alertname: FairqSchedulerStale, exp_alerts: []}}
      - eval_time: 15m
        alertname: FairqSchedulerStale
        exp_alerts: [{stale}]
  # Cycles 3 s apart, then 20 s apart from minute 10 (the limit 15 s): behind after the
  # rule's 5 m, quiet again once they keep pace.
  - interval: 1m
    input_series:
      - series: fairq_cycle_longest_gap_seconds
        values: "3x9 20x10 3x10"
      - series: fairq_cycle_behind_after_seconds
        values: "15x30"
    alert_rule_test:
      - {{eval_time: 13m, alertname: FairqSchedulerBehind, exp_alerts: []}}
      - eval_time: 17m
        alertname: FairqSchedulerBehind
        exp_alerts: [{behind}]
      - {{eval_time: 25m, alertname: FairqSchedulerBehind, exp_alerts: []}}
  # No gauge at all for 5 minutes: never completed.
  - interval: 1m
    input_series:
      - series: fairq_cycle_failures_total
        values: "0x10"
    alert_rule_test:
      - eval_time: 6m
        alertname: FairqSchedulerNeverCompleted
        exp_alerts: [{never}]
      - {{eval_time: 6m, alertname: FairqCycleFailures, exp_alerts: []}}
  # Failures and isolated jobs counted: both fire.
  - interval: 1m
    input_series:
      - series: fairq_cycle_failures_total
        values: "0 0 0 1 2 3"
      - series: fairq_cycle_job_errors_total
        values: "0 0 0 0 1 1"
      - series: fairq_cycle_last_success_timestamp_seconds
        values: "0+60x5"
    alert_rule_test:
      - eval_time: 5m
        alertname: FairqCycleFailures
        exp_alerts: [{failures}]
      - eval_time: 5m
        alertname: FairqJobsIsolated
        exp_alerts: [{isolated}]
  # A 403 on create fires at once (after its 1 m); a 500 only once it lasts 10 minutes.
  - interval: 1m
    input_series:
      - series: 'fairq_k8s_submit_errors_total{{code="403"}}'
        values: "0 0 1 1 1 1"
      - series: 'fairq_k8s_submit_errors_total{{code="500"}}'
        values: "0+10x20"
    alert_rule_test:
      - eval_time: 4m
        alertname: FairqKubernetesRefusesJobs
        exp_alerts: [{refused_403}]
      - {{eval_time: 5m, alertname: FairqKubernetesSubmitErrors, exp_alerts: []}}
      - eval_time: 17m
        alertname: FairqKubernetesSubmitErrors
        exp_alerts: [{errors_500}]
  # Team vision's 4 GPUs are idle from minute 5: after 30 minutes more, the alert; nlp's
  # idle GPUs went back to 0 after 20 minutes: quiet.
  - interval: 1m
    input_series:
      - series: 'fairq_team_gpus_idle{{team="vision"}}'
        values: "0x4 4x60"
      - series: 'fairq_team_gpus_idle{{team="nlp"}}'
        values: "2x20 0x40"
    alert_rule_test:
      - {{eval_time: 30m, alertname: FairqIdleGpus, exp_alerts: []}}
      - eval_time: 40m
        alertname: FairqIdleGpus
        exp_alerts: [{idle_vision}]
  # Three jobs queued; admissions stop at minute 10: stuck from 40 (30 m without an
  # admission) plus the rule's 15 m.
  - interval: 1m
    input_series:
      - series: 'fairq_queue_depth{{team="vision",tier="normal"}}'
        values: "3x80"
      - series: fairq_admissions_total
        values: "0+1x10 10x70"
    alert_rule_test:
      - {{eval_time: 50m, alertname: FairqQueueStuck, exp_alerts: []}}
      - eval_time: 60m
        alertname: FairqQueueStuck
        exp_alerts: [{stuck}]
  # vision reaches its budget at minute 10 (a ratio of 1.2 from then); nlp stays at 0.9:
  # after the rule's 5 m, vision only.
  - interval: 1m
    input_series:
      - series: 'fairq_team_budget_used_ratio{{team="vision"}}'
        values: "0.5+0.05x9 1.2x30"
      - series: 'fairq_team_budget_used_ratio{{team="nlp"}}'
        values: "0.9x40"
    alert_rule_test:
      - {{eval_time: 12m, alertname: FairqBudgetReached, exp_alerts: []}}
      - eval_time: 20m
        alertname: FairqBudgetReached
        exp_alerts: [{budget_vision}]
  # Cluster cloud stops answering at minute 5 (rule K5); onprem answers throughout:
  # after the rule's 2 m, cloud only; quiet again once it answers.
  - interval: 1m
    input_series:
      - series: 'fairq_cluster_reachable{{cluster="cloud"}}'
        values: "1x4 0x10 1x10"
      - series: 'fairq_cluster_reachable{{cluster="onprem"}}'
        values: "1x25"
    alert_rule_test:
      - {{eval_time: 6m, alertname: FairqClusterUnreachable, exp_alerts: []}}
      - eval_time: 10m
        alertname: FairqClusterUnreachable
        exp_alerts: [{unreachable_cloud}]
      - {{eval_time: 20m, alertname: FairqClusterUnreachable, exp_alerts: []}}
"""


def test_each_alert_fires_when_it_should_and_not_before(tmp_path: Path) -> None:
    import subprocess

    rules = {r["alert"]: r for g in yaml.safe_load(RULES.read_text())["groups"]
             for r in g["rules"]}

    def fired(alert: str, value: str = "", **labels: str) -> str:
        """The alert as promtool reports it: the rule's labels plus the series' own, and
        its annotations with the series' labels filled in."""
        rule = rules[alert]
        annotations = {}
        for key, text in rule["annotations"].items():
            for name, label in labels.items():
                text = text.replace("{{ $labels." + name + " }}", label)
            text = text.replace("{{ $value }}", value)
            assert "{{" not in text, (alert, key, text)
            annotations[key] = text
        return json.dumps({"exp_labels": {**rule["labels"], **labels},
                           "exp_annotations": annotations})

    tests = tmp_path / "fairq-alerts-test.yaml"
    tests.write_text(PROMTOOL_TESTS.format(
        rules=json.dumps(str(RULES)), stale=fired("FairqSchedulerStale"),
        behind=fired("FairqSchedulerBehind", "20"),
        never=fired("FairqSchedulerNeverCompleted"), failures=fired("FairqCycleFailures"),
        isolated=fired("FairqJobsIsolated"),
        refused_403=fired("FairqKubernetesRefusesJobs", code="403"),
        errors_500=fired("FairqKubernetesSubmitErrors", code="500"),
        idle_vision=fired("FairqIdleGpus", "4", team="vision"),
        stuck=fired("FairqQueueStuck", "3"),
        budget_vision=fired("FairqBudgetReached", "1.2", team="vision"),
        unreachable_cloud=fired("FairqClusterUnreachable", "0", cluster="cloud")))
    out = subprocess.run([_promtool(), "test", "rules", str(tests)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout, out.stdout
