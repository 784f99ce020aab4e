"""Booked GPUs (docs/reservations.md): booking, cancelling, the earliest window that can
be guaranteed, and charging the unused booked time.

A booking is a `Reservation` row: `gpus` whole devices of a GPU type (GPUs; a MIG
type's instances) for a window, once or repeated by an RFC 5545 RRULE at the same
wall-clock time in an IANA zone. The row keeps them in the type's units
(`units_per_device` per device: a time-sliced GPU of 4 slices is 4), as the policy
counts them. Every window within FAIRQ_BOOKING_HORIZON_HOURS must be guaranteed when it
is booked by rule W5 (`policy.bookings.booking_holds` and `earliest_window` on the
snapshot the admission pass sees: the other bookings of the type and the running work
no booking preempts); its windows past the horizon must fit beside the other bookings.
The admission pass does the rest (rules W1-W4 in docs/scheduling.md, "Booked GPUs").

Who may book: staff, or a team admin of the team, who may book at most the team's
nominal + borrowing limit of the type (no quota row: nothing; no borrowing limit: the
fleet). Bookings of one type are made one at a time (the type's row is locked), so two
callers asking the same earliest window cannot both get it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dateutil.rrule import rrulestr
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from accounts.models import Team
from accounts.selectors import is_team_admin
from accounts.services import audit_record
from queueing.errors import Conflict, DomainError, PermissionDenied
from queueing.models import GpuType, Job, Quota, Reservation, UsageRecord
from queueing.policy.bookings import MAX_RECURRENCE, booking_holds, earliest_window
from queueing.policy.snapshot import Snapshot
from queueing.policy.states import HOLDING_STATES
from queueing.selectors.active_jobs import holding_jobs
from queueing.selectors.cluster import cluster_view
from queueing.selectors.reservations import horizon, other_bookings, windows
from queueing.selectors.snapshot import build_snapshot

from .usage import accumulator_add

# A recurring booking without COUNT or UNTIL is refused, and so is one whose windows go
# on past a year after its first (`MAX_RECURRENCE`).
MAX_WINDOWS = 1000
BOOK_REFUSED = "Only a team admin of this team (or staff) may book or cancel its GPUs."
CHARGE_SOURCE = "booking:{id}"


@dataclass(frozen=True, slots=True)
class BookingAsk:
    """What a booking asks, checked by `reservation_book`."""

    team: Team
    gpu_type: GpuType
    gpus: int
    starts_at: datetime
    ends_at: datetime
    recurrence: str = ""
    timezone: str = "UTC"
    lend_unused: bool = True
    name: str = ""

    @property
    def units(self) -> int:
        return self.gpus * self.gpu_type.units_per_device

    @property
    def duration(self) -> timedelta:
        return self.ends_at - self.starts_at


def _fmt(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def check_may_book(*, actor: Any, team: Team) -> None:
    """PermissionDenied unless `actor` is staff or a team admin of `team` (None: fairq)."""
    if actor is None or actor.is_staff:
        return
    if not is_team_admin(user=actor, team=team):
        raise PermissionDenied(BOOK_REFUSED)


def team_booking_cap(team: Team, gpu_type: GpuType, fleet: int) -> int:
    """The most units a team admin may book of the type at once: the team's nominal +
    borrowing limit (no quota row: 0; no borrowing limit: the fleet)."""
    quota = Quota.objects.filter(team=team, gpu_type=gpu_type).first()
    if quota is None:
        return 0
    if quota.borrowing_limit is None:
        return fleet
    return min(fleet, (quota.nominal + quota.borrowing_limit) * gpu_type.units_per_device)


def _check_zone(name: str, errors: dict[str, list[str]]) -> None:
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        errors.setdefault("timezone", []).append(
            f"{name!r} is not an IANA time zone (e.g. Europe/Paris, UTC).")


def _check_rule(ask: BookingAsk, errors: dict[str, list[str]]) -> None:
    """The RRULE parses, is bounded (COUNT or UNTIL, its windows within a year of the
    first) and its windows do not overlap one another."""
    rule = ask.recurrence
    upper = rule.upper()
    if "DTSTART" in upper or "\n" in rule:
        errors["recurrence"] = ["One RRULE without DTSTART (the first window's start is "
                                "starts_at), e.g. FREQ=WEEKLY;COUNT=12."]
        return
    try:
        zone = ZoneInfo(ask.timezone or "UTC")
        local = ask.starts_at.astimezone(zone).replace(tzinfo=None)
        starts = rrulestr(rule, dtstart=local, ignoretz=True)
    except (ValueError, TypeError, ZoneInfoNotFoundError) as exc:
        errors["recurrence"] = [f"Not an RFC 5545 RRULE ({exc}); e.g. FREQ=WEEKLY;COUNT=12."]
        return
    if "COUNT=" not in upper and "UNTIL=" not in upper:
        errors["recurrence"] = ["A recurring booking ends: give COUNT or UNTIL "
                                "(e.g. FREQ=WEEKLY;COUNT=12)."]
        return
    last = local + MAX_RECURRENCE
    previous = None
    for n, start in enumerate(starts):
        if start > last or n >= MAX_WINDOWS:
            errors["recurrence"] = [f"Its windows go on past a year after the first (or "
                                    f"past {MAX_WINDOWS} windows): book at most a year."]
            return
        if previous is not None and start < previous + ask.duration:
            errors["recurrence"] = ["Its windows overlap one another: repeat less often "
                                    "than a window lasts."]
            return
        previous = start


def validate_ask(ask: BookingAsk, *, now: datetime, fleet: int) -> dict[str, list[str]]:
    """The field messages of a booking that cannot be made whatever else is booked."""
    errors: dict[str, list[str]] = {}
    if ask.gpus < 1:
        errors["gpus"] = ["Book at least one GPU."]
    elif ask.units > fleet:
        errors["gpus"] = [f"The {ask.gpu_type.slug} fleet has {fleet // ask.gpu_type.units_per_device}"
                          f" GPUs: {ask.gpus} cannot be booked."]
    if ask.ends_at <= ask.starts_at:
        errors["ends_at"] = ["A window must end after it starts."]
    elif ask.duration > timedelta(hours=float(settings.FAIRQ_BOOKING_MAX_HOURS)):
        errors["ends_at"] = [f"A window lasts at most FAIRQ_BOOKING_MAX_HOURS "
                             f"({settings.FAIRQ_BOOKING_MAX_HOURS:g} h)."]
    if ask.starts_at < now - timedelta(minutes=1):
        errors["starts_at"] = ["A booking starts now or later."]
    _check_zone(ask.timezone, errors)
    if ask.recurrence and "timezone" not in errors and "ends_at" not in errors:
        _check_rule(ask, errors)
    if len(ask.name) > 200:
        errors["name"] = ["At most 200 characters."]
    return errors


@dataclass(frozen=True, slots=True)
class Holds:
    """What a new booking of one type cannot take: rule W5's `capacity` and `near` holds
    (`policy.bookings.booking_holds` on the snapshot the admission pass sees: the other
    bookings within the horizon and the running work no booking preempts), and `far`,
    the other bookings' windows past the horizon (running work is not known there)."""

    capacity: int
    near: list[Span]
    far: list[Span]
    edge: datetime  # now + the horizon

    def at(self, start: datetime) -> list[Span]:
        return self.near if start < self.edge else self.far


