"""The reports page's numbers (docs/dashboard.md, "Reports"): allocated, used, idle and
preempted GPU-hours and cost per team and UTC day or month — the roll-up's whole days
(`UsageDay`) plus, live, the usage records it does not hold yet and the attempts running
now. The same numbers as `cost_buckets` over whole days (rules C1-C4)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

from django.core.cache import cache
from django.db.models import Case, F, IntegerField, Min, OuterRef, Subquery, Sum, Value, When
from django.db.models.functions import TruncMonth

from accounts.models import Team
from queueing.models import GpuType, Job, UsageDay, UsagePruned, UsageRecord, UsageRollup
from queueing.policy.costs import cost_pieces, month_start, own_price, price_at
from queueing.policy.states import JobState
from queueing.selectors.costs import CostBucket, add_hours, attempts, price_lists

ROLLED_UP_CACHE_SECONDS = 600.0  # keyed by the roll-up's state: only to bound the memory


@dataclass(frozen=True)
class Report:
    start: date
    end: date  # exclusive
    period: str
    buckets: list[CostBucket]  # by period, team, GPU type
    rolled_up_to: int  # the roll-up's last usage record id


def report_buckets(*, teams: Iterable[Team], start: date, end: date, period: str,
                   now: datetime) -> Report:
    """Per (period, team, GPU type) over the UTC days [start, end). Four queries plus
    the live part's two; O(periods × teams × types × prices) rows in Python."""
    teams = list(teams)
    team_ids = [t.pk for t in teams]
    slug = {t.pk: t.slug for t in teams}
    parents = dict(Team.objects.filter(pk__in=team_ids, parent__isnull=False)
                   .values_list("pk", "parent__slug"))
    gpu_slugs = dict(GpuType.objects.values_list("pk", "slug"))
    prices = price_lists()
    mark, rolled_at = UsageRollup.objects.filter(pk=1).values_list(
        "last_record_id", "updated_at").first() or (0, None)
    acc: dict[tuple[date, int, int], CostBucket] = {}

    def bucket(day: date, team_id: int, gpu_type_id: int) -> CostBucket:
        key_period = day if period == "day" else month_start(day)
        key = (key_period, team_id, gpu_type_id)
        b = acc.get(key)
        if b is None:
            b = acc[key] = CostBucket(
                period=key_period, team=slug[team_id],
                department=parents.get(team_id) or slug[team_id],
                gpu_type=gpu_slugs.get(gpu_type_id, str(gpu_type_id)))
        return b

    def midnight(d: date) -> datetime:
        return datetime.combine(d, time(0), tzinfo=UTC)

    # The roll-up summed in the database per period, team, GPU type and price segment
    # (the days between two of the type's price changes: one price, rule C1): a few
    # thousand rows for a year of 100 teams, whatever the number of days.
    segment = Case(*[
        When(gpu_type_id=gpu_type_id, day__gte=p.effective_from, then=Value(k))
        for gpu_type_id, points in prices.items()
        for k, p in sorted(enumerate(points), key=lambda kp: kp[1].effective_from,
                           reverse=True)
    ], default=Value(-1), output_field=IntegerField()) if prices else Value(-1)
    rows = (
        UsageDay.objects.filter(team_id__in=team_ids, day__gte=start, day__lt=end)
        .annotate(p=F("day") if period == "day" else TruncMonth("day"), seg=segment)
        .values("p", "team_id", "gpu_type_id", "seg")
        .annotate(first=Min("day"), alloc=Sum("allocated_gpu_hours"),
                  used=Sum("used_gpu_hours"), idle=Sum("idle_gpu_hours"),
                  pre=Sum("preempted_gpu_hours"), lost=Sum("lost_gpu_hours"))
        .values_list("first", "team_id", "gpu_type_id", "alloc", "used", "idle", "pre", "lost")
    )
    # The roll-up's sums change only when the roll-up moves its mark or a checkpoint
    # corrects a rolled-up day's lost work (both stamp `updated_at`): kept under a key of
    # both and of everything else the query reads (prices, teams, range, period).
    key = "fairq:reports:days:" + hashlib.sha256(repr(
        (mark, rolled_at, period, start, end, team_ids, sorted(prices.items()))
    ).encode()).hexdigest()
    summed = cache.get(key)
    if summed is None:
        summed = list(rows)
        cache.set(key, summed, timeout=ROLLED_UP_CACHE_SECONDS)
    for first, team_id, gpu_type_id, alloc, used, idle, pre, lost in summed:
        add_hours(bucket(first, team_id, gpu_type_id), allocated=alloc, used=used, idle=idle,
                  preempted=pre, price=price_at(prices.get(gpu_type_id, ()), midnight(first)),
                  lost=lost or 0.0)
    lo, hi = midnight(start), midnight(end)
    # Rule C4: the roll-up's hours of a record with its own price (a spot attempt's) were
    # priced above at the type's list; priced again at the record's own price instead.
    # The roll-up does not tell spot hours apart: those records (a few) are read again.
    for a in attempts(team_ids=team_ids, start=lo, end=hi, now=None, records_up_to=mark,
                      spot_or_own_price_only=True):
        for piece in cost_pieces(gpus=a.gpus, start=max(a.start, lo), end=min(a.end, hi),
                                 prices=own_price(a.price) if a.price is not None else ()):
            b = bucket(piece.day, a.team_id, a.gpu_type_id)
            hours = Decimal(repr(piece.gpu_hours))
            idle = Decimal(repr(piece.gpu_hours * a.idle_fraction))
            listed = price_at(prices.get(a.gpu_type_id, ()), midnight(piece.day))
            price = a.price if a.price is not None else listed
            if a.price is not None:
                if listed is None:
                    b.unpriced_gpu_hours -= piece.gpu_hours
                else:
                    b.cost -= hours * listed
                    b.idle_cost -= idle * listed
                b.cost += hours * a.price
                b.idle_cost += idle * a.price
            if a.spot:
                b.spot_gpu_hours += piece.gpu_hours
                if price is not None:
                    b.spot_cost += hours * price
    for a in attempts(team_ids=team_ids, start=lo, end=hi, now=now, records_after=mark):
        last = None
        for piece in cost_pieces(gpus=a.gpus, start=max(a.start, lo), end=min(a.end, hi),
                                 prices=a.prices(prices)):
            h = piece.gpu_hours
            last = bucket(piece.day, a.team_id, a.gpu_type_id)
            add_hours(last, allocated=h,
                      used=h * a.used_fraction, idle=h * a.idle_fraction,
                      preempted=h if a.preempted else 0.0, price=piece.price, spot=a.spot)
        if a.lost and last is not None and a.end <= hi:
            last.lost_gpu_hours += a.lost  # on the preemption's day
    keys = sorted(acc, key=lambda k: (k[0], slug[k[1]], gpu_slugs.get(k[2], "")))
    return Report(start=start, end=end, period=period, buckets=[acc[k] for k in keys],
                  rolled_up_to=mark)


