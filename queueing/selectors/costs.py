"""Cost and GPU-hours per team, department (the team's parent), period and GPU type
(docs/scheduling.md, rules C1-C4): what the reports page, GET /api/v1/costs/,
`manage.py export_costs` and the budget check read. Callers scope teams to the actor."""

from __future__ import annotations

import csv
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any, TextIO

from django.conf import settings
from django.db.models import OuterRef, Q, QuerySet, Subquery

from accounts.models import Team
from queueing.models import AttemptUtilization, GpuPrice, GpuType, Job, NodePool, UsageRecord
from queueing.policy.costs import (
    PricePoint,
    cost_pieces,
    idle_minutes,
    money,
    month_start,
    own_price,
    spot_pools_price,
)
from queueing.policy.states import JobState
from queueing.selectors.accounting import ended_transition
from queueing.selectors.gpu_share import GPU_SHARE

PERIODS = ("day", "month")
# Rule C4's spot columns come last: a reader of the earlier columns by position reads on.
CSV_COLUMNS = ("period", "team", "department", "gpu_type", "allocated_gpu_hours",
               "used_gpu_hours", "idle_gpu_hours", "preempted_gpu_hours", "unpriced_gpu_hours",
               "cost", "idle_cost", "currency", "spot_gpu_hours", "spot_cost",
               "lost_gpu_hours")


@dataclass
class CostBucket:
    """One team's GPU time and cost of one GPU type in one period (a UTC day or month).

    `allocated`: GPU-hours held; `used`: allocated × mean SM activity of the attempt
    (0 without readings); `idle`: rule C3's paid-but-idle GPU-hours; `preempted`: the
    GPU-hours of attempts that ended preempted; `unpriced`: GPU-hours before the type's
    first price (costing nothing, shown so the gap is visible); `spot_gpu_hours` and
    `spot_cost`: the part of `allocated` and `cost` of attempts on spot nodes (rule C4);
    `lost_gpu_hours`: the work the period's preemptions lost (from each victim's newest
    checkpoint, or its start, to the preemption; counted on the preemption's day)."""

    period: date
    team: str
    department: str
    gpu_type: str
    allocated_gpu_hours: float = 0.0
    used_gpu_hours: float = 0.0
    idle_gpu_hours: float = 0.0
    preempted_gpu_hours: float = 0.0
    unpriced_gpu_hours: float = 0.0
    cost: Decimal = Decimal(0)
    idle_cost: Decimal = Decimal(0)
    spot_gpu_hours: float = 0.0
    spot_cost: Decimal = Decimal(0)
    lost_gpu_hours: float = 0.0


@dataclass(frozen=True, slots=True)
class Attempt:
    team_id: int
    gpu_type_id: int
    gpus: float  # GPU-equivalents: a fraction of a shared GPU its share
    start: datetime
    end: datetime
    used_fraction: float  # sm_mean / 100, 0 without readings
    idle_fraction: float  # rule C3, of the attempt's GPU-hours
    preempted: bool
    spot: bool = False  # rule C4: ran on spot nodes
    price: Decimal | None = None  # rule C4: its own price per GPU-hour (None: rule C1's)
    lost: float = 0.0  # a preempted attempt's lost work, GPU-hours (at its end)

    def prices(self, lists: dict[int, list[PricePoint]]) -> Sequence[PricePoint]:
        """Rule C4: its own price if it has one, else its GPU type's list (rule C1)."""
        return own_price(self.price) if self.price is not None else \
            lists.get(self.gpu_type_id, ())


def currency() -> str:
    return str(settings.FAIRQ_CURRENCY)


def price_lists() -> dict[int, list[PricePoint]]:
    """Rule C1's price list per GPU type id, oldest first."""
    out: dict[int, list[PricePoint]] = defaultdict(list)
    for gpu_type_id, effective_from, price in GpuPrice.objects.order_by(
            "gpu_type_id", "effective_from").values_list(
            "gpu_type_id", "effective_from", "price_per_gpu_hour"):
        out[gpu_type_id].append(PricePoint(effective_from, price))
    return dict(out)


# Per cluster id, its spot pools as (name, GPU type id, price), by name.
SpotPools = Mapping[int, Sequence[tuple[str, int, Decimal | None]]]