Span = tuple[datetime, datetime | None, int]


def _holds_snapshot(now: datetime) -> Snapshot:
    """What rule W5 reads (nodes, bookings, the jobs holding GPUs), without the queue:
    a booking's check does not read a million queued rows."""
    return build_snapshot(backend=cluster_view(), now=now, jobs=holding_jobs())


def holds_of(gpu_type: GpuType, *, now: datetime, until: datetime,
             snapshot: Snapshot | None = None) -> Holds:
    """`Holds` of the type from `now` to `until` (`snapshot`: one built already)."""
    snap = snapshot or _holds_snapshot(now)
    capacity, near = booking_holds(snap, gpu_type.slug)  # rule W5
    edge = now + horizon()
    far: list[Span] = [(b.start, b.end, b.gpus)
                       for b in other_bookings(gpu_type, after=edge, before=until)]
    return Holds(capacity, list(near), far, edge)


def _conflict(ask: BookingAsk, holds: Holds, *, now: datetime,
              ) -> tuple[datetime, datetime] | None:
    """The first window of `ask` that cannot be guaranteed (rule W5's test per window):
    within the horizon beside every hold, beyond it beside the other bookings."""
    for s, e in windows(_unsaved(ask), after=now, before=ask.starts_at + MAX_RECURRENCE,
                        limit=MAX_WINDOWS):
        if earliest_window(holds.capacity, holds.at(s), ask.units, e - s, s, s) is None:
            return s, e
    return None


