"""Booked GPUs: a team's reservation of GPUs of one type for a window, once or
recurring (docs/scheduling.md, "Booked GPUs").

Pure: the windows of a recurring booking (`occurrences`) and the earliest window a new
booking can be guaranteed (`earliest_window`). What the admission pass does around a
booking lives in `stages/bookings.py`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING
from zoneinfo import ZoneInfo

from dateutil.rrule import rrulestr

if TYPE_CHECKING:
    from .snapshot import Snapshot


@dataclass(frozen=True, slots=True)
class Booking:
    """One occurrence of a reservation: `gpus` units of `gpu_type` (rule H1) for `team`
    from `start` to `end`. `lend`: its unused GPUs may run other teams' preemptible
    jobs, taken back when the team needs them."""

    id: int
    team: str
    gpu_type: str
    gpus: int
    start: datetime
    end: datetime
    lend: bool = True

    def active(self, at: datetime) -> bool:
        return self.start <= at < self.end


# A recurring booking's windows all start within this of its first (a longer rule is
# refused when written: queueing/services/reservations.py), so one whose first window
# started longer ago than this plus a window has no window left.
MAX_RECURRENCE = timedelta(days=366)


def occurrences(first_start: datetime, duration: timedelta, rule: str, tz: str,
                after: datetime, before: datetime, limit: int = 1000,
                ) -> Iterator[tuple[datetime, datetime]]:
    """The windows (start, end), in UTC, of a booking first at `first_start` lasting
    `duration` and repeating by the RFC 5545 recurrence `rule` ("" = once; e.g.
    "FREQ=WEEKLY;COUNT=10"), that end after `after` and start before `before`.

    The rule repeats the wall-clock time of `first_start` in the time zone `tz`: a
    weekly booking at Thursday 14:00 Europe/Paris stays at 14:00 across daylight saving.
    """
    zone = ZoneInfo(tz or "UTC")
    if not rule:
        if first_start + duration > after and first_start < before:
            yield first_start, first_start + duration
        return
    local = first_start.astimezone(zone).replace(tzinfo=None)
    # Walk from the first window that can still end after `after`.
    starts = rrulestr(rule, dtstart=local, ignoretz=True)
    lo = (after - duration).astimezone(zone).replace(tzinfo=None)
    hi = before.astimezone(zone).replace(tzinfo=None)
    first = starts.after(lo, inc=True)
    n = 0
    while first is not None and first < hi and n < limit:
        s = first.replace(tzinfo=zone).astimezone(UTC)
        if s + duration > after and s < before:
            yield s, s + duration
        n += 1
        first = starts.after(first, inc=False)


def earliest_window(capacity: int, holds: Iterable[tuple[datetime, datetime | None, int]],
                    gpus: int, duration: timedelta, not_before: datetime,
                    latest: datetime) -> datetime | None:
    """The earliest start `t >= not_before`, no later than `latest`, such that `gpus`
    more units fit beside `holds` all through `[t, t + duration)`: at every instant
    the units the holds active then take, plus `gpus`, are at most `capacity`.

    `holds` are what a booking cannot take: other bookings' windows and the running
    jobs no booking may preempt, each `(start, end, units)` with `end` None = open
    ended. A window can begin only at `not_before` or as a hold ends, so those are the
    only candidates. None when no window until `latest` fits.
    """
    if gpus > capacity:
        return None
    spans = [(s, e, u) for s, e, u in holds if u > 0]
    candidates = sorted({not_before, *(e for _s, e, _u in spans
                                       if e is not None and not_before < e <= latest)})
    for t in candidates:
        if _peak(spans, t, t + duration) + gpus <= capacity:
            return t
    return None


def _peak(spans: list[tuple[datetime, datetime | None, int]], lo: datetime,
          hi: datetime) -> int:
    """The most units `spans` hold at once within `[lo, hi)`."""
    edges: list[tuple[datetime, int]] = []
    for s, e, u in spans:
        if (e is not None and e <= lo) or s >= hi:
            continue
        edges.append((max(s, lo), u))
        if e is not None and e < hi:
            edges.append((e, -u))
    peak = held = 0
    # At one instant an end comes before a start: a window may begin as another ends.
    for _at, u in sorted(edges, key=lambda x: (x[0], x[1])):
        held += u
        peak = max(peak, held)
    return peak


Hold = tuple[datetime, datetime | None, int]


def booking_holds(snapshot: Snapshot, gpu_type: str,
                  exclude: int | None = None) -> tuple[int, list[Hold]]:
    """Rule W5: what a new booking of `gpu_type` cannot take, from a snapshot: the type's
    capacity (the units of its open nodes, rule K8, but spot ones: no booking is held on
    them, rule K4) and the holds - every other booking's
    window (`exclude`: a booking's id left out, the one being moved) and every running
    job of a non-preemptible tier, until its estimate ends (rule A9's estimated end; no
    estimate: open ended). Preemptible running jobs hold nothing: rule W2 preempts them
    at the booking's start."""
    capacity = sum(n.capacity for n in snapshot.open_nodes()
                   if n.gpu_type == gpu_type and not n.spot)
    holds: list[Hold] = [(b.start, b.end, b.gpus) for b in snapshot.bookings
                         if b.gpu_type == gpu_type and b.id != exclude]
    now = snapshot.now
    holds.extend((now, r.estimated_end(now), r.total_gpus) for r in snapshot.running
                 if r.gpu_type == gpu_type and not r.preemptible)
    return capacity, holds


def earliest_booking(snapshot: Snapshot, gpu_type: str, gpus: int, duration: timedelta,
                     latest: datetime, not_before: datetime | None = None,
                     exclude: int | None = None) -> datetime | None:
    """Rule W5 in one call: the earliest start, from `not_before` (default: the
    snapshot's now) to `latest`, at which `gpus` of `gpu_type` can be booked for
    `duration` beside `booking_holds`; None when none can."""
    capacity, holds = booking_holds(snapshot, gpu_type, exclude)
    return earliest_window(capacity, holds, gpus, duration, not_before or snapshot.now,
                           latest)