def spot_pools_of(cluster_ids: Iterable[int | None]) -> dict[int, list[
        tuple[str, int, Decimal | None]]]:
    """Rule C4: the spot `NodePool`s of these clusters, with their prices now (one
    query)."""
    out: dict[int, list[tuple[str, int, Decimal | None]]] = defaultdict(list)
    ids = {c for c in cluster_ids if c is not None}
    if not ids:
        return {}
    for cluster_id, name, gpu_type_id, price in NodePool.objects.filter(
            cluster_id__in=ids, spot=True).order_by("cluster_id", "name").values_list(
            "cluster_id", "name", "gpu_type_id", "price_per_gpu_hour"):
        out[cluster_id].append((name, gpu_type_id, price))
    return dict(out)


def spot_attempt_price(*, spot_pools: object, cluster_id: int | None, gpu_type_id: int,
                       pools: SpotPools) -> Decimal | None:
    """Rule C4: the price per GPU-hour, now, of a spot attempt of `cluster_id` whose GPUs
    ran in `spot_pools` (`Job.spot_pools`): its pools' GPU-weighted price
    (`spot_pools_price`). An attempt admitted before fairq recorded its pools (no
    `spot_pools`) is priced as it was then: its cluster's spot pool of its GPU type, the
    first by name."""
    listed = pools.get(cluster_id, ()) if cluster_id is not None else ()
    parts = ({str(k): v for k, v in spot_pools.items() if isinstance(v, int) and v > 0}
             if isinstance(spot_pools, dict) else {})
    if not parts:
        return next((price for _, g, price in listed if g == gpu_type_id), None)
    return spot_pools_price(parts, {name: price for name, _, price in listed})


def attempts(*, team_ids: list[int] | None, start: datetime | None, end: datetime | None,
             now: datetime | None, records_after: int = 0,
             records_up_to: int | None = None,
             spot_or_own_price_only: bool = False) -> Iterator[Attempt]:
    """Charged attempts (usage records with ids in (`records_after`, `records_up_to`],
    imported ones included; `spot_or_own_price_only`: only those on spot nodes or with
    their own price, rule C4)
    and, unless `now` is None, the attempts running now (up to `now`), of `team_ids`
    (None: every team) overlapping [start, end) (None: open)."""
    util = AttemptUtilization.objects.filter(job_id=OuterRef("job_id"),
                                             attempt=OuterRef("attempt"))
    qs = UsageRecord.objects.filter(pk__gt=records_after)
    if records_up_to is not None:
        qs = qs.filter(pk__lte=records_up_to)
    if spot_or_own_price_only:
        qs = qs.filter(Q(spot=True) | Q(price_per_gpu_hour__isnull=False))
    if team_ids is not None:
        qs = qs.filter(team_id__in=team_ids)
    if start is not None:
        qs = qs.filter(end__gt=start)
    if end is not None:
        qs = qs.filter(start__lt=end)
    records = (
        qs.annotate(u_samples=Subquery(util.values("samples")[:1]),
                  u_sm_mean=Subquery(util.values("sm_mean")[:1]),
                  u_hist=Subquery(util.values("sm_hist")[:1]),
                  ended=ended_transition("to_status"))
        .values_list("team_id", "gpu_type_id", "gpus", "start", "end", "u_samples",
                     "u_sm_mean", "u_hist", "job__tier__idle_threshold_percent", "ended",
                     "spot", "price_per_gpu_hour", "lost_gpu_hours")
    )
    for team_id, gpu_type_id, gpus, r_start, r_end, samples, sm_mean, hist, threshold, ended, \
            spot, price, lost in records.iterator(chunk_size=5000):
        yield attempt_of(team_id, gpu_type_id, gpus, r_start, r_end, samples, sm_mean, hist,
                         threshold, preempted=ended == JobState.PREEMPTED.value, spot=spot,
                         price=price, lost=lost or 0.0)
    if now is None or (start is not None and now <= start):
        return
    # A running job's attempt is its current one.
    util = AttemptUtilization.objects.filter(job_id=OuterRef("pk"), attempt=OuterRef("attempt"))
    jobs = Job.objects.filter(status=JobState.RUNNING.value, started_at__isnull=False,
                              started_at__lt=now if end is None else min(end, now))
    if team_ids is not None:
        jobs = jobs.filter(team_id__in=team_ids)
    running = list(
        jobs.annotate(u_samples=Subquery(util.values("samples")[:1]),
                  u_sm_mean=Subquery(util.values("sm_mean")[:1]),
                  u_hist=Subquery(util.values("sm_hist")[:1]))
        .annotate(share=GPU_SHARE)
        .values_list("team_id", "gpu_type_id", "share", "started_at",
                     "u_samples", "u_sm_mean", "u_hist", "tier__idle_threshold_percent",
                     "on_spot", "cluster_id", "spot_pools")
    )
    # Rule C4: a running spot attempt at its pools' prices now (what charging it would
    # freeze).
    pools = spot_pools_of(r[9] for r in running if r[8])
    for team_id, gpu_type_id, share, started, samples, sm_mean, hist, threshold, \
            on_spot, cluster_id, spot_pools in running:
        if started is None:  # excluded by the filter; for the type checker
            continue
        price = spot_attempt_price(spot_pools=spot_pools, cluster_id=cluster_id,
                                   gpu_type_id=gpu_type_id, pools=pools) if on_spot else None
        yield attempt_of(team_id, gpu_type_id, share, started, now, samples, sm_mean,
                         hist, threshold, preempted=False, spot=on_spot, price=price)