def _unsaved(ask: BookingAsk) -> Reservation:
    return Reservation(team=ask.team, gpu_type=ask.gpu_type, gpus=ask.units,
                       starts_at=ask.starts_at, ends_at=ask.ends_at,
                       recurrence=ask.recurrence, timezone=ask.timezone or "UTC",
                       lend_unused=ask.lend_unused, name=ask.name)


def reservation_book(*, actor: Any, ask: BookingAsk, now: datetime | None = None,
                     ) -> Reservation:
    """Book `ask` for `actor` (docs/reservations.md): checked, every window within the
    horizon guaranteed, saved and audited, under the lock of its GPU type. Raises
    PermissionDenied (403), DomainError with field messages (400), Conflict (409)
    naming the first window that cannot be guaranteed and the earliest that can."""
    now = now or timezone.now()
    check_may_book(actor=actor, team=ask.team)
    with transaction.atomic():
        GpuType.objects.select_for_update().filter(pk=ask.gpu_type.pk).first()
        return _book_locked(actor=actor, ask=ask, now=now)


def _book_locked(*, actor: Any, ask: BookingAsk, now: datetime,
                 snapshot: Snapshot | None = None) -> Reservation:
    holds = holds_of(ask.gpu_type, now=now, snapshot=snapshot,
                     until=max(now, ask.starts_at) + MAX_RECURRENCE + ask.duration)
    fleet = holds.capacity
    errors = validate_ask(ask, now=now, fleet=fleet)
    if errors:
        raise DomainError("The booking has invalid fields.", fields=errors)
    if actor is not None and not actor.is_staff:
        cap = team_booking_cap(ask.team, ask.gpu_type, fleet)
        if ask.units > cap:
            raise DomainError(
                "A team admin books at most the team's nominal + borrowing limit.",
                fields={"gpus": [f"{ask.team.slug} may book at most "
                                 f"{cap // ask.gpu_type.units_per_device} {ask.gpu_type.slug}"
                                 f" GPUs (its nominal + borrowing limit); ask staff for more."]})
    clash = _conflict(ask, holds, now=now)
    if clash is not None:
        # When that window could begin instead (beyond the horizon: beside bookings).
        fits = earliest_window(fleet, holds.at(clash[0]), ask.units, ask.duration,
                               max(now, clash[0]), clash[0] + horizon())
        raise Conflict(
            f"{ask.gpus} {ask.gpu_type.slug} GPUs cannot be guaranteed from "
            f"{_fmt(clash[0])} to {_fmt(clash[1])}: other bookings or work no booking "
            f"preempts hold them. "
            + (f"The earliest window that fits starts {_fmt(fits)}." if fits else
               "No window of that length fits within the booking horizon."),
            fields={"starts_at": [f"Its window {_fmt(clash[0])} to {_fmt(clash[1])} "
                                  "cannot be guaranteed."],
                    "earliest": [_fmt(fits)] if fits else []})
    row = _unsaved(ask)
    row.created_by = actor if actor is not None and actor.is_authenticated else None
    row.full_clean(exclude=["created_by"])
    row.save()
    audit_record(actor=actor, action="book", instance=row, changes={
        "team": [None, ask.team.slug], "gpu_type": [None, ask.gpu_type.slug],
        "gpus": [None, ask.gpus], "units": [None, row.gpus],
        "starts_at": [None, _fmt(row.starts_at)], "ends_at": [None, _fmt(row.ends_at)],
        "recurrence": [None, row.recurrence], "timezone": [None, row.timezone],
        "lend_unused": [None, row.lend_unused]})
    return row


