"""Rules C1-C3 (docs/scheduling.md), pure: prices by date, intervals cut at UTC days and
price changes, idle minutes from the histogram."""

from __future__ import annotations

from datetime import UTC, date, datetime
from decimal import Decimal

import pytest

from queueing.policy.costs import (
    Piece,
    PricePoint,
    cost_pieces,
    idle_minutes,
    money,
    price_at,
)

PRICES = [PricePoint(date(2026, 1, 1), Decimal("2.00")),
          PricePoint(date(2026, 3, 1), Decimal("3.50"))]


def at(month: int, day: int, hour: int = 0, minute: int = 0) -> datetime:
    return datetime(2026, month, day, hour, minute, tzinfo=UTC)


@pytest.mark.parametrize(("when", "price"), [
    (datetime(2025, 12, 31, 23, 59, tzinfo=UTC), None),
    (at(1, 1), Decimal("2.00")),
    (at(2, 28, 23, 59), Decimal("2.00")),
    (at(3, 1), Decimal("3.50")),
    (at(12, 31), Decimal("3.50")),
])
def test_rule_c1_the_price_in_effect_is_the_last_one_started(when: datetime,
                                                             price: Decimal | None) -> None:
    assert price_at(PRICES, when) == price


def test_rule_c2_an_interval_across_a_price_change_pays_each_side_its_price() -> None:
    pieces = list(cost_pieces(gpus=2, start=at(2, 28, 22), end=at(3, 1, 3), prices=PRICES))
    assert pieces == [Piece(date(2026, 2, 28), 4.0, Decimal("2.00")),
                      Piece(date(2026, 3, 1), 6.0, Decimal("3.50"))]
    cost = sum(Decimal(repr(p.gpu_hours)) * (p.price or 0) for p in pieces)
    assert money(cost) == Decimal("29.00")  # 4 h at 2.00 + 6 h at 3.50


def test_rule_c2_intervals_are_cut_at_utc_midnights() -> None:
    pieces = list(cost_pieces(gpus=1, start=at(1, 10, 12), end=at(1, 12, 6), prices=PRICES))
    assert [(p.day.day, p.gpu_hours) for p in pieces] == [(10, 12.0), (11, 24.0), (12, 6.0)]


def test_rule_c1_time_before_the_first_price_is_unpriced() -> None:
    pieces = list(cost_pieces(gpus=1, start=datetime(2025, 12, 31, 22, tzinfo=UTC),
                              end=at(1, 1, 1), prices=PRICES))
    assert [(p.gpu_hours, p.price) for p in pieces] == [(2.0, None), (1.0, Decimal("2.00"))]


def test_empty_intervals_have_no_pieces() -> None:
    assert list(cost_pieces(gpus=1, start=at(1, 2), end=at(1, 2), prices=PRICES)) == []
    assert list(cost_pieces(gpus=0, start=at(1, 2), end=at(1, 3), prices=PRICES)) == []


@pytest.mark.parametrize(("threshold", "minutes"), [
    (0.0, 0), (1.0, 10), (4.5, 10), (5.0, 15), (50.0, 15), (100.0, 18),
])
def test_rule_c3_idle_minutes_are_the_bins_wholly_below_the_threshold(
        threshold: float, minutes: int) -> None:
    hist = {"0": 10, "4": 5, "50": 2, "99": 1}
    assert idle_minutes(hist, threshold_percent=threshold) == minutes
