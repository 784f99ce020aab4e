"""Reads of booked GPUs (docs/reservations.md): the live reservations' windows as the
policy's `Booking`s (the cycle's `Snapshot.bookings`), a type's other bookings past the
horizon (`other_bookings`; within it rule W5's `policy.bookings.booking_holds` says what
a new booking cannot take), the lists and the capacity view's timeline. Reads only."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db.models import Q, QuerySet

from accounts.models import Team
from accounts.selectors import teams_for_user
from queueing.errors import NotFound
from queueing.models import GpuType, Reservation
from queueing.policy.bookings import MAX_RECURRENCE, Booking, occurrences


def horizon() -> timedelta:
    """How far ahead bookings are seen and guaranteed (FAIRQ_BOOKING_HORIZON_HOURS)."""
    return timedelta(hours=float(settings.FAIRQ_BOOKING_HORIZON_HOURS))


def live_reservations() -> QuerySet[Reservation]:
    """Reservations not cancelled, with their team and type."""
    return (Reservation.objects.filter(cancelled_at__isnull=True)
            .select_related("team", "gpu_type"))


# A window's local wall-clock time may move by a daylight-saving shift against UTC.
_ZONE_SLACK = timedelta(hours=2)


def with_windows_after(rows: QuerySet[Reservation], now: datetime) -> QuerySet[Reservation]:
    """`rows` that may still have a window ending after `now`: a single booking ending
    after it, or a recurring one whose first window ended less than `MAX_RECURRENCE` ago
    (its last starts within that of its first). So a past recurring booking is not
    walked window by window every cycle, however many accumulate."""
    return rows.filter(Q(recurrence="", ends_at__gt=now)
                       | ~Q(recurrence="") & Q(ends_at__gt=now - MAX_RECURRENCE - _ZONE_SLACK))


def windows(r: Reservation, *, after: datetime, before: datetime,
            limit: int = 1000) -> Iterator[tuple[datetime, datetime]]:
    """`r`'s windows (UTC) that end after `after` and start before `before`."""
    return occurrences(r.starts_at, r.ends_at - r.starts_at, r.recurrence,
                       r.timezone or "UTC", after, before, limit=limit)


def bookings_of(rows: Iterable[Reservation], *, after: datetime,
                before: datetime) -> tuple[Booking, ...]:
    """The windows of `rows` within [after, before] as the policy's bookings (`gpus` in
    the type's units, as `Reservation.gpus` is), by start."""
    out = [Booking(r.pk, r.team.slug, r.gpu_type.slug, r.gpus, s, e, r.lend_unused)
           for r in rows for s, e in windows(r, after=after, before=before)]
    return tuple(sorted(out, key=lambda b: (b.start, b.id)))


def snapshot_bookings(*, now: datetime) -> tuple[Booking, ...]:
    """`Snapshot.bookings`: every live reservation's windows overlapping [now, now +
    FAIRQ_BOOKING_HORIZON_HOURS]. One query that finds nothing when none is live; a
    reservation whose last window ended (once, or its rule's COUNT/UNTIL reached) only
    costs its rule's walk."""
    rows = list(with_windows_after(live_reservations(), now))
    if not rows:
        return ()
    return bookings_of(rows, after=now, before=now + horizon())


def other_bookings(gpu_type: GpuType, *, after: datetime, before: datetime,
                   exclude: int | None = None) -> tuple[Booking, ...]:
    """The live bookings' windows of the type within [after, before] (`exclude`: a
    reservation left out)."""
    rows = with_windows_after(live_reservations().filter(gpu_type=gpu_type), after)
    if exclude is not None:
        rows = rows.exclude(pk=exclude)
    return bookings_of(rows, after=after, before=before)


def reservation_get_for_actor(*, actor: Any, reservation_id: int) -> Reservation:
    """The reservation if `actor` may see it (a member of its team, or staff): NotFound
    otherwise, as for one that does not exist."""
    row = (Reservation.objects.select_related("team", "gpu_type", "created_by")
           .filter(pk=reservation_id, team__in=teams_for_user(user=actor)).first())
    if row is None:
        raise NotFound(f"reservation {reservation_id} not found")
    return row


