"""Fair-share services: `manage.py fairshare`, GET /api/v1/fairshare/, standings at a
past instant, full recompute, the entry penalty of admitted jobs (F6), snapshots."""

from __future__ import annotations

import io
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from queueing.models import FairShareAccumulator, FairShareSnapshot, UsageRecord
from queueing.policy.fairshare import decayed_interval_usage, entry_penalty_gpu_hours
from queueing.selectors.fairshare import (
    fairshare_history,
    fairshare_standings,
    fairshare_standings_at,
)
from queueing.services.fairshare import fairshare_recompute, fairshare_snapshot_take
from queueing.services.usage import usage_import_csv
from queueing.tasks import fairshare_snapshot_task

from .conftest import World
from .factories import JobFactory

H = 168.0
T = datetime(2026, 3, 1, tzinfo=UTC)
CSV = """team,gpu_type,gpus,start,end
vision,h100,8,2026-02-27T00:00:00+00:00,2026-02-28T00:00:00+00:00
nlp,a100,4,2026-02-20T00:00:00+00:00,2026-02-22T00:00:00+00:00
nlp,a100,2,2026-02-28T12:00:00+00:00,2026-03-01T00:00:00+00:00
"""


@pytest.fixture
def used(world: World) -> World:
    usage_import_csv(stream=io.StringIO(CSV), now=timezone.now())
    return world


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("fairshare", *args, stdout=out)
    return out.getvalue()


def test_the_command_prints_sshare_like_standings_and_the_instant(used: World) -> None:
    text = run("--at", "2026-03-01T00:00:00+00:00")
    assert "as_of 2026-03-01T00:00:00+00:00" in text
    assert "share S" in text and "usage GPU-h" in text
    lines = {ln.split()[0]: ln.split() for ln in text.splitlines()[3:]}
    assert set(lines) == {"vision", "nlp", "speech"}
    assert lines["speech"][-2:] == ["1.0000", "(inactive)"]  # F = 1, no usage, no job


def test_json_and_api_give_the_same_numbers_under_the_same_names(used: World) -> None:
    doc = json.loads(run("--json", "--at", "2026-03-01T00:00:00Z"))
    assert doc["as_of"] == "2026-03-01T00:00:00+00:00"
    api = used.client(used.staff).get("/api/v1/fairshare/?at=2026-03-01T00:00:00Z").json()
    assert api["as_of"] == doc["as_of"]
    assert api["teams"] == doc["teams"]
    assert set(doc["teams"][0]) == {
        "team", "parent", "weight", "share", "level_share", "usage_gpu_hours",
        "usage_fraction", "normalized_usage", "fair_share_factor", "active"}


def test_the_api_refuses_a_bad_instant(world: World) -> None:
    r = world.client(world.member).get("/api/v1/fairshare/?at=yesterday")
    assert r.status_code == 400


def test_only_staff_may_ask_the_api_for_a_past_instant(world: World) -> None:
    r = world.client(world.member).get("/api/v1/fairshare/?at=2026-03-01T00:00:00Z")
    assert r.status_code == 400 and "staff" in r.content.decode()
    now = world.client(world.member).get("/api/v1/fairshare/").json()
    assert {t["team"] for t in now["teams"]} == {"vision"}  # only the caller's teams
    future = (timezone.now() + timedelta(hours=1)).isoformat().replace("+00:00", "Z")
    r = world.client(world.member).get(f"/api/v1/fairshare/?at={future}")
    assert r.status_code == 200


@pytest.mark.parametrize("bad", ["yesterday", "2026-03-01T00:00:00"])
def test_the_command_refuses_a_bad_instant(world: World, bad: str) -> None:
    with pytest.raises(CommandError, match="--at"):
        run("--at", bad)


def test_standings_at_a_past_instant_cut_the_intervals_there(used: World) -> None:
    at = datetime(2026, 2, 27, 12, tzinfo=UTC)  # half-way through vision's day
    st = fairshare_standings_at(at=at, now=timezone.now())
    want = decayed_interval_usage(rate=16, start=datetime(2026, 2, 27, tzinfo=UTC), end=at,
                                  as_of=at, half_life_hours=H)
    assert st["vision"].usage == pytest.approx(want, rel=1e-9)
    nlp = decayed_interval_usage(rate=4, start=datetime(2026, 2, 20, tzinfo=UTC),
                                 end=datetime(2026, 2, 22, tzinfo=UTC), as_of=at,
                                 half_life_hours=H)
    assert st["nlp"].usage == pytest.approx(nlp, rel=1e-9)


def test_past_standings_equal_the_accumulators_at_the_last_record(used: World) -> None:
    past = fairshare_standings_at(at=T, now=timezone.now())
    live = fairshare_standings(now=T)
    for team, s in live.items():
        assert past[team].usage == pytest.approx(s.usage, rel=1e-9)
        assert past[team].factor == pytest.approx(s.factor, rel=1e-9)


