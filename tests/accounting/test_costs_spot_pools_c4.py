"""Rule C4: a spot attempt is charged at the price of the spot pool(s) it really ran in,
not its cluster's first spot pool by name; the cost reports show spot GPU-hours apart.

One simulated cloud cluster with two spot pools of a100 nodes told apart by a zone label
(`+zone=...` in the node spec): `spot-a` (zone a, 0.90 per GPU-hour) and `spot-b` (zone
b, 1.30). The a100's price list says 2.00."""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from unittest import mock

import pytest
from django.core.management import call_command
from django.test import Client
from django.utils import timezone

from queueing.backends.base import ClusterBackend, WorkloadStatus
from queueing.backends.simulated import parse_node_spec
from queueing.models import Cluster, Job, JobEvent, NodePool, UsageRecord
from queueing.policy.costs import money, spot_pools_price
from queueing.selectors.costs import CostBucket, by_department, cost_buckets
from queueing.selectors.reports import report_buckets
from queueing.services.costs import gpu_price_set
from queueing.services.reports import usage_days_roll_up
from queueing.services.scheduler import scheduler_cycle
from tests.clusters.conftest import Flaky, backend_of, queued
from tests.conftest import World

from .history import finished_attempt
from .history import job as history_job

PRICE_A = Decimal("0.90")
PRICE_B = Decimal("1.30")
LIST_PRICE = Decimal("2.00")


# --- pure: a gang's price ------------------------------------------------------------------

def test_rule_c4_a_gang_across_spot_pools_pays_the_gpu_weighted_price() -> None:
    prices = {"spot-a": PRICE_A, "spot-b": PRICE_B, "free": None}
    assert spot_pools_price({"spot-b": 8}, prices) == PRICE_B
    # 8 GPUs at 0.90 and 8 at 1.30: 17.60 an hour for 16 GPUs.
    assert spot_pools_price({"spot-a": 8, "spot-b": 8}, prices) == Decimal("1.1000")
    # 12 at 0.90, 4 at 1.30: 16.00 / 16 = 1.00; 8 and 4: 12.40 / 12, rounded to 4 places.
    assert spot_pools_price({"spot-a": 12, "spot-b": 4}, prices) == Decimal("1.0000")
    assert spot_pools_price({"spot-a": 8, "spot-b": 4}, prices) == Decimal("1.0333")


def test_rule_c4_a_spot_attempt_partly_where_no_own_price_is_priced_by_c1() -> None:
    prices = {"spot-a": PRICE_A, "free": None}
    assert spot_pools_price({"spot-a": 8, "free": 8}, prices) is None  # a pool without one
    assert spot_pools_price({"spot-a": 8, "": 8}, prices) is None  # nodes in no pool
    assert spot_pools_price({"spot-a": 8, "gone": 8}, prices) is None  # a pool deleted
    assert spot_pools_price({}, prices) is None


def test_rule_c4_simulated_node_specs_carry_labels_that_say_the_pool() -> None:
    (pool,) = parse_node_spec("2x8xa100:spot+zone=b+topology.kubernetes.io/zone=eu-1b@rack=1")
    assert (pool.spot, pool.labels, pool.domains) == (
        True, (("zone", "b"), ("topology.kubernetes.io/zone", "eu-1b")), (("rack", 1),))


# --- the cycle: charged where it ran --------------------------------------------------------

@pytest.fixture
def two_pools(world: World) -> Cluster:
    gpu_price_set(actor=world.staff, gpu_type=world.a100, effective_from=date(2020, 1, 1),
                  price_per_gpu_hour=LIST_PRICE)
    cloud = Cluster.objects.create(name="cloud", backend="simulated",
                                   sim_nodes="1x8xa100:spot+zone=a,1x8xa100:spot+zone=b")
    NodePool.objects.create(cluster=cloud, name="spot-a", gpu_type=world.a100, spot=True,
                            node_labels={"zone": "a"}, price_per_gpu_hour=PRICE_A)
    NodePool.objects.create(cluster=cloud, name="spot-b", gpu_type=world.a100, spot=True,
                            node_labels={"zone": "b"}, price_per_gpu_hour=PRICE_B)
    return cloud


