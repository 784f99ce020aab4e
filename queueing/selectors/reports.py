"""The reports page's numbers (docs/dashboard.md, "Reports"): allocated, used, idle and
preempted GPU-hours and cost per team and UTC day or month — the roll-up's whole days
(`UsageDay`) plus, live, the usage records it does not hold yet and the attempts running
now. The same numbers as `cost_buckets` over whole days (rules C1-C4)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from itertools import chain, count
from typing import Any

from django.core.cache import cache
from django.db.models import (
    Case,
    F,
    FilteredRelation,
    IntegerField,
    JSONField,
    Min,
    OuterRef,
    Q,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import TruncMonth

from accounts.models import Team
from queueing.models import (
    AttemptUtilization,
    GpuType,
    Job,
    UsageDay,
    UsagePruned,
    UsageRecord,
    UsageRollup,
)
from queueing.policy.costs import cost_pieces, month_start, own_price, price_at
from queueing.policy.states import JobState
from queueing.selectors.costs import (
    Attempt,
    CostBucket,
    add_hours,
    attempt_of,
    attempts,
    price_lists,
    spot_attempt_price,
    spot_pools_of,
)
from queueing.selectors.gpu_share import GPU_SHARE

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
    inp = _Inputs(teams, period)
    acc: dict[tuple[date, int, int], CostBucket] = {}
    bucket = inp.bucket_in(acc)
    _rolled_up(inp, bucket, start=start, end=end, period=period)
    _live(inp, bucket, start=start, end=end, now=now)
    return Report(start=start, end=end, period=period, buckets=inp.ordered(acc),
                  rolled_up_to=inp.mark)


class _Inputs:
    """What both parts of a report read once: the teams, their departments, the GPU
    types, the price lists and the roll-up's state. `every_team`: `teams` are every
    team, and the queries name none (`query_ids` None): a list of 1,000 ids costs more
    to send and match than the rows it selects."""

    def __init__(self, teams: Iterable[Team], period: str, *, every_team: bool = False
                 ) -> None:
        teams = list(teams)
        self.period = period
        self.team_ids = [t.pk for t in teams]
        self.query_ids: list[int] | None = None if every_team else self.team_ids
        self.slug = {t.pk: t.slug for t in teams}
        self.parents = dict(_of_teams(Team.objects.filter(parent__isnull=False),
                                      self.query_ids, "pk").values_list("pk", "parent__slug"))
        self.gpu_slugs = dict(GpuType.objects.values_list("pk", "slug"))
        self.prices = price_lists()
        self.mark, self.rolled_at = UsageRollup.objects.filter(pk=1).values_list(
            "last_record_id", "updated_at").first() or (0, None)

    def key(self, start: date, end: date) -> str:
        """Everything the rolled-up part reads: the roll-up's mark and `updated_at` (a
        checkpoint correcting a rolled-up day stamps it), the prices, the teams, the
        range and the period."""
        return "fairq:reports:days:" + hashlib.sha256(repr(
            (self.mark, self.rolled_at, self.period, start, end, self.team_ids,
             sorted(self.prices.items()))
        ).encode()).hexdigest()

    def bucket_in(self, acc: dict[tuple[date, int, int], CostBucket]) -> Any:
        period, slug, parents, gpu_slugs = self.period, self.slug, self.parents, self.gpu_slugs

        def bucket(day: date, team_id: int, gpu_type_id: int) -> CostBucket:
            key_period = day if period == "day" else month_start(day)
            key = (key_period, team_id, gpu_type_id)
            b = acc.get(key)
            if b is None:
                if team_id not in slug:  # every team's rows: a team made since they were read
                    return CostBucket(period=key_period, team="", department="", gpu_type="")
                b = acc[key] = CostBucket(
                    period=key_period, team=slug[team_id],
                    department=parents.get(team_id) or slug[team_id],
                    gpu_type=gpu_slugs.get(gpu_type_id, str(gpu_type_id)))
            return b
        return bucket

    def ordered(self, acc: dict[tuple[date, int, int], CostBucket]) -> list[CostBucket]:
        slug, gpu_slugs = self.slug, self.gpu_slugs
        keys = sorted(acc, key=lambda k: (k[0], slug[k[1]], gpu_slugs.get(k[2], "")))
        return [acc[k] for k in keys]


def _of_teams(qs: Any, team_ids: list[int] | None, field: str = "team_id") -> Any:
    """`qs` of these teams; of every team for None."""
    return qs if team_ids is None else qs.filter(**{f"{field}__in": team_ids})


def _midnight(d: date) -> datetime:
    return datetime.combine(d, time(0), tzinfo=UTC)


def _rolled_up(inp: _Inputs, bucket: Any, *, start: date, end: date, period: str) -> None:
    """The roll-up's days of [start, end) into `bucket`'s buckets, records with a price of
    their own priced again (rule C4): all of it fixed while the roll-up's mark and
    `updated_at` are."""
    prices = inp.prices
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
        _of_teams(UsageDay.objects.filter(day__gte=start, day__lt=end), inp.query_ids)
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
    key = inp.key(start, end)
    summed = cache.get(key)
    if summed is None:
        summed = list(rows)
        cache.set(key, summed, timeout=ROLLED_UP_CACHE_SECONDS)
    for first, team_id, gpu_type_id, alloc, used, idle, pre, lost in summed:
        add_hours(bucket(first, team_id, gpu_type_id), allocated=alloc, used=used, idle=idle,
                  preempted=pre, price=price_at(prices.get(gpu_type_id, ()), _midnight(first)),
                  lost=lost or 0.0)
    lo, hi = _midnight(start), _midnight(end)
    # Rule C4: the roll-up's hours of a record with its own price (a spot attempt's) were
    # priced above at the type's list; priced again at the record's own price instead.
    # The roll-up does not tell spot hours apart: those records (a few) are read again.
    for a in attempts(team_ids=inp.query_ids, start=lo, end=hi, now=None,
                      records_up_to=inp.mark, spot_or_own_price_only=True):
        for piece in cost_pieces(gpus=a.gpus, start=max(a.start, lo), end=min(a.end, hi),
                                 prices=own_price(a.price) if a.price is not None else ()):
            b = bucket(piece.day, a.team_id, a.gpu_type_id)
            hours = Decimal(repr(piece.gpu_hours))
            idle = Decimal(repr(piece.gpu_hours * a.idle_fraction))
            listed = price_at(prices.get(a.gpu_type_id, ()), _midnight(piece.day))
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


def _live(inp: _Inputs, bucket: Any, *, start: date, end: date, now: datetime) -> None:
    """What the roll-up does not hold yet into `bucket`'s buckets: the usage records
    after its mark and the attempts running at `now`. The reference of `_live_kept`."""
    lo, hi = _midnight(start), _midnight(end)
    for a in attempts(team_ids=inp.team_ids, start=lo, end=hi, now=now,
                      records_after=inp.mark):
        last = None
        for piece in cost_pieces(gpus=a.gpus, start=max(a.start, lo), end=min(a.end, hi),
                                 prices=a.prices(inp.prices)):
            h = piece.gpu_hours
            last = bucket(piece.day, a.team_id, a.gpu_type_id)
            add_hours(last, allocated=h,
                      used=h * a.used_fraction, idle=h * a.idle_fraction,
                      preempted=h if a.preempted else 0.0, price=piece.price, spot=a.spot)
        if a.lost and last is not None and a.end <= hi:
            last.lost_gpu_hours += a.lost  # on the preemption's day


# The live part's finished days, kept per process. An attempt's pieces (rule C2: cut at
# UTC midnights and price changes) before today's midnight are fixed while its start,
# GPUs, team, type and prices are: only the last, open day moves with `now`. Each
# attempt's pieces up to today's midnight are kept under a key of all of those, grouped
# by (day's bucket, GPU-hours, price): full days of one price are one group. What moves
# with `now` or the utilization (the used and idle fractions, rule C3) is applied per
# request: the used and idle hours as a group's hours × the fraction (to the float
# rounding of summing them piece by piece), the idle cost exactly as each piece's
# (`add_hours`: the idle hours' decimal × the price) times the group's pieces.
_PIECES: dict[tuple[Any, ...], tuple[list[tuple[Any, ...]], date | None]] = {}
_PIECES_MAX = 60_000  # attempts × ranges kept per process; emptied when full
_PRICE_IDS: dict[tuple[Any, ...], int] = {}
# Never reused, also after `_PRICE_IDS` is emptied: a request holds the numbers it took
# (per GPU type, in the open days' keys) while a later attempt may empty it.
_PRICE_NUMBERS = count(1)


def _price_id(prices: tuple[Any, ...]) -> int:
    """A small number per price list (a key's part cheaper to hash than the list)."""
    n = _PRICE_IDS.get(prices)
    if n is None:
        if len(_PRICE_IDS) > 10_000:
            _PRICE_IDS.clear()
            _PIECES.clear()
        n = _PRICE_IDS[prices] = next(_PRICE_NUMBERS)
    return n


def _fixed_pieces(a: Any, prices: Any, price_id: int, lo: datetime, hi: datetime,
                  period: str) -> tuple[list[tuple[Any, ...]], date | None]:
    """`a`'s pieces in [lo, hi), grouped: [(day, team, type, GPU-hours, price, pieces,
    GPU-hours summed, cost summed)], and the last piece's day; kept under their key."""
    key = (a.team_id, a.gpu_type_id, a.gpus, lo, hi, price_id, period)
    kept = _PIECES.get(key)
    if kept is not None:
        return kept
    groups: dict[tuple[Any, ...], list[Any]] = {}
    day = None
    for piece in cost_pieces(gpus=a.gpus, start=lo, end=hi, prices=prices):
        day, h, price = piece.day, piece.gpu_hours, piece.price
        g = groups.get((day if period == "day" else month_start(day), h, price))
        if g is None:
            groups[(day if period == "day" else month_start(day), h, price)] = [
                day, h, price, 1, h, Decimal(0) if price is None else
                Decimal(repr(h)) * price]
        else:
            g[3] += 1
            g[4] += h
            if price is not None:
                g[5] += Decimal(repr(h)) * price
    out = ([tuple(g) for g in groups.values()], day)
    if len(_PIECES) >= _PIECES_MAX:
        _PIECES.clear()
    _PIECES[key] = out
    return out


# The running attempts' utilization rows (one per job and attempt) read by one join, not
# three correlated subqueries: at 5,000 running jobs the subqueries' estimated cost
# crossed PostgreSQL's JIT threshold, and compiling the query took ~80 ms of its ~157 ms
# (docs/performance.md, "The dashboard's p95 and staff's reports again"). Off: the
# subqueries, as before (bench/bench_dashboard.py --running-ab times both sides).
RUNNING_JOINED = True


def _running(team_ids: list[int] | None, *, end: datetime, now: datetime
             ) -> Iterator[Attempt]:
    """`attempts`' attempts running at `now` (started before `end`), the same ones with
    the same figures, read lean: in no order, their spot pools only when they run on spot
    (rule C4; 5,000 JSON values less to decode at the fleet's size), their utilization
    row joined (`RUNNING_JOINED`)."""
    jobs = _of_teams(Job.objects.filter(status=JobState.RUNNING.value,
                                        started_at__isnull=False,
                                        started_at__lt=min(end, now)), team_ids)
    if RUNNING_JOINED:
        # At most one row per job: (job, attempt) is unique (`one_utilization_per_attempt`).
        jobs = jobs.annotate(u=FilteredRelation(
            "utilization", condition=Q(utilization__attempt=F("attempt"))))
        utilization: tuple[str, ...] = ("u__samples", "u__sm_mean", "u__sm_hist")
    else:
        util = AttemptUtilization.objects.filter(job_id=OuterRef("pk"),
                                                 attempt=OuterRef("attempt"))
        jobs = jobs.annotate(u_samples=Subquery(util.values("samples")[:1]),
                             u_sm_mean=Subquery(util.values("sm_mean")[:1]),
                             u_hist=Subquery(util.values("sm_hist")[:1]))
        utilization = ("u_samples", "u_sm_mean", "u_hist")
    running = list(
        jobs.annotate(share=GPU_SHARE,
                      pools=Case(When(on_spot=True, then=F("spot_pools")),
                                 default=Value(None), output_field=JSONField()))
        .order_by()
        .values_list("team_id", "gpu_type_id", "share", "started_at", *utilization,
                     "tier__idle_threshold_percent", "on_spot", "cluster_id", "pools"))
    pools = spot_pools_of(r[9] for r in running if r[8])
    for team_id, gpu_type_id, share, started, samples, sm_mean, hist, threshold, \
            on_spot, cluster_id, spot_pools in running:
        price = spot_attempt_price(spot_pools=spot_pools, cluster_id=cluster_id,
                                   gpu_type_id=gpu_type_id, pools=pools) if on_spot else None
        yield attempt_of(team_id, gpu_type_id, share, started, now, samples, sm_mean, hist,
                         threshold, preempted=False, spot=on_spot, price=price)


def _live_kept(inp: _Inputs, bucket: Any, *, start: date, end: date, now: datetime) -> None:
    """`_live`'s figures (GPU-hours to the float rounding of summing a group's pieces at
    once; amounts exactly): each attempt's days before today's midnight kept
    (`_fixed_pieces`), only its open day cut and priced per request, once per GPUs and
    price list for the attempts that started before today (their open days are alike)."""
    lo, hi = _midnight(start), _midnight(end)
    today = datetime.combine(now.astimezone(UTC).date(), time(0), tzinfo=UTC)
    ids: dict[int, int] = {}
    open_days: dict[tuple[Any, ...], list[Any]] = {}
    records = attempts(team_ids=inp.query_ids, start=lo, end=hi, now=None,
                       records_after=inp.mark)
    running = _running(inp.query_ids, end=hi, now=now) if now > lo else iter(())
    for a in chain(records, running):
        prices = a.prices(inp.prices)
        if a.price is not None:
            price_id = _price_id(("own", a.price))
        else:
            price_id = ids.get(a.gpu_type_id) or ids.setdefault(
                a.gpu_type_id, _price_id(tuple(prices)))
        s, e = max(a.start, lo), min(a.end, hi)
        last = None
        uf, f, preempted, spot = a.used_fraction, a.idle_fraction, a.preempted, a.spot
        # Rule C2 cuts at every UTC midnight: the pieces of [s, e) are those of [s, m)
        # and of [m, e), m today's midnight.
        m = min(max(today, s), e) if s < e else e
        if s < m:
            groups, last_day = _fixed_pieces(a, prices, price_id, s, m, inp.period)
            for day, h, price, n, hours, cost in groups:
                b = bucket(day, a.team_id, a.gpu_type_id)
                b.allocated_gpu_hours += hours
                b.used_gpu_hours += hours * uf
                b.idle_gpu_hours += hours * f
                if preempted:
                    b.preempted_gpu_hours += hours
                if spot:
                    b.spot_gpu_hours += hours
                if price is None:
                    b.unpriced_gpu_hours += hours
                    continue
                b.cost += cost
                if f:
                    b.idle_cost += n * (Decimal(repr(h * f)) * price)
                if spot:
                    b.spot_cost += cost
            if last_day is not None:
                last = bucket(last_day, a.team_id, a.gpu_type_id)
        if m == today:
            pieces = open_days.get((a.gpus, price_id, e))
            if pieces is None:
                pieces = open_days[(a.gpus, price_id, e)] = list(
                    cost_pieces(gpus=a.gpus, start=m, end=e, prices=prices))
        else:
            pieces = list(cost_pieces(gpus=a.gpus, start=m, end=e, prices=prices))
        for piece in pieces:
            h = piece.gpu_hours
            last = bucket(piece.day, a.team_id, a.gpu_type_id)
            add_hours(last, allocated=h, used=h * uf, idle=h * f,
                      preempted=h if preempted else 0.0, price=piece.price, spot=spot)
        if a.lost and last is not None and a.end <= hi:
            last.lost_gpu_hours += a.lost  # on the preemption's day


# --- the page's figures: per team over the range, and the chart's columns --------------------
#
# Staff's page at 1,000 teams holds ~21,000 buckets (teams × months × types), nearly all
# of them rolled up: summing them into the per-team table and the chart on every request
# cost ~1-2 s (docs/performance.md, "The dashboard's and staff's reports' own work"). The
# rolled-up part's figures are summed once per roll-up state and kept in the process
# (`_KEPT`, under `_Inputs.key`); a request adds only the live part's buckets to a copy.


KINDS = ("allocated", "used", "idle", "preempted")
_KEPT: dict[str, ReportSummary] = {}
_KEPT_MAX = 4  # roll-up states × ranges kept per process (~10 MB each at 1,000 teams)


@dataclass
class ReportSummary:
    """Per team over [start, end) (`totals`: GPU-hours and cost by kind, its
    department) and the chart's columns: GPU-hours by kind per period (every team
    summed), cost per team per period, and each team's cost over the range."""

    start: date
    end: date
    period: str
    periods: list[date]
    totals: dict[str, dict[str, Any]]
    hours: dict[str, list[float]]
    cost: dict[str, list[float]]
    spend: dict[str, Decimal]
    rolled_up_to: int = 0

    def add(self, b: CostBucket) -> None:
        """One bucket's figures (the report's buckets, in order, make the summary)."""
        t = self.totals.get(b.team)
        if t is None:
            t = self.totals[b.team] = {
                "team": b.team, "department": b.department, "allocated": 0.0, "used": 0.0,
                "idle": 0.0, "preempted": 0.0, "cost": Decimal(0), "idle_cost": Decimal(0),
                "spot": 0.0, "spot_cost": Decimal(0), "lost": 0.0}
        t["allocated"] += b.allocated_gpu_hours
        t["used"] += b.used_gpu_hours
        t["idle"] += b.idle_gpu_hours
        t["preempted"] += b.preempted_gpu_hours
        t["cost"] += b.cost
        t["idle_cost"] += b.idle_cost
        t["spot"] += b.spot_gpu_hours  # rule C4: spot time apart
        t["spot_cost"] += b.spot_cost
        t["lost"] += b.lost_gpu_hours  # preemptions' lost work (from checkpoints)
        i = self._index.get(b.period)
        if i is None:
            return
        self.hours["allocated"][i] += b.allocated_gpu_hours
        self.hours["used"][i] += b.used_gpu_hours
        self.hours["idle"][i] += b.idle_gpu_hours
        self.hours["preempted"][i] += b.preempted_gpu_hours
        cost = self.cost.get(b.team)
        if cost is None:
            cost = self.cost[b.team] = [0.0] * len(self.periods)
        cost[i] += float(b.cost)
        self.spend[b.team] = self.spend.get(b.team, Decimal(0)) + b.cost

    @property
    def _index(self) -> dict[date, int]:
        index: dict[date, int] | None = self.__dict__.get("_index_")
        if index is None:
            index = self.__dict__["_index_"] = {p: i for i, p in enumerate(self.periods)}
        return index

    def copy(self) -> ReportSummary:
        return ReportSummary(
            start=self.start, end=self.end, period=self.period, periods=self.periods,
            totals={k: dict(v) for k, v in self.totals.items()},
            hours={k: list(v) for k, v in self.hours.items()},
            cost={k: list(v) for k, v in self.cost.items()}, spend=dict(self.spend),
            rolled_up_to=self.rolled_up_to)


def report_periods(start: date, end: date, period: str) -> list[date]:
    """The periods of [start, end): its days, or the months from start's."""
    out = []
    d = start if period == "day" else start.replace(day=1)
    while d < end:
        out.append(d)
        if period == "day":
            d = d.fromordinal(d.toordinal() + 1)
        else:
            d = d.replace(year=d.year + 1, month=1) if d.month == 12 else d.replace(month=d.month + 1)
    return out


def _empty_summary(start: date, end: date, period: str, mark: int) -> ReportSummary:
    periods = report_periods(start, end, period)
    return ReportSummary(start=start, end=end, period=period, periods=periods, totals={},
                         hours={k: [0.0] * len(periods) for k in KINDS}, cost={}, spend={},
                         rolled_up_to=mark)


def report_summary_plain(*, teams: Iterable[Team], start: date, end: date, period: str,
                         now: datetime) -> ReportSummary:
    """The reference: every bucket of `report_buckets`, in its order, summed."""
    report = report_buckets(teams=teams, start=start, end=end, period=period, now=now)
    out = _empty_summary(start, end, period, report.rolled_up_to)
    for b in report.buckets:
        out.add(b)
    return out


def report_summary(*, teams: Iterable[Team], start: date, end: date, period: str,
                   now: datetime, every_team: bool = False) -> ReportSummary:
    """`report_summary_plain`'s figures (to the float rounding of adding a bucket's
    live hours after its rolled-up ones): the rolled-up part summed once per roll-up
    state and kept in the process, a copy plus the live part's buckets per request.
    `every_team`: `teams` are every team (staff's page), read with no list of ids; a
    team made since `teams` were read is left out."""
    inp = _Inputs(teams, period, every_team=every_team)
    key = inp.key(start, end)
    kept = _KEPT.get(key)
    if kept is None:
        acc: dict[tuple[date, int, int], CostBucket] = {}
        _rolled_up(inp, inp.bucket_in(acc), start=start, end=end, period=period)
        kept = _empty_summary(start, end, period, inp.mark)
        for b in inp.ordered(acc):
            kept.add(b)
        while len(_KEPT) >= _KEPT_MAX:
            _KEPT.pop(next(iter(_KEPT)))
        _KEPT[key] = kept
    out = kept.copy()
    live: dict[tuple[date, int, int], CostBucket] = {}
    _live_kept(inp, inp.bucket_in(live), start=start, end=end, now=now)
    for b in inp.ordered(live):
        out.add(b)
    return out


_FIRSTS: dict[tuple[Any, ...], datetime | None] = {}
_FIRSTS_MAX = 64


def first_usage_day(*, teams: Iterable[Team], now: datetime, every_team: bool = False
                    ) -> date | None:
    """The first UTC day with GPU time of `teams`: their first usage record's (pruned
    ones included), or the start of an attempt running now when earlier; None without
    any. The records up to the roll-up's mark are read once per mark and process; those
    after it, the running attempts and the pruned ones' starts per request.
    `every_team`: `teams` are every team, read with no list of ids."""
    team_ids = [t.pk for t in teams]
    query_ids = None if every_team else team_ids
    mark, rolled_at = UsageRollup.objects.filter(pk=1).values_list(
        "last_record_id", "updated_at").first() or (0, None)
    key = (mark, rolled_at, tuple(team_ids))
    if key in _FIRSTS:
        up_to_mark = _FIRSTS[key]
    else:
        # Each team's first record on its (team, start) index, then the least of them: a
        # few index probes per team, not a scan of every record (staff: every team).
        first_record = UsageRecord.objects.filter(
            team_id=OuterRef("pk"), pk__lte=mark).order_by("start")
        up_to_mark = _of_teams(Team.objects.all(), query_ids, "pk").annotate(
            first=Subquery(first_record.values("start")[:1])).aggregate(
            least=Min("first"))["least"]
        while len(_FIRSTS) >= _FIRSTS_MAX:
            _FIRSTS.pop(next(iter(_FIRSTS)))
        _FIRSTS[key] = up_to_mark
    firsts = [
        up_to_mark,
        _of_teams(UsageRecord.objects.filter(pk__gt=mark), query_ids).aggregate(
            first=Min("start"))["first"],
        _of_teams(Job.objects.filter(status=JobState.RUNNING.value, started_at__lte=now),
                  query_ids).aggregate(first=Min("started_at"))["first"],
    ]
    # Records pruned by `history_prune` (their first start kept per team) count too.
    firsts.append(_of_teams(UsagePruned.objects.all(), query_ids).aggregate(
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