def test_recompute_repairs_a_corrupted_accumulator_and_says_by_how_much(used: World) -> None:
    before = fairshare_standings(now=T)["vision"].usage
    FairShareAccumulator.objects.filter(team=used.vision).update(value=1e6)
    text = run("--recompute")
    assert "recomputed 2 accumulators" in text
    assert fairshare_standings(now=T)["vision"].usage == pytest.approx(before, rel=1e-9)
    again = fairshare_recompute(now=timezone.now())
    assert again.max_rel_diff < 1e-9


def test_rule_f6_an_admitted_job_counts_its_entry_penalty_until_it_runs(
    world: World, settings: Any
) -> None:
    settings.FAIRQ_FAIRSHARE_RECOMPUTE_SECONDS = 300.0
    now = timezone.now()
    JobFactory(team=world.nlp, gpu_type=world.h100, tier=world.normal, gpus_per_replica=4,
               replicas=2, status="ADMITTED")
    st = fairshare_standings(now=now)
    assert st["nlp"].usage == pytest.approx(entry_penalty_gpu_hours(8, 2.0, 300.0))
    assert st["nlp"].usage == pytest.approx(8 * 2.0 * 300 / 3600)
    assert st["nlp"].factor < 1.0 and st["vision"].factor == 1.0


def test_a_running_attempt_counts_up_to_now(world: World) -> None:
    now = timezone.now()
    JobFactory(team=world.speech, gpu_type=world.a100, tier=world.normal,
               gpus_per_replica=2, status="RUNNING", started_at=now - timedelta(hours=2))
    st = fairshare_standings(now=now)
    want = decayed_interval_usage(rate=2, start=now - timedelta(hours=2), end=now, as_of=now,
                                  half_life_hours=H)
    assert st["speech"].usage == pytest.approx(want, rel=1e-9)


def test_rule_f2_an_idle_team_does_not_dilute_the_shares(used: World) -> None:
    st = fairshare_standings(now=T)
    assert st["vision"].active and st["nlp"].active and not st["speech"].active
    assert st["vision"].share == pytest.approx(3 / 5)
    assert st["speech"].share == pytest.approx(1 / 6)  # what it gets on becoming active
    assert st["speech"].factor == 1.0
    JobFactory(team=used.speech, gpu_type=used.a100, tier=used.normal)  # queued
    st = fairshare_standings(now=T)
    assert st["speech"].active and st["vision"].share == pytest.approx(3 / 6)


def test_snapshots_are_one_row_each_pruned_and_give_a_history(used: World,
                                                               settings: Any) -> None:
    settings.FAIRQ_FAIRSHARE_SNAPSHOT_RETENTION_DAYS = 30
    fairshare_snapshot_take(now=T - timedelta(days=40))
    fairshare_snapshot_take(now=T - timedelta(days=1))
    fairshare_snapshot_take(now=T)
    assert FairShareSnapshot.objects.count() == 2  # the 40-day-old one was pruned
    hist = fairshare_history(team="vision")
    assert [h["at"] for h in hist] == [T - timedelta(days=1), T]
    live = fairshare_standings(now=T)["vision"]
    assert hist[-1]["usage_gpu_hours"] == pytest.approx(live.usage, rel=1e-5)
    assert hist[-1]["fair_share_factor"] == pytest.approx(live.factor, rel=1e-5)
    assert fairshare_snapshot_task() == 3  # the periodic task: one row, three teams
    # Taken now, it prunes the March rows (older than 30 days).
    assert list(FairShareSnapshot.objects.values_list("at", flat=True)) == [
        FairShareSnapshot.objects.latest("at").at]
    assert FairShareSnapshot.objects.get().at > T


@pytest.mark.postgres
def test_the_sql_recompute_equals_the_python_one(used: World) -> None:
    from django.db import connection

    from queueing.selectors import fairshare as fs

    assert connection.vendor == "postgresql"
    at = datetime(2026, 2, 28, 6, tzinfo=UTC)
    sql = fs.raw_decayed_usage(at=at)
    py: dict[int, float] = {}
    for r in UsageRecord.objects.filter(start__lt=at):
        py[r.team_id] = py.get(r.team_id, 0.0) + decayed_interval_usage(
            rate=r.gpus * r.billing_weight, start=r.start, end=min(r.end, at), as_of=at,
            half_life_hours=H)
    assert sql.keys() == py.keys()
    for k in py:
        assert sql[k] == pytest.approx(py[k], rel=1e-9)
    # Very old usage underflows to 0 instead of raising in PostgreSQL.
    UsageRecord.objects.create(team=used.speech, gpu_type=used.a100, gpus=1, billing_weight=1,
                               start=datetime(1990, 1, 1, tzinfo=UTC),
                               end=datetime(1990, 1, 2, tzinfo=UTC), gpu_seconds=86400)
    assert fs.raw_decayed_usage(at=at).get(used.speech.pk, 0.0) == pytest.approx(0.0)
