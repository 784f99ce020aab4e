"""The pages' faster reads held to their plain ones (docs/performance.md, "A fleet of
5,000 nodes: pages with 1,000,000 jobs"): each fast path answers exactly what its
reference path answers, over random worlds."""

from __future__ import annotations

import pickle
import random
from datetime import UTC, date, datetime, timedelta
from typing import Any
from unittest import mock

from django.core.cache import cache
from django.utils import timezone

from queueing.policy.explain import PlanEntry
from queueing.selectors import dashboard as dash
from queueing.selectors.capacity import capacity_by_gpu_type
from queueing.selectors.fairshare import fairshare_standings
from queueing.selectors.queue_plan import QueuePlan
from queueing.selectors.quota_tree import team_standing

from .conftest import job_body


def _random_plan(rng: random.Random, size: int) -> QueuePlan:
    teams = [f"team-{i}" for i in range(rng.randint(1, 12))]
    positions = rng.sample(range(1, size + 1), size)
    ids = rng.sample(range(1, 10 * size + 1), size)
    entries = {job_id: PlanEntry(pos, 0, rng.choice(teams), "h100", "", "")
               for job_id, pos in zip(ids, positions, strict=True)}
    return QueuePlan(entries, len(entries), generation=f"g{rng.random()}")


def test_rule_p3_a_teams_queue_order_is_the_plain_walk_of_the_plan() -> None:
    """`QueuePlan.team_order` (one index of every team, built once per plan) against
    `team_order_reference` (every entry walked and sorted), for every team, every
    team at once and a team without jobs, before and after the plan is pickled."""
    rng = random.Random(34)
    for _ in range(200):
        plan = _random_plan(rng, rng.randint(0, 60))
        teams = {e.team for e in plan.entries.values()} | {None, "team-absent"}
        for copy in (plan, pickle.loads(pickle.dumps(plan))):
            for team in teams:
                assert copy.team_order(team) == copy.team_order_reference(team)


def test_rule_p3_the_team_index_is_not_pickled_with_the_plan() -> None:
    plan = _random_plan(random.Random(1), 30)
    plan.team_order(None)
    assert "_by_team" in plan.__dict__
    copy = pickle.loads(pickle.dumps(plan))
    assert "_by_team" not in copy.__dict__
    assert copy == plan


# --- what the dashboard keeps a few seconds (selectors/dashboard.py, PAGE_CACHE_SECONDS) ---

def _busy(world: Any) -> None:
    """Jobs queued and running in two teams (one cycle on the simulated cluster)."""
    from queueing.services.scheduler import scheduler_cycle

    for team, user in ((world.vision, world.member), (world.nlp, world.outsider)):
        for gpus in (2, 4, 8):
            r = world.client(user).post("/api/v1/jobs/", job_body(team=team.slug, gpus=gpus),
                                        format="json")
            assert r.status_code == 201, r.json()
    scheduler_cycle(now=timezone.now())


def test_the_dashboards_kept_reads_are_the_live_ones(world: Any) -> None:
    """Kept (a page request's, for PAGE_CACHE_SECONDS) against computed afresh: the
    standings, the quota forest's standing of each team and the capacity card, and
    the card without the queue's demand is the full one's held GPUs."""
    _busy(world)
    now = timezone.now()
    for _ in range(2):  # computed, then read back from the cache
        assert dash.standings(now=now, cached=True) == dash.standings(now=now)
        assert dash.standings_by_team(now=now) == fairshare_standings(now=now)
        for team in ("vision", "nlp", "speech"):
            assert dash.team_standing_cached(team=team) == team_standing(team=team)
        kept, _ = dash.capacity_held_cached()
        assert kept == capacity_by_gpu_type(held_only=True)[0]
    full, _ = capacity_by_gpu_type()
    assert any(r.held_by_jobs for r in full) and any(r.queued_demand for r in full)
    held = [(r.gpu_type, r.capacity, r.allocated, r.held_by_jobs, r.by_team) for r in full]
    assert held == [(r.gpu_type, r.capacity, r.allocated, r.held_by_jobs, r.by_team)
                    for r in kept]


def test_a_cycle_that_moves_jobs_drops_what_the_dashboard_keeps(world: Any) -> None:
    from queueing.selectors.queue_plan import queue_plan_forget

    dash.capacity_held_cached()
    dash.team_standing_cached(team="vision")
    _busy(world)  # the cycle admits: it calls queue_plan_forget
    kept, _ = dash.capacity_held_cached()
    assert kept == capacity_by_gpu_type(held_only=True)[0]
    assert any(r.held_by_jobs for r in kept)
    assert dash.team_standing_cached(team="vision") == team_standing(team="vision")
    queue_plan_forget()
    assert all(cache.get(k) is None for k in dash.PAGE_CACHE_KEYS)


