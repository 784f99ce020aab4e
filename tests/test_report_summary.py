"""The reports page's figures (selectors/reports.py, `report_summary`: the rolled-up part
summed once per roll-up state and kept, the live part added per request) held to the
plain sum of every bucket (`report_summary_plain`) over random histories; and staff's
paged, sorted per-team table (docs/dashboard.md, "Reports")."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.core.cache import cache
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from accounts.models import Team
from queueing.models import UsageRecord
from queueing.selectors import reports as rep
from queueing.services.costs import gpu_price_set
from queueing.services.reports import usage_days_roll_up
from tests.conftest import World
from tests.factories import TeamFactory

from .accounting.history import finished_attempt, job, utilization

NOW = datetime(2026, 11, 26, 15, tzinfo=UTC)
ENDED = ["SUCCEEDED", "FAILED", "PREEMPTED", "CANCELLED"]


def _history(world: World, rng: random.Random) -> list[Any]:
    """Random attempts of three teams and three GPU types from August to now (some
    crossing midnights and months, some with utilization, lost work, a spot price),
    prices that change, and jobs running now."""
    teams = [world.vision, world.nlp, world.speech]
    types = [world.h100, world.a100, world.mig]
    for g in rng.sample(types, rng.randint(0, 3)):
        for _ in range(rng.randint(1, 2)):
            gpu_price_set(actor=world.staff, gpu_type=g,
                          effective_from=date(2026, rng.randint(7, 11), rng.randint(1, 28)),
                          price_per_gpu_hour=Decimal(rng.choice(["0.5", "1.25", "2", "3.1"])))
    for _ in range(rng.randint(3, 14)):
        j = job(team=rng.choice(teams), gpu_type=rng.choice(types), tier=world.normal,
                gpus_per_replica=rng.choice([1, 2, 4]))
        start = datetime(2026, 8, 1, tzinfo=UTC) + timedelta(
            minutes=rng.randint(0, 60 * 24 * 110))
        hours = rng.choice([0.5, 3, 7.25, 30, 50])
        ended = rng.choice(ENDED)
        record = finished_attempt(job=j, attempt=1, start=start, hours=hours, ended=ended,
                                  sm_mean=rng.choice([None, 12.5, 80.0]))
        if ended == "PREEMPTED" and rng.random() < 0.5:
            record.lost_gpu_hours = round(rng.uniform(0, hours), 3)
        if rng.random() < 0.25:
            record.spot = True
            record.price_per_gpu_hour = Decimal(rng.choice(["0.4", "0.75"]))
        record.save()
    for _ in range(rng.randint(0, 3)):
        started = NOW - timedelta(minutes=rng.randint(5, 60 * 24 * 40))
        j = job(team=rng.choice(teams), gpu_type=rng.choice(types), tier=world.normal,
                status="RUNNING", started_at=started)
        if rng.random() < 0.5:
            utilization(job=j, attempt=1, start=started, minutes=60, sm_mean=40.0)
    return teams


def _same(fast: rep.ReportSummary, plain: rep.ReportSummary) -> None:
    """Equal figures: amounts (decimals) exactly, GPU-hours to the float rounding of
    adding a bucket's live hours after its rolled-up ones."""
    assert fast.periods == plain.periods and fast.rolled_up_to == plain.rolled_up_to
    assert fast.totals.keys() == plain.totals.keys()
    for team, t in plain.totals.items():
        for k, v in t.items():
            if isinstance(v, float):
                assert fast.totals[team][k] == pytest.approx(v, rel=1e-9, abs=1e-9), (team, k)
            else:
                assert fast.totals[team][k] == v, (team, k)
    assert fast.spend == plain.spend
    assert fast.cost.keys() == plain.cost.keys()
    for team, col in plain.cost.items():
        assert fast.cost[team] == pytest.approx(col, rel=1e-9, abs=1e-9)
    for kind, col in plain.hours.items():
        assert fast.hours[kind] == pytest.approx(col, rel=1e-9, abs=1e-9)