def _run_two(world: World, t0: datetime) -> tuple[Job, Job]:
    """Two 8-GPU spot jobs, one per node: the first in zone a, the second in zone b."""
    first = queued(world, gpu_type=world.a100, tier=world.low, seconds=1800,
                   at=t0 - timedelta(seconds=2))
    second = queued(world, gpu_type=world.a100, tier=world.low, team=world.nlp,
                    seconds=1800, at=t0 - timedelta(seconds=1))
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    first.refresh_from_db()
    second.refresh_from_db()
    return first, second


@pytest.mark.django_db
def test_rule_c4_an_attempt_in_the_second_spot_pool_is_charged_its_price(
        world: World, two_pools: Cluster) -> None:
    t0 = timezone.now() - timedelta(hours=3)
    first, second = _run_two(world, t0)
    assert (first.status, first.on_spot, first.placement, first.spot_pools) == (
        "RUNNING", True, ["sim-a100-000"], {"spot-a": 8})
    assert (second.status, second.on_spot, second.placement, second.spot_pools) == (
        "RUNNING", True, ["sim-a100-001"], {"spot-b": 8})
    # The admission's event says where it went (every change is an event).
    admitted = JobEvent.objects.get(job=second, to_status="ADMITTED")
    assert admitted.data["spot_pools"] == {"spot-b": 8}

    scheduler_cycle(now=t0 + timedelta(seconds=1900))

    a = UsageRecord.objects.get(job=first)
    b = UsageRecord.objects.get(job=second)
    assert (a.spot, a.price_per_gpu_hour) == (True, PRICE_A)
    assert (b.spot, b.price_per_gpu_hour) == (True, PRICE_B)  # not spot-a's, first by name
    buckets = cost_buckets(teams=[world.vision, world.nlp], start=t0 - timedelta(days=1),
                           end=t0 + timedelta(days=1), period="month", now=timezone.now())
    cost = {bk.team: money(bk.cost) for bk in buckets}
    # 4 GPU-hours each: at 0.90 and at 1.30.
    assert cost == {"vision": Decimal("3.60"), "nlp": Decimal("5.20")}
    # A later pool price never reprices a charged record.
    NodePool.objects.filter(name="spot-b").update(price_per_gpu_hour=Decimal("0.10"))
    assert UsageRecord.objects.get(job=second).price_per_gpu_hour == PRICE_B


@pytest.mark.django_db
def test_rule_c4_a_running_attempt_in_the_second_spot_pool_costs_its_price_now(
        world: World, two_pools: Cluster) -> None:
    t0 = timezone.now() - timedelta(hours=1)
    _, second = _run_two(world, t0)
    assert second.started_at is not None and second.spot_pools == {"spot-b": 8}
    now = second.started_at + timedelta(minutes=15)
    (bucket,) = cost_buckets(teams=[world.nlp], start=t0 - timedelta(days=1),
                             end=t0 + timedelta(days=1), period="month", now=now)
    assert bucket.allocated_gpu_hours == pytest.approx(2.0)
    assert money(bucket.cost) == Decimal("2.60")  # 2 GPU-hours at 1.30, not 0.90


@pytest.mark.django_db
def test_rule_c4_a_gang_across_both_spot_pools_is_charged_their_gpu_weighted_price(
        world: World, two_pools: Cluster) -> None:
    t0 = timezone.now() - timedelta(hours=3)
    gang = queued(world, gpu_type=world.a100, tier=world.low, replicas=2, seconds=1800,
                  at=t0 - timedelta(seconds=1))
    scheduler_cycle(now=t0)
    scheduler_cycle(now=t0 + timedelta(seconds=1))
    gang.refresh_from_db()
    assert (gang.status, sorted(gang.placement), gang.spot_pools) == (
        "RUNNING", ["sim-a100-000", "sim-a100-001"], {"spot-a": 8, "spot-b": 8})
    scheduler_cycle(now=t0 + timedelta(seconds=1900))
    assert UsageRecord.objects.get(job=gang).price_per_gpu_hour == Decimal("1.1000")


