"""`make demo`'s reports show something at once (README.md): the seeded past is priced for
every team (rule C1), its GPUs were busy or idle minute by minute (rules U5, C3: used,
idle, efficiency), two teams have budgets (rule B1, nlp's past 80%: rule B2), and the
reports page's default range is the days the data fills."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils import timezone

from accounts.models import Team
from queueing.models import AttemptUtilization, JobEvent, UsageRecord, UtilizationSample
from queueing.selectors.budgets import budget_statuses
from queueing.selectors.costs import cost_buckets
from queueing.services.demo import demo_clusters_seed, demo_history_seed, demo_seed

pytestmark = pytest.mark.django_db


def _seed(now: datetime) -> Any:
    demo_seed()
    demo_clusters_seed()
    return demo_history_seed(now=now)


def test_the_seeded_demo_prices_every_teams_gpu_hours_and_shows_efficiency_and_budgets(
        ) -> None:
    # Seeded as of the middle of last month: its budgets' month holds days of the past
    # whatever today is (on the 1st at 00:10, this month would hold none).
    now = timezone.now().replace(day=15, hour=12, minute=0, second=0,
                                 microsecond=0) - timedelta(days=31)
    _seed(now)
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for b in cost_buckets(teams=Team.objects.all(), start=now - timedelta(days=6), end=now,
                          period="day", now=now):
        t = totals[b.team]
        t["allocated"] += b.allocated_gpu_hours
        t["used"] += b.used_gpu_hours
        t["idle"] += b.idle_gpu_hours
        t["unpriced"] += b.unpriced_gpu_hours
        t["cost"] += float(b.cost)
    assert set(totals) == {"vision", "nlp", "speech", "recsys"}
    for team, t in totals.items():
        assert t["allocated"] > 50, team
        assert t["unpriced"] == 0, team  # every GPU-hour priced (rule C1)
        assert t["cost"] >= 0.25 * t["allocated"], team  # the cheapest list price
        assert 0.2 < t["used"] / t["allocated"] < 0.95, team  # efficiency, rule U5
        assert t["idle"] > 0, team  # paid but idle minutes (rule C3)
    # The teams differ: vision's GPUs were the busiest, recsys's the least.
    eff = {team: t["used"] / t["allocated"] for team, t in totals.items()}
    assert eff["vision"] > eff["nlp"] > eff["speech"] > eff["recsys"]
    # Each past run is a finished job with its events and its minutes of GPU activity.
    record = UsageRecord.objects.select_related("job").first()
    assert record is not None and record.job is not None
    assert list(JobEvent.objects.filter(job=record.job).values_list("to_status", flat=True)) \
        == ["QUEUED", "ADMITTED", "RUNNING", record.job.status]
    summary = AttemptUtilization.objects.get(job=record.job, attempt=1)
    minutes = int((record.end - record.start).total_seconds() // 60)
    assert summary.samples == minutes
    assert UtilizationSample.objects.filter(job=record.job).count() == minutes
    # Budgets: vision's well within, nlp's past rule B2's 80% warning.
    status = {s.team: s for s in budget_statuses(now=now)}
    assert set(status) == {"vision", "nlp"}
    assert status["nlp"].reached == 80 and status["vision"].reached is None
    assert status["vision"].cost > 0
    # A second seed changes nothing.
    again = demo_history_seed(now=now)
    assert (again.jobs, again.prices, again.budgets) == (0, 0, 0)


def test_the_reports_page_defaults_to_the_days_the_seeded_data_fills() -> None:
    _seed(timezone.now())
    client = Client()
    client.force_login(get_user_model().objects.get(username="admin"))
    html = client.get("/reports/").content.decode()
    chart = json.loads(re.search(r'id="report-series" type="application/json">(.*?)</script>',
                                 html, re.S)[1])
    allocated = chart["hours"]["allocated"]
    # By day from the first day of the four days of history: every day but perhaps
    # today's first half hour holds GPU time.
    assert 4 <= len(allocated) <= 6, allocated
    assert all(v > 0 for v in allocated[:-1]), allocated
    assert "from the first day with GPU time" in html
    assert '<option value="day" selected>' in html
    # The per-team table: non-zero efficiency and cost for every team.
    rows = re.findall(r"<tr><td>(\w+)</td><td>\w+</td>(.*?)</tr>", html, re.S)
    assert {team for team, _ in rows} == {"vision", "nlp", "speech", "recsys"}
    for team, cells in rows:
        values = re.findall(r'<td class="num">([^<]*)</td>', cells)
        efficiency, cost = values[2], values[6]  # after preempted and lost GPU-h
        assert efficiency.endswith("%") and int(efficiency[:-1]) >= 20, (team, values)
        assert float(cost) > 0, (team, values)