def test_the_kept_report_figures_are_the_plain_sum_of_every_bucket(world: World) -> None:
    """Over random histories, partly rolled up and rolled up further between two reads,
    by day and by month: each answer of `report_summary` (kept or not, read twice) is
    `report_summary_plain`'s."""
    rng = random.Random(2026)
    for _ in range(6):
        UsageRecord.objects.all().delete()
        cache.clear()
        rep._KEPT.clear()
        teams = _history(world, rng)
        for batch in (rng.randint(1, 6), 10_000):
            usage_days_roll_up(now=NOW, batch=batch)
            for period, start, end in (("month", date(2026, 8, 1), date(2026, 11, 27)),
                                       ("day", date(2026, 10, 28), date(2026, 11, 27))):
                chosen = rng.sample(teams, rng.randint(1, 3))
                plain = rep.report_summary_plain(teams=chosen, start=start, end=end,
                                                 period=period, now=NOW)
                for _ in range(2):  # the second read finds the rolled-up part kept
                    _same(rep.report_summary(teams=chosen, start=start, end=end,
                                             period=period, now=NOW), plain)
                _same_for_every_team(start=start, end=end, period=period, now=NOW)


def test_the_kept_live_days_are_the_plain_live_part_as_now_moves(world: World) -> None:
    """Over random running attempts (crossing UTC midnights, some with idle minutes,
    some on spot at their own price) and price changes between reads, read at a `now`
    that moves by minutes and across midnights: `report_summary` (the live part's
    finished days kept per process, `_live_kept`) is `report_summary_plain`'s answer."""
    from queueing.models import AttemptUtilization

    rng = random.Random(11)
    world.normal.idle_threshold_percent = 10
    world.normal.save()
    teams = [world.vision, world.nlp, world.speech]
    types = [world.h100, world.a100, world.mig]
    for _ in range(4):
        UsageRecord.objects.all().delete()
        cache.clear()
        rep._KEPT.clear()
        rep._PIECES.clear()
        _history(world, rng)
        usage_days_roll_up(now=NOW, batch=rng.randint(1, 10_000))
        for _ in range(rng.randint(2, 6)):
            started = NOW - timedelta(minutes=rng.randint(5, 60 * 24 * 9))
            j = job(team=rng.choice(teams), gpu_type=rng.choice(types), tier=world.normal,
                    status="RUNNING", started_at=started, gpus_per_replica=rng.choice([1, 2]))
            if rng.random() < 0.7:
                AttemptUtilization.objects.create(
                    job=j, attempt=1, first_at=started, last_at=started, samples=60,
                    sm_sum=40.0 * 60, sm_mean=rng.choice([5.0, 40.0]),
                    sm_p95=50.0, sm_hist={"3": rng.randint(1, 50), "40": 10})
        now = NOW
        for _ in range(5):
            now += timedelta(minutes=rng.choice([1, 7, 60 * 9, 60 * 24 + 3]))
            if rng.random() < 0.3:
                gpu_price_set(actor=world.staff, gpu_type=rng.choice(types),
                              effective_from=(now - timedelta(days=rng.randint(0, 5))).date(),
                              price_per_gpu_hour=Decimal(rng.choice(["0.7", "1.9", "2.35"])))
            end = now.date() + timedelta(days=1)
            for period, start in (("month", date(2026, 8, 1)), ("day", end - timedelta(30))):
                chosen = rng.sample(teams, rng.randint(1, 3))
                plain = rep.report_summary_plain(teams=chosen, start=start, end=end,
                                                 period=period, now=now)
                for _ in range(2):  # the second read finds the finished days kept
                    _same(rep.report_summary(teams=chosen, start=start, end=end,
                                             period=period, now=now), plain)
                _same_for_every_team(start=start, end=end, period=period, now=now)
    assert rep._PIECES  # the kept path was taken


def _same_for_every_team(*, start: date, end: date, period: str, now: datetime) -> None:
    """Staff's every team, read with no list of ids (`every_team`), is the plain sum of
    every team's buckets read by their ids; and so is the first usage day."""
    every = list(Team.objects.order_by("slug"))
    plain = rep.report_summary_plain(teams=every, start=start, end=end, period=period,
                                     now=now)
    for _ in range(2):
        _same(rep.report_summary(teams=every, start=start, end=end, period=period, now=now,
                                 every_team=True), plain)
    assert rep.first_usage_day(teams=every, now=now, every_team=True) == \
        rep.first_usage_day(teams=every, now=now)