def reservations_visible_to(*, actor: Any, team: str | None = None,
                            gpu_type: str | None = None, active: bool | None = None,
                            now: datetime) -> list[Reservation]:
    """The reservations of `actor`'s teams (staff: every team's), filtered: `team`,
    `gpu_type` by slug; `active` True: not cancelled and with a window still to end,
    False: the others. By first start."""
    rows = (Reservation.objects.select_related("team", "gpu_type", "created_by")
            .filter(team__in=teams_for_user(user=actor)))
    if team:
        rows = rows.filter(team__slug=team)
    if gpu_type:
        rows = rows.filter(gpu_type__slug=gpu_type)
    out = list(rows.order_by("starts_at", "id")[:MAX_LISTED])
    if active is None:
        return out
    return [r for r in out if is_active(r, now=now) == active]


MAX_LISTED = 500


def is_active(r: Reservation, *, now: datetime) -> bool:
    """Not cancelled, and a window of it still to end."""
    if r.cancelled_at is not None:
        return False
    if not r.recurrence:
        return r.ends_at > now
    return next_windows(r, now=now, count=1) != []


def next_windows(r: Reservation, *, now: datetime, count: int = 10
                 ) -> list[tuple[datetime, datetime]]:
    """`r`'s next `count` windows that end after `now` (one under way first); none once
    cancelled."""
    if r.cancelled_at is not None:
        return []
    out: list[tuple[datetime, datetime]] = []
    for w in windows(r, after=now, before=now + timedelta(days=400), limit=count + 1):
        out.append(w)
        if len(out) >= count:
            break
    return out


@dataclass(frozen=True, slots=True)
class BookedWindow:
    """One upcoming window, as the capacity view lists it."""

    reservation: int
    team: str
    gpu_type: str
    gpus: float  # GPUs (a time-sliced type's units / its slices per GPU)
    start: datetime
    end: datetime
    lend: bool
    name: str

    def active(self, at: datetime) -> bool:
        return self.start <= at < self.end


def upcoming_windows(*, now: datetime, team: Any = None,
                     days: float = 7.0) -> dict[str, list[BookedWindow]]:
    """Per GPU type slug, the live bookings' windows overlapping [now, now + days]
    (`team`: only its), by start."""
    qs = live_reservations()
    if team is not None:
        qs = qs.filter(team=team)
    rows = {r.pk: r for r in qs}
    out: dict[str, list[BookedWindow]] = {}
    for b in bookings_of(rows.values(), after=now, before=now + timedelta(days=days)):
        r = rows[b.id]
        out.setdefault(b.gpu_type, []).append(BookedWindow(
            b.id, b.team, b.gpu_type, b.gpus / r.gpu_type.units_per_device, b.start, b.end,
            b.lend, r.name))
    return out


def only_team_of(actor: Any) -> Team | None:
    """`actor`'s team when they are in exactly one (a booking may leave it out)."""
    teams = list(Team.objects.filter(memberships__user=actor)[:2])
    return teams[0] if len(teams) == 1 else None


@dataclass(frozen=True, slots=True)
class TimelineRow:
    """One GPU type's booked windows over the next days, placed on a bar of
    `days`: each window with its left edge and width in percent."""

    gpu_type: str
    windows: list[tuple[BookedWindow, float, float]]


def booked_timeline(*, now: datetime, days: float = 7.0, team: Any = None) -> list[TimelineRow]:
    """The capacity view's booked windows: per GPU type (by slug) the live windows of
    the next `days`, each placed on a bar of that span (percent)."""
    span = timedelta(days=days).total_seconds()
    rows = []
    for slug, ws in sorted(upcoming_windows(now=now, team=team, days=days).items()):
        placed = []
        for w in ws:
            left = max(0.0, (w.start - now).total_seconds()) / span * 100
            right = min(span, (w.end - now).total_seconds()) / span * 100
            placed.append((w, round(left, 2), round(max(0.6, right - left), 2)))
        rows.append(TimelineRow(slug, placed))
    return rows
