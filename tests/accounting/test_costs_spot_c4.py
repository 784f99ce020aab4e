"""Rule C4: an attempt on spot nodes is priced at its spot pool's own price, frozen when
it is charged; an on-demand attempt of the same GPU type at the type's price (rule C1).

The jobs run on simulated clusters (a `Cluster` row each, as in tests/clusters/): a
spot-only cloud cluster whose a100 pool costs 0.90 per GPU-hour, and an on-premises one
with regular a100 nodes; the a100's price list says 2.00."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from queueing.models import Cluster, Job, NodePool, UsageRecord
from queueing.policy.admission import plan_admissions
from queueing.policy.costs import PricePoint, cost_pieces, money, own_price
from queueing.selectors.costs import by_department, cost_buckets
from queueing.selectors.reports import report_buckets
from queueing.services.costs import gpu_price_set
from queueing.services.reports import usage_days_roll_up
from queueing.services.scheduler import scheduler_cycle
from tests.clusters.conftest import backend_of, queued
from tests.conftest import World
from tests.policy.clusters_world import job as policy_job
from tests.policy.clusters_world import pool as policy_pool
from tests.policy.clusters_world import snap

from .history import finished_attempt
from .history import job as history_job

SPOT_PRICE = Decimal("0.90")
LIST_PRICE = Decimal("2.00")


# --- pure: the plan says where, the price list of one price -------------------------------

def test_rule_c4_the_admission_says_whether_its_nodes_are_spot() -> None:
    nodes = policy_pool("cloud", "h100", 1) + policy_pool("cloud", "h100", 1, spot=True)
    plan = plan_admissions(snap(nodes, [policy_job(1, spot_ok=True),
                                        policy_job(2, spot_ok=True)]))
    where = {a.job_id: (a.placement, a.spot) for a in plan.admissions}
    assert where == {1: (("cloud/spot-h100-0",), True), 2: (("cloud/n-h100-0",), False)}


def test_rule_c4_an_own_price_is_still_cut_at_utc_midnight_and_ignores_the_list() -> None:
    start = datetime(2026, 2, 28, 22, tzinfo=UTC)
    pieces = list(cost_pieces(gpus=2, start=start, end=start + timedelta(hours=4),
                              prices=own_price(SPOT_PRICE)))
    assert [(p.day, p.gpu_hours, p.price) for p in pieces] == [
        (date(2026, 2, 28), 4.0, SPOT_PRICE), (date(2026, 3, 1), 4.0, SPOT_PRICE)]
    # The type's list would have priced it otherwise (and in two prices).
    listed = [PricePoint(date(2026, 1, 1), LIST_PRICE), PricePoint(date(2026, 3, 1), Decimal(3))]
    assert [p.price for p in cost_pieces(gpus=2, start=start, end=start + timedelta(hours=4),
                                         prices=listed)] == [LIST_PRICE, Decimal(3)]


# --- the cycle: charged at the pool's price ---------------------------------------------

@pytest.fixture
def spot_world(world: World) -> World:
    gpu_price_set(actor=world.staff, gpu_type=world.a100, effective_from=date(2020, 1, 1),
                  price_per_gpu_hour=LIST_PRICE)
    Cluster.objects.create(name="onprem", backend="simulated", sim_nodes="1x8xa100",
                           cost_rank=5)
    spot = Cluster.objects.create(name="cloud-spot", backend="simulated",
                                  sim_nodes="1x8xa100:spot", cost_rank=0)
    NodePool.objects.create(cluster=spot, name="spot", gpu_type=world.a100, spot=True,
                            price_per_gpu_hour=SPOT_PRICE)
    return world


def _costs(world: World, t0: datetime) -> dict[str, Decimal]:
    buckets = cost_buckets(teams=[world.vision, world.nlp], start=t0 - timedelta(days=1),
                           end=t0 + timedelta(days=1), period="month", now=timezone.now())
    out: dict[str, Decimal] = {}
    for b in by_department(buckets):
        out[b.team] = out.get(b.team, Decimal(0)) + b.cost
    # To the cent, as reported: an attempt across a UTC midnight is two pieces (rule C2)
    # whose float GPU-hours need not sum exactly.
    return {team: money(cost) for team, cost in out.items()}


@pytest.mark.django_db
def test_rule_c4_a_spot_attempt_costs_its_pools_price_and_on_demand_the_list(
        spot_world: World) -> None:
    world = spot_world
    t0 = timezone.now() - timedelta(hours=3)
    spot_job = queued(world, gpu_type=world.a100, tier=world.low, seconds=1800,
                      at=t0 - timedelta(seconds=2))
    on_demand = queued(world, gpu_type=world.a100, tier=world.critical, team=world.nlp,
                       seconds=1800, at=t0 - timedelta(seconds=1))

    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    spot_job.refresh_from_db()
    on_demand.refresh_from_db()
    assert (spot_job.status, spot_job.cluster.name if spot_job.cluster else None,
            spot_job.on_spot) == ("RUNNING", "cloud-spot", True)
    assert (on_demand.status, on_demand.cluster.name if on_demand.cluster else None,
            on_demand.on_spot) == ("RUNNING", "onprem", False)

    scheduler_cycle(now=t0 + timedelta(seconds=1900))

    spot_record = UsageRecord.objects.get(job=spot_job)
    listed_record = UsageRecord.objects.get(job=on_demand)
    assert Job.objects.get(pk=spot_job.pk).status == "SUCCEEDED"
    assert (spot_record.cluster, spot_record.spot, spot_record.price_per_gpu_hour) == (
        spot_job.cluster, True, SPOT_PRICE)
    assert (listed_record.cluster, listed_record.spot, listed_record.price_per_gpu_hour) == (
        on_demand.cluster, False, None)
    # 8 GPUs × 30 minutes each: 4 GPU-hours at 0.90 and at 2.00.
    assert spot_record.gpu_seconds == listed_record.gpu_seconds == 8 * 1800
    assert _costs(world, t0) == {"vision": Decimal("3.60"), "nlp": Decimal("8.00")}

    # Rule C4 (as C1): a later pool price never reprices what was charged.
    NodePool.objects.filter(cluster__name="cloud-spot").update(
        price_per_gpu_hour=Decimal("0.10"))
    assert _costs(world, t0) == {"vision": Decimal("3.60"), "nlp": Decimal("8.00")}


@pytest.mark.django_db
def test_rule_c4_a_running_spot_attempt_is_priced_at_its_pool_now(spot_world: World) -> None:
    world = spot_world
    t0 = timezone.now() - timedelta(hours=1)
    spot_job = queued(world, gpu_type=world.a100, tier=world.low, seconds=36_000,
                      at=t0 - timedelta(seconds=1))
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    spot_job.refresh_from_db()
    assert spot_job.status == "RUNNING" and spot_job.on_spot
    assert spot_job.started_at is not None
    now = spot_job.started_at + timedelta(minutes=30)
    (bucket,) = cost_buckets(teams=[world.vision], start=t0 - timedelta(days=1),
                             end=t0 + timedelta(days=1), period="month", now=now)
    assert bucket.allocated_gpu_hours == pytest.approx(4.0)
    assert bucket.cost == pytest.approx(Decimal("3.60"))


@pytest.mark.django_db
def test_rule_c4_a_reclaimed_spot_attempt_k6_is_charged_at_the_spot_price(
        spot_world: World) -> None:
    world = spot_world
    t0 = timezone.now() - timedelta(hours=2)
    spot_job = queued(world, gpu_type=world.a100, tier=world.low, seconds=3600,
                      at=t0 - timedelta(seconds=1))
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    spot_job.refresh_from_db()
    assert spot_job.status == "RUNNING" and spot_job.on_spot and spot_job.cluster
    started = spot_job.started_at
    assert started is not None
    cluster = spot_job.cluster
    reclaimed = started + timedelta(minutes=15)
    assert backend_of(cluster).reclaim_node(  # type: ignore[attr-defined]
        spot_job.placement[0], now=reclaimed) == [spot_job.backend_name]

    scheduler_cycle(now=reclaimed + timedelta(seconds=1))

    spot_job.refresh_from_db()
    record = UsageRecord.objects.get(job=spot_job, attempt=1)
    assert (record.cluster, record.spot, record.price_per_gpu_hour) == (cluster, True,
                                                                         SPOT_PRICE)
    assert record.gpu_seconds == 8 * 15 * 60
    # Requeued as attempt 2: no longer where attempt 1 ran (rule K6; the next plan may
    # have placed it on the regular nodes of onprem already).
    assert spot_job.attempt == 2
    assert spot_job.cluster != cluster and spot_job.on_spot is False
    # 2 GPU-hours at 0.90 (the list would say 4.00).
    assert _costs(world, t0)["vision"] == Decimal("1.80")


@pytest.mark.django_db
def test_rule_c4_the_reports_page_prices_spot_records_alike_rolled_up_or_not(
        world: World) -> None:
    gpu_price_set(actor=world.staff, gpu_type=world.a100, effective_from=date(2026, 9, 10),
                  price_per_gpu_hour=LIST_PRICE)
    spot = history_job(team=world.vision, gpu_type=world.a100, gpus_per_replica=2,
                       tier=world.low)
    # 2 GPUs from Sept 9, 20:00 for 8 h: 8 GPU-hours on the 9th (no list price yet) and 8
    # on the 10th, all at the pool's 0.90; idle a quarter of the time (rule C3).
    record = finished_attempt(job=spot, attempt=1, start=datetime(2026, 9, 9, 20, tzinfo=UTC),
                              hours=8, ended="SUCCEEDED", sm_mean=25.0)
    spot.utilization.filter(attempt=1).update(sm_hist={"1": 120, "30": 360})
    UsageRecord.objects.filter(pk=record.pk).update(spot=True, price_per_gpu_hour=SPOT_PRICE)
    listed = history_job(team=world.nlp, gpu_type=world.a100, tier=world.normal)
    finished_attempt(job=listed, attempt=1, start=datetime(2026, 9, 10, tzinfo=UTC), hours=2,
                     ended="SUCCEEDED")
    teams = [world.vision, world.nlp]
    now = datetime(2026, 11, 26, tzinfo=UTC)
    exact = cost_buckets(teams=teams, start=datetime(2026, 9, 1, tzinfo=UTC),
                         end=datetime(2026, 10, 1, tzinfo=UTC), period="day", now=now)

    def rows(buckets: list) -> list[tuple]:
        return [(b.period.day, b.team, round(b.allocated_gpu_hours, 6),
                 round(b.unpriced_gpu_hours, 6), round(b.cost, 6), round(b.idle_cost, 6))
                for b in buckets]

    expected = [(9, "vision", 8.0, 0.0, Decimal("7.2"), Decimal("1.8")),
                (10, "nlp", 2.0, 0.0, Decimal("4.0"), Decimal("0")),
                (10, "vision", 8.0, 0.0, Decimal("7.2"), Decimal("1.8"))]
    assert rows(exact) == expected
    live = report_buckets(teams=teams, start=date(2026, 9, 1), end=date(2026, 10, 1),
                          period="day", now=now)
    assert live.rolled_up_to == 0 and rows(live.buckets) == expected
    assert usage_days_roll_up(now=now) == 2
    rolled = report_buckets(teams=teams, start=date(2026, 9, 1), end=date(2026, 10, 1),
                            period="day", now=now)
    assert rolled.rolled_up_to > 0 and rows(rolled.buckets) == expected