def test_every_team_read_without_ids_leaves_out_a_team_made_since(world: World) -> None:
    """A team made (and charged, and running a job) after staff's list of every team was
    read is not in the figures read with no list of ids: they are the listed teams'."""
    rng = random.Random(5)
    _history(world, rng)
    usage_days_roll_up(now=NOW, batch=3)
    every = list(Team.objects.order_by("slug"))
    late = TeamFactory(slug="late")
    finished_attempt(job=job(team=late, gpu_type=world.a100, tier=world.normal), attempt=1,
                     start=NOW - timedelta(days=3), hours=5, ended="SUCCEEDED")
    job(team=late, gpu_type=world.h100, tier=world.normal, status="RUNNING",
        started_at=NOW - timedelta(hours=30))
    for period, start in (("month", date(2026, 8, 1)), ("day", date(2026, 10, 28))):
        fast = rep.report_summary(teams=every, start=start, end=date(2026, 11, 27),
                                  period=period, now=NOW, every_team=True)
        assert "late" not in fast.totals
        _same(fast, rep.report_summary_plain(teams=every, start=start, end=date(2026, 11, 27),
                                             period=period, now=NOW))


def test_the_first_usage_day_kept_under_the_mark_is_the_plain_minimum(world: World) -> None:
    """`first_usage_day` (the records up to the roll-up's mark read once per mark) is the
    plain minimum over every record as records arrive after the mark (some starting
    earlier than every rolled-up one) and the mark moves."""
    from django.db.models import Min

    rng = random.Random(3)
    teams = [world.vision, world.nlp, world.speech]
    rep._FIRSTS.clear()
    for _ in range(8):
        for _ in range(rng.randint(1, 3)):
            finished_attempt(job=job(team=rng.choice(teams), gpu_type=world.h100,
                                     tier=world.normal), attempt=1, hours=1,
                             start=NOW - timedelta(days=rng.randint(2, 300)),
                             ended="SUCCEEDED")
        if rng.random() < 0.5:
            usage_days_roll_up(now=NOW, batch=rng.randint(1, 4))
        for chosen in ([world.vision], [world.nlp, world.speech], teams, []):
            least = UsageRecord.objects.filter(team__in=chosen).aggregate(m=Min("start"))["m"]
            for _ in range(2):  # the second read finds the part up to the mark kept
                assert rep.first_usage_day(teams=chosen, now=NOW) == (
                    least.astimezone(UTC).date() if least else None)


def test_the_team_select_marks_the_team_asked(world: World) -> None:
    """Staff's team <select> (its options built once per team list): every team, the
    one asked selected, none selected without one."""
    for i in range(3):
        TeamFactory(slug=f"t{i}")
    status, body = _staff_page(world, period="day", team="t1")
    assert status == 200
    assert '<option value="t1" selected>t1</option>' in body
    assert '<option value="t0">t0</option>' in body
    status, plain = _staff_page(world, period="day")
    assert '<option value="t1">t1</option>' in plain
    assert body.count(" selected>") == plain.count(" selected>") + 1  # only the team's


def _staff_page(world: World, **params: str) -> tuple[int, str]:
    c = Client()
    c.force_login(world.staff)
    r = c.get("/reports/", params)
    return r.status_code, r.content.decode()


def test_staffs_per_team_table_is_paged_and_sorted_over_every_team(world: World) -> None:
    """Staff with 60 teams: 50 rows a page, the total line over all 60 on each page,
    sorted by the column asked; bad input is a 400 that says what is wrong."""
    now = datetime.now(UTC)
    for i in range(57):
        t = TeamFactory(slug=f"t{i:02d}")
        finished_attempt(job=job(team=t, gpu_type=world.a100, tier=world.normal), attempt=1,
                         start=now - timedelta(days=3), hours=1 + i, ended="SUCCEEDED")
    status, first = _staff_page(world, period="day")
    assert status == 200
    assert "1-50 of 57" in first and "All 57 teams" in first
    assert "<td>t56</td>" in first and "<td>t06</td>" not in first  # most GPU-hours first
    status, second = _staff_page(world, period="day", page="2")
    assert status == 200 and "51-57 of 57" in second and "All 57 teams" in second
    assert "<td>t06</td>" in second and "<td>t00</td>" in second
    status, by_team = _staff_page(world, period="day", sort="team")
    assert status == 200
    assert by_team.index("<td>t00</td>") < by_team.index("<td>t01</td>")
    assert "<td>t56</td>" not in by_team
    for params, words in (({"page": "x"}, "Page &#x27;x&#x27;: a whole number from 1."),
                          ({"page": "9"}, "Page 9: there are 2."),
                          ({"sort": "bogus"}, "Unknown sort &#x27;bogus&#x27;")):
        status, body = _staff_page(world, period="day", **params)
        assert status == 400 and words in body, params


