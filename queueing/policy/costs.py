"""Cost of GPU time (docs/scheduling.md, rules C1-C4), pure: intervals and price lists
in, pieces per UTC day out. No Django, no clock."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal

ONE_DAY = timedelta(days=1)


@dataclass(frozen=True, slots=True)
class PricePoint:
    """Rule C1: `price` per GPU-hour from the start of the UTC day `effective_from`."""

    effective_from: date
    price: Decimal

    @property
    def starts(self) -> datetime:
        return datetime.combine(self.effective_from, time(0), tzinfo=UTC)


@dataclass(frozen=True, slots=True)
class Piece:
    """A part of an interval inside one UTC day at one price (None: no price yet)."""

    day: date
    gpu_hours: float
    price: Decimal | None


def price_at(prices: Sequence[PricePoint], when: datetime) -> Decimal | None:
    """Rule C1: the price in effect at `when` (prices sorted by `effective_from`): the
    last one that started at or before it; None before the first."""
    current: Decimal | None = None
    for p in prices:
        if p.starts > when:
            break
        current = p.price
    return current


def own_price(price: Decimal) -> tuple[PricePoint, ...]:
    """Rule C4: an attempt with its own price (a spot pool's, frozen when charged) as a
    price list of one price in effect for ever, so rule C2 still cuts it at UTC
    midnights and every piece costs that price."""
    return (PricePoint(date.min, price),)


# UsageRecord.price_per_gpu_hour's decimal places: a gang's mean price is rounded to them.
PRICE_PLACES = Decimal("0.0001")


def spot_pools_price(parts: Mapping[str, int],
                     prices: Mapping[str, Decimal | None]) -> Decimal | None:
    """Rule C4: the price per GPU-hour of a spot attempt whose GPUs ran in the pools
    `parts` ({pool name: GPUs}; "" = nodes in no pool), each pool at its `prices` entry:
    the GPU-weighted mean (what its GPUs cost, pool by pool, divided by its GPUs), rounded
    to PRICE_PLACES. None - rule C1's list prices it - when it has no GPUs or some of them
    ran where there is no own price (no pool, a pool without a price, a pool gone)."""
    gpus = sum(parts.values())
    if gpus <= 0:
        return None
    total = Decimal(0)
    for name, n in parts.items():
        price = prices.get(name) if name else None
        if price is None:
            return None
        total += price * n
    return (total / gpus).quantize(PRICE_PLACES)


def cost_pieces(*, gpus: float, start: datetime, end: datetime,
                prices: Sequence[PricePoint]) -> Iterator[Piece]:
    """Rule C2: the interval [start, end) of `gpus` GPUs cut at UTC midnights and at
    price changes; each piece priced by the price in effect at its start (rule C1), so
    an interval across a change pays the old price up to it and the new one after."""
    if end <= start or gpus <= 0:
        return
    changes = sorted(p.starts for p in prices if start < p.starts < end)
    t = start
    while t < end:
        midnight = datetime.combine(t.astimezone(UTC).date(), time(0), tzinfo=UTC) + ONE_DAY
        stop = min(end, midnight, *(c for c in changes if c > t))
        hours = (stop - t).total_seconds() / 3600
        yield Piece(day=t.astimezone(UTC).date(), gpu_hours=gpus * hours,
                    price=price_at(prices, t))
        t = stop


def idle_minutes(hist: Mapping[str, int], *, threshold_percent: float) -> int:
    """Rule C3: minutes of an attempt whose SM activity was below the tier's idle
    threshold, from the attempt's histogram (whole percents, `hist["p"]` minutes in
    [p, p + 1)): the bins wholly below it. A threshold of 0 counts none."""
    return sum(int(n) for p, n in hist.items() if int(p) + 1 <= threshold_percent)


def money(value: Decimal) -> Decimal:
    """Amounts as reported: to the cent, half up."""
    return value.quantize(Decimal("0.01"), rounding="ROUND_HALF_UP")


def month_start(day: date) -> date:
    return day.replace(day=1)