def test_the_cycle_publishes_what_the_dashboard_keeps(world: Any) -> None:
    """After a cycle the kept reads are there, computed by the cycle (a request computes
    none of them) and the same as computed afresh at the cycle's instant."""
    _busy(world)  # the cycle admits and publishes
    at = cache.get(dash._PUBLISHED_AT_KEY)
    assert at is not None
    dash._local.clear()  # another process: read from the shared cache
    with mock.patch.object(dash, "fairshare_standings", side_effect=AssertionError("computed")), \
            mock.patch.object(dash, "quota_forest", side_effect=AssertionError("computed")), \
            mock.patch.object(dash, "capacity_by_gpu_type", side_effect=AssertionError("computed")):
        kept_standings = dash.standings_by_team(now=timezone.now())
        kept_trees = {t: dash.team_standing_cached(team=t) for t in ("vision", "nlp", "speech")}
        kept_card, _ = dash.capacity_held_cached()
    assert kept_standings == fairshare_standings(now=at)
    assert kept_trees == {t: team_standing(team=t) for t in ("vision", "nlp", "speech")}
    assert kept_card == capacity_by_gpu_type(held_only=True)[0]
    assert any(r.held_by_jobs for r in kept_card)
    # A cycle that moves nothing within PAGE_CACHE_SECONDS computes them again only when
    # one is missing.
    assert not dash.page_reads_publish(now=at, moved=False)
    cache.delete(dash.PAGE_CACHE_KEYS[1])
    assert dash.page_reads_publish(now=at, moved=False)


# --- the reports page: the roll-up's sums kept by its state ----------------------------------

def test_the_reports_kept_roll_up_sums_follow_the_roll_up(world: Any) -> None:
    """`report_buckets` keeps the roll-up's sums under its mark: a roll-up that moves the
    mark is read again (a mutation that keeps the sums across marks counts the new
    records nowhere), and each answer equals one computed without the cache."""
    from queueing.selectors.reports import report_buckets
    from queueing.services.reports import usage_days_roll_up
    from tests.accounting.history import finished_attempt, job

    now = datetime(2026, 11, 26, tzinfo=UTC)
    teams = [world.vision, world.nlp]

    def report() -> list[tuple[Any, ...]]:
        return [(b.period, b.team, b.gpu_type, round(b.allocated_gpu_hours, 6))
                for b in report_buckets(teams=teams, start=date(2026, 9, 1),
                                        end=date(2026, 11, 1), period="month",
                                        now=now).buckets]

    def fresh() -> list[tuple[Any, ...]]:
        cache.clear()
        return report()

    finished_attempt(job=job(team=world.vision, gpu_type=world.h100, tier=world.normal),
                     attempt=1, start=datetime(2026, 9, 9, 20, tzinfo=UTC), hours=8,
                     ended="SUCCEEDED")
    usage_days_roll_up(now=now)
    first = report()
    assert first == report() == fresh() == [(date(2026, 9, 1), "vision", "h100", 8.0)]
    finished_attempt(job=job(team=world.nlp, gpu_type=world.h100, tier=world.normal),
                     attempt=1, start=datetime(2026, 10, 5, tzinfo=UTC), hours=5,
                     ended="FAILED")
    assert report() == [*first, (date(2026, 10, 1), "nlp", "h100", 5.0)]  # live part
    usage_days_roll_up(now=now)  # the mark moves: the kept sums are read again
    assert report() == fresh() == [*first, (date(2026, 10, 1), "nlp", "h100", 5.0)]


def test_the_first_usage_day_is_the_first_record_of_the_teams(world: Any) -> None:
    """`first_usage_day` (each team's first record on its index) against the plain
    minimum over the records."""
    from django.db.models import Min

    from queueing.models import UsageRecord
    from queueing.selectors.reports import first_usage_day
    from tests.accounting.history import finished_attempt, job

    now = timezone.now()
    rng = random.Random(5)
    teams = [world.vision, world.nlp, world.speech]
    for _ in range(12):
        team = rng.choice(teams)
        finished_attempt(job=job(team=team, gpu_type=world.h100, tier=world.normal),
                         attempt=1, start=now - timedelta(days=rng.randint(2, 300)),
                         hours=1, ended="SUCCEEDED")
    for chosen in ([world.vision], [world.nlp, world.speech], teams, []):
        least = UsageRecord.objects.filter(team__in=chosen).aggregate(m=Min("start"))["m"]
        assert first_usage_day(teams=chosen, now=now) == (
            least.astimezone(UTC).date() if least else None)