def test_the_dashboards_usage_series_kept_per_process_follow_the_shared_ones(
        world: World) -> None:
    """`usage_history` reads every team's snapshot series from the cache once per
    generation and process: over random snapshots its answer is the one computed
    afresh, and a new generation (another process's, after the cache dropped them) is
    read again, not the process's older copy."""
    from django.utils import timezone

    from queueing.models import FairShareSnapshot
    from queueing.selectors import dashboard as dash

    rng = random.Random(7)
    now = timezone.now()
    n = iter(range(1, 10_000))  # microseconds apart: one snapshot per instant
    teams = [f"t{i}" for i in range(8)]

    def fresh(only: set[str]) -> dict[str, Any]:
        dash._local.clear()
        cache.clear()
        return dash.usage_history(now=now, current=[], only=only)

    for _ in range(5):
        for _ in range(rng.randint(1, 6)):
            FairShareSnapshot.objects.create(
                at=now - timedelta(minutes=rng.randint(1, 60 * 24 * 6), microseconds=next(n)),
                half_life_hours=24,
                standings={t: [rng.uniform(0, 50), 0.1, 0.2, 0.5]
                           for t in rng.sample(teams, rng.randint(1, 8))})
        only = set(rng.sample(teams, rng.randint(1, 3)))
        expected = fresh(only)
        for _ in range(2):  # the process's copy, then the shared one in another process
            assert dash.usage_history(now=now, current=[], only=only) == expected
            dash._local.pop(next(k for k in dash._local if "usage-history" in k))
        assert dash.usage_history(now=now, current=[], only=only) == expected
        # A snapshot later, another process computed the series anew (the cache dropped
        # the old ones): this process must not answer with its own older copy.
        FairShareSnapshot.objects.create(at=now - timedelta(seconds=10, microseconds=next(n)),
                                         half_life_hours=24, standings={t: [99.0, 0, 0, 0]
                                                                        for t in teams})
        kept = dict(dash._local)
        newer = fresh(only)
        dash._local.update(kept)
        assert dash.usage_history(now=now, current=[], only=only) == newer != expected


def test_staffs_budgets_are_the_pages_teams(world: World) -> None:
    """With several pages, this month's budgets are those of the page's teams; with one
    page (a team asked), of every team shown."""
    from queueing.models import TeamBudget

    now = datetime.now(UTC)
    for i in range(57):
        t = TeamFactory(slug=f"t{i:02d}")
        finished_attempt(job=job(team=t, gpu_type=world.a100, tier=world.normal), attempt=1,
                         start=now - timedelta(days=3), hours=1 + i, ended="SUCCEEDED")
        if i in (56, 6):  # t56 on the first page, t06 on the second
            TeamBudget.objects.create(team=t, monthly_amount=Decimal("1000"))
    row = '<tr><td>{}</td><td class="num">'
    _, first = _staff_page(world, period="day")
    assert "Budgets this month" in first
    assert row.format("t56") in first and row.format("t06") not in first
    _, second = _staff_page(world, period="day", page="2")
    assert row.format("t06") in second and row.format("t56") not in second
    _, one = _staff_page(world, period="day", team="t06")
    assert row.format("t06") in one