def reservation_cancel(*, actor: Any, reservation: Reservation,
                       now: datetime | None = None) -> Reservation:
    """Cancel a booking (its windows to come, and one under way, end now): a team admin
    of its team or staff; audited. Conflict when it was cancelled already."""
    now = now or timezone.now()
    check_may_book(actor=actor, team=reservation.team)
    with transaction.atomic():
        row = Reservation.objects.select_for_update().get(pk=reservation.pk)
        if row.cancelled_at is not None:
            raise Conflict(f"reservation {row.pk} was cancelled at {_fmt(row.cancelled_at)}.")
        row.cancelled_at = now
        row.save(update_fields=["cancelled_at"])
        audit_record(actor=actor, action="cancel", instance=row,
                     changes={"cancelled_at": [None, _fmt(now)]})
    reservation.cancelled_at = now
    return reservation


@dataclass(frozen=True, slots=True)
class Earliest:
    """The earliest guaranteed window of one type (`start` None: none within the
    horizon, `why` says so) and, when it was booked, the reservation."""

    gpu_type: GpuType
    start: datetime | None
    end: datetime | None
    why: str = ""
    reservation: Reservation | None = None


def earliest_for(*, gpu_type: GpuType, gpus: int, duration: timedelta,
                 not_before: datetime, now: datetime, snapshot: Snapshot) -> Earliest:
    """Rule W5: the earliest window of `duration` from `not_before` in which `gpus`
    devices of the type can be guaranteed, within the booking horizon."""
    holds = holds_of(gpu_type, now=now, until=now, snapshot=snapshot)
    units = gpus * gpu_type.units_per_device
    if units > holds.capacity:
        return Earliest(gpu_type, None, None,
                        f"the fleet has {holds.capacity // gpu_type.units_per_device} GPUs")
    start = earliest_window(holds.capacity, holds.near, units, duration,
                            max(now, not_before), now + horizon())
    if start is None:
        return Earliest(gpu_type, None, None, "no window fits within the booking horizon "
                        f"(FAIRQ_BOOKING_HORIZON_HOURS={settings.FAIRQ_BOOKING_HORIZON_HOURS:g})")
    return Earliest(gpu_type, start, start + duration)


def reservation_earliest(*, actor: Any, team: Team, gpu_types: Sequence[GpuType], gpus: int,
                         duration: timedelta, not_before: datetime | None = None,
                         book: bool = False, lend_unused: bool = True, name: str = "",
                         now: datetime | None = None) -> list[Earliest]:
    """Per type, the earliest window that can be guaranteed (in the order asked). With
    `book`, the first of them (the earliest; the order asked breaks ties) is booked under
    the lock of every asked type, so two callers cannot both get it."""
    now = now or timezone.now()
    errors: dict[str, list[str]] = {}
    if gpus < 1:
        errors["gpus"] = ["Ask at least one GPU."]
    if duration <= timedelta(0):
        errors["duration"] = ["A window lasts more than 0 s."]
    elif duration > timedelta(hours=float(settings.FAIRQ_BOOKING_MAX_HOURS)):
        errors["duration"] = [f"A window lasts at most FAIRQ_BOOKING_MAX_HOURS "
                              f"({settings.FAIRQ_BOOKING_MAX_HOURS:g} h)."]
    if errors:
        raise DomainError("The request has invalid fields.", fields=errors)
    start = max(now, not_before or now)
    if not book:
        snap = _holds_snapshot(now)
        return [earliest_for(gpu_type=t, gpus=gpus, duration=duration, not_before=start,
                             now=now, snapshot=snap) for t in gpu_types]
    check_may_book(actor=actor, team=team)
    with transaction.atomic():
        list(GpuType.objects.select_for_update().filter(pk__in=[t.pk for t in gpu_types])
             .order_by("pk"))
        snap = _holds_snapshot(now)
        found = [earliest_for(gpu_type=t, gpus=gpus, duration=duration, not_before=start,
                              now=now, snapshot=snap) for t in gpu_types]
        best = min((e for e in found if e.start is not None),
                   key=lambda e: e.start or now, default=None)
        if best is None or best.start is None:
            raise Conflict("No asked GPU type has a window that fits within the booking "
                           "horizon.", fields={"gpu_types": [f"{e.gpu_type.slug}: {e.why}"
                                                             for e in found]})
        row = _book_locked(actor=actor, ask=BookingAsk(
            team=team, gpu_type=best.gpu_type, gpus=gpus, starts_at=best.start,
            ends_at=best.start + duration, lend_unused=lend_unused, name=name), now=now,
            snapshot=snap)
    return [Earliest(e.gpu_type, e.start, e.end, e.why,
                     row if e.gpu_type.pk == best.gpu_type.pk else None) for e in found]