def attempt_of(team_id: int, gpu_type_id: int, gpus: float, start: datetime, end: datetime,
               samples: int | None, sm_mean: float | None, hist: Any, threshold: float | None,
               *, preempted: bool, spot: bool = False,
               price: Decimal | None = None, lost: float = 0.0) -> Attempt:
    """An attempt's figures from its row: used by its mean SM activity, idle by its
    minutes below the tier's threshold (rule C3)."""
    minutes = (end - start).total_seconds() / 60
    idle = 0.0
    if samples and threshold and isinstance(hist, dict) and minutes > 0:
        idle = min(1.0, idle_minutes(hist, threshold_percent=threshold) / minutes)
    return Attempt(team_id, gpu_type_id, gpus, start, end,
                    used_fraction=(sm_mean or 0.0) / 100 if samples else 0.0,
                    idle_fraction=idle, preempted=preempted, spot=spot, price=price,
                    lost=lost)


def cost_buckets(*, teams: Iterable[Team], start: datetime, end: datetime, period: str,
                 now: datetime) -> list[CostBucket]:
    """GPU-hours and cost per (period, team, GPU type) within [start, end), sorted by
    period, team and GPU type. Intervals are cut at `start`, `end`, UTC midnights and
    price changes (rule C2); a piece costs its GPU-hours × the price then (rule C1), or
    the attempt's own price (rule C4: a spot attempt's)."""
    teams = list(teams)
    team_ids = [t.pk for t in teams]
    slug = {t.pk: t.slug for t in teams}
    parents = dict(Team.objects.filter(pk__in=team_ids, parent__isnull=False)
                   .values_list("pk", "parent__slug"))
    gpu_slugs = dict(_gpu_types())
    prices = price_lists()
    acc: dict[tuple[date, int, int], CostBucket] = {}
    for a in attempts(team_ids=team_ids, start=start, end=end, now=now):
        lo, hi = max(a.start, start), min(a.end, end)
        last: CostBucket | None = None
        for piece in cost_pieces(gpus=a.gpus, start=lo, end=hi, prices=a.prices(prices)):
            key_period = piece.day if period == "day" else month_start(piece.day)
            key = (key_period, a.team_id, a.gpu_type_id)
            b = acc.get(key)
            if b is None:
                b = acc[key] = CostBucket(
                    period=key_period, team=slug[a.team_id],
                    department=parents.get(a.team_id) or slug[a.team_id],
                    gpu_type=gpu_slugs.get(a.gpu_type_id, str(a.gpu_type_id)))
            hours = piece.gpu_hours
            add_hours(b, allocated=hours, used=hours * a.used_fraction,
                      idle=hours * a.idle_fraction, preempted=hours if a.preempted else 0.0,
                      price=piece.price, spot=a.spot)
            last = b
        if a.lost and last is not None and a.end <= end:
            last.lost_gpu_hours += a.lost  # on the preemption's day (its last piece)
    return [acc[k] for k in sorted(acc, key=lambda k: (k[0], slug[k[1]], gpu_slugs.get(k[2], "")))]