class Rebound(Flaky):
    """The cluster binds the pods elsewhere than fairq planned (Kubernetes may: the
    planned node is a preference): each status names `moves[node]` instead."""

    def __init__(self, inner: ClusterBackend, moves: dict[str, str]) -> None:
        super().__init__(inner)
        self.moves = moves

    def statuses(self, *, now: datetime) -> list[WorkloadStatus]:
        return [replace(s, nodes=tuple(self.moves.get(n, n) for n in s.nodes))
                for s in super().statuses(now=now)]


@pytest.mark.django_db
def test_rule_c4_a_spot_attempt_bound_in_another_pool_than_planned_is_charged_there(
        world: World, two_pools: Cluster) -> None:
    t0 = timezone.now() - timedelta(hours=3)
    job = queued(world, gpu_type=world.a100, tier=world.low, seconds=1800,
                 at=t0 - timedelta(seconds=1))
    rebound = Rebound(backend_of(two_pools), {"sim-a100-000": "sim-a100-001"})
    scheduler_cycle(now=t0, backends={"cloud": rebound})
    job.refresh_from_db()
    assert (job.status, job.placement, job.spot_pools) == (
        "ADMITTED", ["sim-a100-000"], {"spot-a": 8})
    scheduler_cycle(now=t0 + timedelta(seconds=1), backends={"cloud": rebound})
    job.refresh_from_db()
    assert (job.status, job.placement, job.spot_pools) == (
        "RUNNING", ["sim-a100-001"], {"spot-b": 8})
    running = JobEvent.objects.get(job=job, to_status="RUNNING")
    assert running.data["spot_pools"] == {"spot-b": 8}
    scheduler_cycle(now=t0 + timedelta(seconds=1900), backends={"cloud": rebound})
    assert UsageRecord.objects.get(job=job).price_per_gpu_hour == PRICE_B


# --- the reports: spot GPU-hours and their cost apart ---------------------------------------

@pytest.fixture
def spot_history(world: World) -> World:
    """In September 2026, of vision's a100 time (list price 2.00 from Sept 1): 16 GPU-hours
    on spot at a pool's 0.90 (Sept 9, 20:00 to Sept 10, 04:00, 2 GPUs), 2 on spot
    in a pool without a price (the list's 2.00) and 4 on demand; nlp 2 on demand."""
    gpu_price_set(actor=world.staff, gpu_type=world.a100, effective_from=date(2026, 9, 1),
                  price_per_gpu_hour=LIST_PRICE)
    priced = finished_attempt(
        job=history_job(team=world.vision, gpu_type=world.a100, gpus_per_replica=2,
                        tier=world.low),
        attempt=1, start=datetime(2026, 9, 9, 20, tzinfo=UTC), hours=8, ended="SUCCEEDED")
    UsageRecord.objects.filter(pk=priced.pk).update(spot=True, price_per_gpu_hour=PRICE_A)
    unpriced = finished_attempt(
        job=history_job(team=world.vision, gpu_type=world.a100, tier=world.low),
        attempt=1, start=datetime(2026, 9, 10, 6, tzinfo=UTC), hours=2, ended="SUCCEEDED")
    UsageRecord.objects.filter(pk=unpriced.pk).update(spot=True)
    finished_attempt(job=history_job(team=world.vision, gpu_type=world.a100, tier=world.normal),
                     attempt=1, start=datetime(2026, 9, 10, 8, tzinfo=UTC), hours=4,
                     ended="SUCCEEDED")
    finished_attempt(job=history_job(team=world.nlp, gpu_type=world.a100, tier=world.normal),
                     attempt=1, start=datetime(2026, 9, 10, tzinfo=UTC), hours=2,
                     ended="SUCCEEDED")
    return world