# --- charging the unused booked time (FAIRQ_BOOKING_CHARGE_UNUSED) -------------------------

def used_units(*, team_id: int, gpu_type: GpuType, start: datetime, end: datetime,
               booked: int) -> float:
    """Unit-seconds of [start, end) the team's jobs of the type ran, at most `booked`
    units at any instant (what they ran beyond the booking was not the booking's): its
    usage records and the attempts still running."""
    spans: list[tuple[datetime, datetime, float]] = []
    per = gpu_type.slices_per_gpu
    for rec in UsageRecord.objects.filter(team_id=team_id, gpu_type=gpu_type, job__isnull=False,
                                          start__lt=end, end__gt=start):
        spans.append((max(rec.start, start), min(rec.end, end), rec.gpus * per))
    for job in Job.objects.filter(team_id=team_id, gpu_type=gpu_type, started_at__lt=end,
                                  status__in=HOLDING_STATES).select_related("gpu_type"):
        if job.started_at is not None:
            spans.append((max(job.started_at, start), end, job.gpu_share * per))
    edges = sorted({start, end, *(s for s, _e, _u in spans), *(e for _s, e, _u in spans)})
    used = 0.0
    for lo, hi in pairwise(edges):
        held = sum(u for s, e, u in spans if s <= lo and e >= hi)
        used += min(held, booked) * (hi - lo).total_seconds()
    return used


def reservations_charge_unused(*, now: datetime | None = None) -> int:
    """docs/reservations.md, "Charging": when FAIRQ_BOOKING_CHARGE_UNUSED is on, every
    window that ended (within the booking horizon back) and was not charged yet: its
    unused booked GPU-hours charged to the team once, a usage record (source
    "booking:<id>") and its fair-share accumulator. Off: nothing. Returns the records
    written."""
    if not settings.FAIRQ_BOOKING_CHARGE_UNUSED:
        return 0
    now = now or timezone.now()
    written = 0
    since = now - horizon()
    rows = (Reservation.objects.filter(starts_at__lt=now)
            .filter(Q(recurrence="") & Q(ends_at__gt=since) | ~Q(recurrence=""))
            .select_related("team", "gpu_type"))
    for r in rows:
        stop = min(now, r.cancelled_at) if r.cancelled_at else now
        for s, e in windows(r, after=since, before=stop):
            if e <= stop:
                written += _charge_window(r, s, e)
    return written


@transaction.atomic
def _charge_window(r: Reservation, start: datetime, end: datetime) -> int:
    source = CHARGE_SOURCE.format(id=r.pk)
    Reservation.objects.select_for_update().filter(pk=r.pk).first()
    if UsageRecord.objects.filter(source=source, start=start, end=end).exists():
        return 0
    t = r.gpu_type
    used = used_units(team_id=r.team_id, gpu_type=t, start=start, end=end, booked=r.gpus)
    unused = max(0.0, r.gpus * (end - start).total_seconds() - used)
    if unused <= 0:
        return 0  # fully used: nothing to charge (looked at again while in the horizon)
    gpus = unused / (end - start).total_seconds() / t.slices_per_gpu  # GPU-equivalents
    UsageRecord.objects.create(team_id=r.team_id, gpu_type=t, job=None, attempt=None,
                               gpus=gpus, billing_weight=t.billing_weight, start=start,
                               end=end, gpu_seconds=gpus * (end - start).total_seconds(),
                               source=source)
    accumulator_add(team_id=r.team_id, rate=gpus * t.billing_weight, start=start, end=end)
    audit_record(actor=None, action="charge_unused", instance=r, changes={
        "window": [None, f"{_fmt(start)}/{_fmt(end)}"],
        "unused_gpu_hours": [None, round(gpus * (end - start).total_seconds() / 3600, 4)]})
    return 1