def add_hours(b: CostBucket, *, allocated: float, used: float, idle: float, preempted: float,
              price: Decimal | None, spot: bool = False, lost: float = 0.0) -> None:
    """Add GPU-hours of one day at one price to `b`, and their cost (rule C1; none before
    the type's first price: `unpriced`); `spot`: they ran on spot nodes (rule C4), and
    count in the spot GPU-hours and cost too."""
    b.allocated_gpu_hours += allocated
    b.used_gpu_hours += used
    b.idle_gpu_hours += idle
    b.preempted_gpu_hours += preempted
    b.lost_gpu_hours += lost
    if spot:
        b.spot_gpu_hours += allocated
    if price is None:
        b.unpriced_gpu_hours += allocated
        return
    cost = Decimal(repr(allocated)) * price
    b.cost += cost
    b.idle_cost += Decimal(repr(idle)) * price
    if spot:
        b.spot_cost += cost


def _gpu_types() -> list[tuple[int, str]]:
    return list(GpuType.objects.values_list("pk", "slug"))


def bucket_as_dict(b: CostBucket) -> dict[str, Any]:
    """A bucket with GPU-hours to 4 places and amounts to the cent (as strings, so no
    float ever rounds money), in the CSV's column names."""
    return {
        "period": b.period.isoformat(), "team": b.team, "department": b.department,
        "gpu_type": b.gpu_type,
        "allocated_gpu_hours": round(b.allocated_gpu_hours, 4),
        "used_gpu_hours": round(b.used_gpu_hours, 4),
        "idle_gpu_hours": round(b.idle_gpu_hours, 4),
        "preempted_gpu_hours": round(b.preempted_gpu_hours, 4),
        "unpriced_gpu_hours": round(b.unpriced_gpu_hours, 4),
        "cost": str(money(b.cost)), "idle_cost": str(money(b.idle_cost)),
        "currency": currency(),
        "spot_gpu_hours": round(b.spot_gpu_hours, 4), "spot_cost": str(money(b.spot_cost)),
        "lost_gpu_hours": round(b.lost_gpu_hours, 4),
    }


def by_department(buckets: Iterable[CostBucket]) -> list[CostBucket]:
    """The buckets summed per (period, department, GPU type); `team` is the department."""
    acc: dict[tuple[date, str, str], CostBucket] = {}
    for b in buckets:
        key = (b.period, b.department, b.gpu_type)
        d = acc.get(key)
        if d is None:
            d = acc[key] = CostBucket(period=b.period, team=b.department,
                                      department=b.department, gpu_type=b.gpu_type)
        d.allocated_gpu_hours += b.allocated_gpu_hours
        d.used_gpu_hours += b.used_gpu_hours
        d.idle_gpu_hours += b.idle_gpu_hours
        d.preempted_gpu_hours += b.preempted_gpu_hours
        d.unpriced_gpu_hours += b.unpriced_gpu_hours
        d.cost += b.cost
        d.idle_cost += b.idle_cost
        d.spot_gpu_hours += b.spot_gpu_hours
        d.spot_cost += b.spot_cost
        d.lost_gpu_hours += b.lost_gpu_hours
    return [acc[k] for k in sorted(acc)]


def costs_write_csv(*, out: TextIO, buckets: Iterable[CostBucket]) -> int:
    """The buckets as finance's CSV (CSV_COLUMNS; amounts to the cent). Returns the rows."""
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    n = 0
    for b in buckets:
        d = bucket_as_dict(b)
        writer.writerow([d[c] for c in CSV_COLUMNS])
        n += 1
    return n


def month_range(day: date) -> tuple[datetime, datetime]:
    """[first instant, first instant of the next month) of `day`'s UTC month."""
    first = month_start(day)
    nxt = (first.replace(year=first.year + 1, month=1) if first.month == 12
           else first.replace(month=first.month + 1))
    return (datetime(first.year, first.month, 1, tzinfo=UTC),
            datetime(nxt.year, nxt.month, 1, tzinfo=UTC))


def gpu_prices_listed() -> QuerySet[GpuPrice]:
    """Every GPU price with its type, by type slug and the day it starts."""
    return GpuPrice.objects.select_related("gpu_type").order_by(
        "gpu_type__slug", "effective_from")


def gpu_price_by_id(*, price_id: int) -> GpuPrice | None:
    return GpuPrice.objects.filter(pk=price_id).first()