def _spot_rows(buckets: list[CostBucket]) -> list[tuple[object, ...]]:
    return [(b.period.day, b.team, round(b.allocated_gpu_hours, 6), money(b.cost),
             round(b.spot_gpu_hours, 6), money(b.spot_cost)) for b in buckets]


SEPT = (datetime(2026, 9, 1, tzinfo=UTC), datetime(2026, 10, 1, tzinfo=UTC))
# Sept 9: 8 spot GPU-hours at 0.90. Sept 10: 8 more at 0.90, 2 spot at the list's 2.00 and
# 4 on demand at 2.00 (vision); 2 on demand (nlp).
SPOT_BY_DAY = [(9, "vision", 8.0, Decimal("7.20"), 8.0, Decimal("7.20")),
               (10, "nlp", 2.0, Decimal("4.00"), 0.0, Decimal("0.00")),
               (10, "vision", 14.0, Decimal("19.20"), 10.0, Decimal("11.20"))]


@pytest.mark.django_db
def test_rule_c4_cost_reports_show_spot_gpu_hours_and_cost_apart(spot_history: World) -> None:
    world = spot_history
    teams = [world.vision, world.nlp]
    now = datetime(2026, 11, 26, tzinfo=UTC)
    exact = cost_buckets(teams=teams, start=SEPT[0], end=SEPT[1], period="day", now=now)
    assert _spot_rows(exact) == SPOT_BY_DAY
    # The reports page's numbers, live and from the roll-up, say the same.
    live = report_buckets(teams=teams, start=date(2026, 9, 1), end=date(2026, 10, 1),
                          period="day", now=now)
    assert live.rolled_up_to == 0 and _spot_rows(live.buckets) == SPOT_BY_DAY
    assert usage_days_roll_up(now=now) == 4
    rolled = report_buckets(teams=teams, start=date(2026, 9, 1), end=date(2026, 10, 1),
                            period="day", now=now)
    assert rolled.rolled_up_to > 0 and _spot_rows(rolled.buckets) == SPOT_BY_DAY
    # By department (vision and nlp have none: each is its own).
    (month_vision,) = [b for b in by_department(cost_buckets(
        teams=teams, start=SEPT[0], end=SEPT[1], period="month", now=now)) if b.team == "vision"]
    assert (month_vision.spot_gpu_hours, money(month_vision.spot_cost)) == (
        pytest.approx(18.0), Decimal("18.40"))


@pytest.mark.django_db
def test_rule_c4_the_costs_api_csv_export_and_reports_page_show_spot_apart(
        spot_history: World, tmp_path: Path) -> None:
    world = spot_history
    params = {"from": "2026-09-01T00:00:00Z", "to": "2026-10-01T00:00:00Z"}
    body = world.client(world.staff).get("/api/v1/costs/", params).json()
    vision = [r for r in body["rows"] if r["team"] == "vision"]
    assert [(r["allocated_gpu_hours"], r["cost"], r["spot_gpu_hours"], r["spot_cost"])
            for r in vision] == [(22.0, "26.40", 18.0, "18.40")]
    out = tmp_path / "costs.csv"
    call_command("export_costs", str(out), "--month", "2026-09", "--period", "month",
                 stdout=io.StringIO())
    rows = list(csv.DictReader(io.StringIO(out.read_text())))
    assert [(r["team"], r["spot_gpu_hours"], r["spot_cost"]) for r in rows] == [
        ("nlp", "0.0", "0.00"), ("vision", "18.0", "18.40")]
    # After the earlier columns: readers by position read on (lost_gpu_hours came later).
    assert list(rows[0])[-3:] == ["spot_gpu_hours", "spot_cost", "lost_gpu_hours"]
    c = Client()
    c.force_login(world.admin)
    with mock.patch("queueing.web.reports.timezone.now",
                    return_value=datetime(2026, 9, 30, 12, tzinfo=UTC)):
        page = c.get("/reports/", {"period": "month", "team": "vision"}).content.decode()
    assert "Spot GPU-h" in page and "Spot cost" in page
    assert ">18.0<" in page and ">18.40<" in page