def test_the_lean_running_read_is_the_running_part_of_attempts(
        world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """`_running` (spot pools read only for spot jobs, in no order, the utilization row
    joined or read by subqueries) gives the attempts `attempts` gives for the jobs
    running now: the same figures, spot prices included (rule C4: a job's pools'
    GPU-weighted price, or its cluster's first spot pool of its type without pools
    recorded), used and idle fractions of the running attempt's row (rule C3) and GPU
    shares."""
    from queueing.models import AttemptUtilization, Cluster, NodePool
    from queueing.selectors.costs import attempts

    rng = random.Random(17)
    world.normal.idle_threshold_percent = 10
    world.normal.save()
    cloud = Cluster.objects.create(name="cloud", backend="simulated",
                                   sim_nodes="1x8xa100:spot+zone=a,1x8xa100:spot+zone=b")
    for name, price in (("spot-a", "0.90"), ("spot-b", "1.30")):
        NodePool.objects.create(cluster=cloud, name=name, gpu_type=world.a100, spot=True,
                                price_per_gpu_hour=Decimal(price))
    teams = [world.vision, world.nlp, world.speech]
    for _ in range(40):
        started = NOW - timedelta(minutes=rng.randint(1, 60 * 24 * 5))
        spot = rng.random() < 0.4
        j = job(team=rng.choice(teams), gpu_type=world.a100 if spot else rng.choice(
                    [world.h100, world.a100, world.mig]), tier=world.normal, status="RUNNING",
                started_at=started, gpus_per_replica=rng.choice([1, 2, 4]))
        if spot:
            j.on_spot, j.cluster = True, cloud
            j.spot_pools = rng.choice([{}, {"spot-a": 2}, {"spot-a": 1, "spot-b": 3}])
            j.save()
        if rng.random() < 0.7:
            AttemptUtilization.objects.create(
                job=j, attempt=1, first_at=started, last_at=started, samples=60,
                sm_sum=40.0 * 60, sm_mean=rng.choice([5.0, 40.0]), sm_p95=50.0,
                sm_hist=rng.choice([{"3": rng.randint(1, 50), "40": 10}, {}, {"9": 7}]))
    end = datetime(2026, 11, 27, tzinfo=UTC)

    def key(a: Any) -> tuple[Any, ...]:
        return (a.team_id, a.start, a.gpus, a.gpu_type_id, a.idle_fraction, a.price)

    # A job's utilization rows of other attempts (a requeued job's earlier ones) are not
    # its running attempt's: the join matches the attempt, as the subqueries do.
    requeued = job(team=world.nlp, gpu_type=world.h100, tier=world.normal, status="RUNNING",
                   started_at=NOW - timedelta(hours=5), gpus_per_replica=2, attempt=2)
    for attempt, mean in ((1, 90.0), (2, 12.5)):
        AttemptUtilization.objects.create(
            job=requeued, attempt=attempt, first_at=requeued.started_at,
            last_at=requeued.started_at, samples=60, sm_sum=mean * 60, sm_mean=mean,
            sm_p95=mean, sm_hist={"3": 30 * attempt, "40": 10})
    for joined in (True, False):  # RUNNING_JOINED: one join, or the subqueries before it
        monkeypatch.setattr(rep, "RUNNING_JOINED", joined)
        for team_ids in (None, [world.vision.pk, world.speech.pk], [world.nlp.pk]):
            plain = sorted(attempts(team_ids=team_ids, start=None, end=end, now=NOW,
                                    records_after=10**9), key=key)
            with CaptureQueriesContext(connection) as ctx:
                lean = sorted(rep._running(team_ids, end=end, now=NOW), key=key)
            assert lean == plain and len(plain) > 5
            assert any(a.spot and a.price is not None for a in lean)
            assert any(a.idle_fraction for a in lean)
            assert any(a.used_fraction for a in lean)
            [read] = [q["sql"] for q in ctx.captured_queries
                      if "queueing_attemptutilization" in q["sql"]]
            # The path asked for ran: one join, or three subqueries.
            assert read.count('LEFT OUTER JOIN "queueing_attemptutilization"') == joined
            assert read.count('FROM "queueing_attemptutilization"') == (0 if joined else 3)


def test_price_numbers_are_not_given_again_when_the_kept_ones_are_emptied(
        world: World) -> None:
    """The price lists' numbers (`_price_id`) are emptied when there are too many; one
    emptied while a request runs must not give a number the request already holds to
    another list (two GPU types' open days at different prices alike)."""
    for g, price in ((world.h100, "3"), (world.a100, "1")):
        gpu_price_set(actor=world.staff, gpu_type=g, effective_from=date(2026, 1, 1),
                      price_per_gpu_hour=Decimal(price))
    for g in (world.h100, world.a100):
        job(team=world.vision, gpu_type=g, tier=world.normal, status="RUNNING",
            started_at=NOW - timedelta(days=2), gpus_per_replica=1)
    cache.clear()
    rep._KEPT.clear()
    rep._PIECES.clear()
    rep._PRICE_IDS.clear()
    rep._price_id(tuple(rep.price_lists()[world.h100.pk]))
    for i in range(10_000):  # full: the next new list empties them
        rep._price_id(("another list", i))
    start, end = date(2026, 11, 1), date(2026, 11, 27)
    plain = rep.report_summary_plain(teams=[world.vision], start=start, end=end,
                                     period="day", now=NOW)
    _same(rep.report_summary(teams=[world.vision], start=start, end=end, period="day",
                             now=NOW), plain)