def first_usage_day(*, teams: Iterable[Team], now: datetime) -> date | None:
    """The first UTC day with GPU time of `teams`: their first usage record's (pruned
    ones included), or the start of an attempt running now when earlier; None without
    any (three indexed reads)."""
    team_ids = [t.pk for t in teams]
    # Each team's first record on its (team, start) index, then the least of them: a
    # few index probes per team, not a scan of every record (staff: every team).
    first_record = UsageRecord.objects.filter(team_id=OuterRef("pk")).order_by("start")
    firsts = [
        Team.objects.filter(pk__in=team_ids).annotate(
            first=Subquery(first_record.values("start")[:1])).aggregate(
            least=Min("first"))["least"],
        Job.objects.filter(team_id__in=team_ids, status=JobState.RUNNING.value,
                           started_at__lte=now).aggregate(first=Min("started_at"))["first"],
    ]
    # Records pruned by `history_prune` (their first start kept per team) count too.
    firsts.append(UsagePruned.objects.filter(team_id__in=team_ids).aggregate(
        first=Min("first_start"))["first"])
    known = [f for f in firsts if f is not None]
    return min(known).astimezone(UTC).date() if known else None


def default_period(*, first: date | None, today: date) -> str:
    """The reports page's period when none is asked for: by day while all the GPU time
    fits in the last 30 days (a few days of data are a few points, not one month's
    spike), else by month."""
    return "day" if first is not None and first > today - timedelta(days=30) else "month"


def default_range(*, period: str, today: date, first: date | None = None) -> tuple[date, date]:
    """The last 12 months (this one included) by month, the last 30 days by day; from
    `first` (the first day with GPU time: its month by month) when that is later, so the
    range holds no empty periods before the data starts."""
    end = today + timedelta(days=1)
    if period == "day":
        start = end - timedelta(days=30)
        return (max(start, first) if first is not None and first <= today else start), end
    first_month = month_start(today)
    year, month = first_month.year, first_month.month - 11
    while month < 1:
        year, month = year - 1, month + 12
    start = date(year, month, 1)
    if first is not None and first <= today:
        start = max(start, month_start(first))
    return start, end
