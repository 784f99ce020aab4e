"""Rule W5 and the windows of a booking (docs/scheduling.md, "Booked GPUs"): recurring
occurrences across daylight saving, the earliest window a booking can be guaranteed,
and its holds built from a snapshot. No Django."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from queueing.policy.bookings import (
    Booking,
    booking_holds,
    earliest_booking,
    earliest_window,
    occurrences,
)
from queueing.policy.snapshot import NodeState

from .test_admission import NOW, nodes, run, snap

H = timedelta(hours=1)


def utc(year: int, month: int, day: int, hour: int = 0) -> datetime:
    return datetime(year, month, day, hour, tzinfo=UTC)


def test_rule_w5_a_weekly_booking_keeps_its_wall_clock_time_across_daylight_saving() -> None:
    # Thursday 14:00 in Paris: 13:00 UTC in winter (CET), 12:00 UTC from 29 March (CEST).
    first = utc(2026, 3, 19, 13)
    got = list(occurrences(first, 4 * H, "FREQ=WEEKLY;COUNT=4", "Europe/Paris",
                           after=utc(2026, 3, 1), before=utc(2026, 5, 1)))
    assert [s for s, _ in got] == [utc(2026, 3, 19, 13), utc(2026, 3, 26, 13),
                                   utc(2026, 4, 2, 12), utc(2026, 4, 9, 12)]
    assert all(e - s == 4 * H for s, e in got)


def test_rule_w5_occurrences_are_cut_to_the_horizon_and_keep_one_already_on() -> None:
    first = utc(2026, 1, 1, 9)
    got = list(occurrences(first, 2 * H, "FREQ=DAILY", "UTC",
                           after=utc(2026, 1, 3, 10), before=utc(2026, 1, 5, 9)))
    # The 3rd's window (9-11) is still on at 10:00; the 5th's starts at the horizon.
    assert [s for s, _ in got] == [utc(2026, 1, 3, 9), utc(2026, 1, 4, 9)]
    once = list(occurrences(first, 2 * H, "", "UTC", after=utc(2026, 1, 1, 12),
                            before=utc(2026, 2, 1)))
    assert once == []


def test_rule_w5_the_earliest_window_begins_as_holds_end() -> None:
    t0 = utc(2026, 1, 5, 12)
    holds = [(t0, t0 + 2 * H, 8), (t0 + H, t0 + 5 * H, 4)]
    # 16 units: 8 + 4 held until 2 h; 4 until 5 h. 8 more for 2 h fit from 2 h on.
    assert earliest_window(16, holds, 8, 2 * H, t0, t0 + 48 * H) == t0 + 2 * H
    # 16 more only once everything ended.
    assert earliest_window(16, holds, 16, 2 * H, t0, t0 + 48 * H) == t0 + 5 * H
    assert earliest_window(16, holds, 17, H, t0, t0 + 48 * H) is None
    assert earliest_window(16, holds, 16, H, t0, t0 + 4 * H) is None  # latest too soon
    # A window may begin as another ends (back to back).
    assert earliest_window(8, [(t0 + H, t0 + 3 * H, 8)], 8, H, t0, t0 + 9 * H) == t0
    assert earliest_window(8, [(t0 + H, t0 + 3 * H, 8)], 8, 2 * H, t0, t0 + 9 * H) == t0 + 3 * H


def test_rule_w5_open_ended_holds_never_end() -> None:
    t0 = utc(2026, 1, 5, 12)
    assert earliest_window(8, [(t0, None, 4)], 8, H, t0, t0 + 99 * H) is None
    assert earliest_window(8, [(t0, None, 4)], 4, H, t0, t0 + 99 * H) == t0


def test_rule_w5_holds_are_other_bookings_and_non_preemptible_running_jobs() -> None:
    world = (*nodes(("h100", 8), ("h100", 8), ("a100", 8)),
             NodeState("s-0", "h100", 8, 8, spot=True))  # no booking on a spot node
    other = Booking(7, "b", "h100", 8, NOW + 2 * H, NOW + 4 * H)
    moved = Booking(8, "c", "h100", 4, NOW, NOW + H)
    ending = replace(run(50, gpus=4, preemptible=False), max_runtime_seconds=7200)
    forever = run(51, gpus=2, preemptible=False, on=("h100-1",))
    lent = run(52, gpus=8, on=("h100-1",))  # preemptible: rule W2 takes it back
    s = snap(nodes=world, running=(ending, forever, lent), bookings=(other, moved))
    capacity, holds = booking_holds(s, "h100", exclude=8)
    assert capacity == 16
    assert sorted(holds, key=lambda h: (h[0], h[2])) == [
        (NOW, None, 2), (NOW, NOW + H, 4), (NOW + 2 * H, NOW + 4 * H, 8)]
    # 14 for an hour: now (2 open ended + 4 until 1 h leave 10) no; at 1 h (2 held)
    # yes, ending as the other booking begins; for two hours only after it, at 4 h.
    assert earliest_booking(s, "h100", 14, H, NOW + 48 * H, exclude=8) == NOW + H
    assert earliest_booking(s, "h100", 14, 2 * H, NOW + 48 * H, exclude=8) == NOW + 4 * H
    assert earliest_booking(s, "h100", 6, H, NOW + 48 * H, exclude=8) == NOW
    assert earliest_booking(s, "h100", 15, H, NOW + 48 * H, exclude=8) is None
