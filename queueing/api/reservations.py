"""Booked GPUs (docs/reservations.md, "By API"; docs/api.md, "Endpoints"):

- `GET /api/v1/reservations/` your teams' bookings (`?team=`, `?gpu_type=`, `?active=`),
- `POST /api/v1/reservations/` books GPUs for a window, once or recurring (201; 400
  naming the fields; 409 naming the first window that cannot be guaranteed and the
  earliest that can),
- `GET /api/v1/reservations/{id}/` one, with its next windows,
- `POST /api/v1/reservations/{id}/cancel/` cancels it (a team admin, staff),
- `POST /api/v1/reservations/earliest/` the earliest guaranteed window per GPU type
  asked, and with `book: true` books the earliest of them at once (no other caller can
  take it in between).

`gpus` are whole devices: GPUs (a MIG type's instances); `units` says what the policy
counts (a time-sliced GPU of 4 slices is 4).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from accounts.models import Team
from fairq_cli.durations import DURATION_HELP, parse_duration
from queueing.errors import DomainError
from queueing.models import GpuType, Reservation
from queueing.selectors.reference import gpu_type_by_slug
from queueing.selectors.reservations import (
    next_windows,
    only_team_of,
    reservation_get_for_actor,
    reservations_visible_to,
)
from queueing.services.access import check_team_member
from queueing.services.reservations import (
    BookingAsk,
    reservation_book,
    reservation_cancel,
    reservation_earliest,
)

from .fields import InstantField
from .strict import StrictFieldsMixin

NEXT_WINDOWS = 10
# A duration past a year is no window (FAIRQ_BOOKING_MAX_HOURS bounds it further).
MAX_DURATION_SECONDS = 366 * 86400
DURATION_RANGE = "A duration is more than 0 s and at most a year."


class WindowSerializer(serializers.Serializer[Any]):
    start = serializers.DateTimeField()
    end = serializers.DateTimeField()


class ReservationSerializer(serializers.Serializer[Any]):
    """A booking as listed and shown."""

    id = serializers.IntegerField()
    team = serializers.CharField()
    gpu_type = serializers.CharField()
    gpus = serializers.IntegerField(help_text="Whole GPUs (a MIG type's instances) booked.")
    units = serializers.IntegerField(help_text="The same in the policy's units of the type "
                                               "(a time-sliced GPU of 4 slices is 4).")
    name = serializers.CharField()
    starts_at = serializers.DateTimeField(help_text="The first window's start.")
    ends_at = serializers.DateTimeField(help_text="The first window's end.")
    duration_seconds = serializers.IntegerField()
    recurrence = serializers.CharField(help_text='An RFC 5545 RRULE; "" = once.')
    timezone = serializers.CharField()
    lend_unused = serializers.BooleanField(
        help_text="Unused booked GPUs may run other teams' preemptible jobs, taken back "
                  "when the team needs them.")
    created_by = serializers.CharField(allow_null=True)
    created_at = serializers.DateTimeField()
    cancelled_at = serializers.DateTimeField(allow_null=True)
    active = serializers.BooleanField(help_text="Not cancelled, a window still to end.")
    next_windows = WindowSerializer(many=True, help_text="Its next windows (one under way "
                                                         "first), at most 10.")


def reservation_data(r: Reservation, *, now: datetime) -> dict[str, Any]:
    nxt = next_windows(r, now=now, count=NEXT_WINDOWS)
    return {
        "id": r.pk, "team": r.team.slug, "gpu_type": r.gpu_type.slug,
        "gpus": r.gpus // r.gpu_type.units_per_device, "units": r.gpus, "name": r.name,
        "starts_at": r.starts_at, "ends_at": r.ends_at,
        "duration_seconds": int((r.ends_at - r.starts_at).total_seconds()),
        "recurrence": r.recurrence, "timezone": r.timezone, "lend_unused": r.lend_unused,
        "created_by": r.created_by.get_username() if r.created_by else None,
        "created_at": r.created_at, "cancelled_at": r.cancelled_at, "active": bool(nxt),
        "next_windows": [{"start": s, "end": e} for s, e in nxt],
    }


@extend_schema_field({"oneOf": [{"type": "integer", "minimum": 1},
                               {"type": "string", "example": "2h"}]})
class DurationField(serializers.Field[timedelta, Any, Any, Any]):
    """A duration: seconds (7200) or text (2h, 90m, 1h30m)."""

    def to_internal_value(self, data: Any) -> timedelta:
        if isinstance(data, bool):
            raise serializers.ValidationError(f"Use {DURATION_HELP}.")
        if isinstance(data, int | float):
            if not 0 < data <= MAX_DURATION_SECONDS:
                raise serializers.ValidationError(DURATION_RANGE)
            return timedelta(seconds=float(data))
        if not isinstance(data, str):
            raise serializers.ValidationError(f"Use {DURATION_HELP}.")
        try:
            seconds = parse_duration(data)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None
        if not 0 < seconds <= MAX_DURATION_SECONDS:
            raise serializers.ValidationError(DURATION_RANGE)
        return timedelta(seconds=seconds)

    def to_representation(self, value: timedelta) -> Any:
        return int(value.total_seconds())


def _team(actor: Any, slug: str | None) -> Team:
    """The named team of `actor` (404 when not theirs), or their only team."""
    if slug:
        return check_team_member(actor=actor, slug=slug)
    team = only_team_of(actor)
    if team is None:
        raise DomainError("Name the team: you are in several (or none).",
                          fields={"team": ["This field is required."]})
    return team


def _gpu_type(slug: str, field: str = "gpu_type") -> GpuType:
    t = gpu_type_by_slug(slug=slug)
    if t is None:
        raise DomainError(f"No GPU type {slug!r}.", fields={field: [f"No GPU type {slug!r}."]})
    return t


class ReservationCreateSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """A booking: give `ends_at` or `duration`."""

    team = serializers.CharField(required=False, max_length=63,
                                 help_text="Your team; may be left out when you are in one.")
    gpu_type = serializers.CharField(max_length=40)
    gpus = serializers.IntegerField(min_value=1, max_value=100000,
                                    help_text="Whole GPUs (a MIG type's instances).")
    starts_at = InstantField(help_text="The first window's start (ISO 8601 with an offset).")
    ends_at = InstantField(required=False, help_text="The first window's end.")
    duration = DurationField(required=False, help_text=f"Instead of ends_at: {DURATION_HELP}.")
    recurrence = serializers.CharField(
        required=False, allow_blank=True, max_length=300, default="",
        help_text='An RFC 5545 RRULE with COUNT or UNTIL, within a year, e.g. '
                  '"FREQ=WEEKLY;COUNT=12"; "" = once.')
    timezone = serializers.CharField(
        required=False, max_length=64, default="UTC",
        help_text="The IANA zone a recurring window keeps its wall-clock time in.")
    lend_unused = serializers.BooleanField(required=False, default=True)
    name = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if ("ends_at" in attrs) == ("duration" in attrs):
            raise serializers.ValidationError(
                {"ends_at": ["Give ends_at or duration (one of them)."]})
        if "duration" in attrs:
            attrs["ends_at"] = attrs["starts_at"] + attrs.pop("duration")
        return attrs


class ReservationListView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("team", str, description="One of your teams, by slug."),
            OpenApiParameter("gpu_type", str, description="A GPU type, by slug."),
            OpenApiParameter("active", bool, description="true: not cancelled, a window "
                                                         "still to end; false: the others."),
        ],
        responses=ReservationSerializer(many=True))
    def get(self, request: Request) -> Response:
        """Your teams' bookings (staff: every team's), by first start (at most 500)."""
        q = request.query_params
        active = q.get("active")
        if active not in (None, "true", "false"):
            raise DomainError("active is true or false.", fields={"active": ["true or false."]})
        now = timezone.now()
        rows = reservations_visible_to(
            actor=request.user, team=q.get("team") or None, gpu_type=q.get("gpu_type") or None,
            active=None if active is None else active == "true", now=now)
        return Response(ReservationSerializer([reservation_data(r, now=now) for r in rows],
                                              many=True).data)

    @extend_schema(request=ReservationCreateSerializer,
                   responses={201: ReservationSerializer})
    def post(self, request: Request) -> Response:
        """Book GPUs (a team admin of the team, or staff): every window within
        FAIRQ_BOOKING_HORIZON_HOURS must be guaranteed (409 names the first that cannot
        be and the earliest start that can)."""
        s = ReservationCreateSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        d = s.validated_data
        row = reservation_book(actor=request.user, ask=BookingAsk(
            team=_team(request.user, d.get("team")), gpu_type=_gpu_type(d["gpu_type"]),
            gpus=d["gpus"], starts_at=d["starts_at"], ends_at=d["ends_at"],
            recurrence=d["recurrence"], timezone=d["timezone"],
            lend_unused=d["lend_unused"], name=d["name"]))
        row = reservation_get_for_actor(actor=request.user, reservation_id=row.pk)
        return Response(ReservationSerializer(reservation_data(row, now=timezone.now())).data,
                        status=status.HTTP_201_CREATED)


class ReservationDetailView(APIView):
    @extend_schema(responses=ReservationSerializer)
    def get(self, request: Request, reservation_id: int) -> Response:
        """One booking of your teams, with its next windows."""
        row = reservation_get_for_actor(actor=request.user, reservation_id=reservation_id)
        return Response(ReservationSerializer(reservation_data(row, now=timezone.now())).data)


class ReservationCancelView(APIView):
    @extend_schema(request=None, responses=ReservationSerializer)
    def post(self, request: Request, reservation_id: int) -> Response:
        """Cancel a booking (a team admin of its team, or staff); 409 when it was
        cancelled already."""
        row = reservation_get_for_actor(actor=request.user, reservation_id=reservation_id)
        reservation_cancel(actor=request.user, reservation=row)
        row = reservation_get_for_actor(actor=request.user, reservation_id=reservation_id)
        return Response(ReservationSerializer(reservation_data(row, now=timezone.now())).data)


class EarliestAskSerializer(StrictFieldsMixin, serializers.Serializer[Any]):
    """What an ML pipeline or an agent asks: N GPUs of one of these types for this long,
    as soon as possible."""

    gpu_types = serializers.ListField(child=serializers.CharField(max_length=40),
                                      min_length=1, max_length=20,
                                      help_text="The types that would do, preferred first.")
    gpus = serializers.IntegerField(min_value=1, max_value=100000,
                                    help_text="Whole GPUs (a MIG type's instances).")
    duration = DurationField(help_text=DURATION_HELP)
    not_before = InstantField(required=False, help_text="Default: now.")
    team = serializers.CharField(required=False, max_length=63,
                                 help_text="Your team; may be left out when you are in one.")
    book = serializers.BooleanField(required=False, default=False,
                                    help_text="Book the earliest window found (a team admin "
                                              "of the team, or staff).")
    lend_unused = serializers.BooleanField(required=False, default=True)
    name = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")


class EarliestWindowSerializer(serializers.Serializer[Any]):
    gpu_type = serializers.CharField()
    start = serializers.DateTimeField(allow_null=True)
    end = serializers.DateTimeField(allow_null=True)
    reason = serializers.CharField(help_text="Why there is none, when start is null.")


class EarliestAnswerSerializer(serializers.Serializer[Any]):
    windows = EarliestWindowSerializer(many=True, help_text="Per type asked, in its order.")
    booked = ReservationSerializer(allow_null=True,
                                   help_text="The booking made (book: true), else null.")


class ReservationEarliestView(APIView):
    @extend_schema(request=EarliestAskSerializer,
                   responses={200: EarliestAnswerSerializer, 201: EarliestAnswerSerializer})
    def post(self, request: Request) -> Response:
        """The earliest window, per GPU type asked, in which the GPUs can be guaranteed
        (other bookings and work no booking preempts leave them free). With `book: true`
        the earliest of them is booked at once (201), under a lock: two callers cannot
        both get it; 409 when no type has one within the booking horizon."""
        s = EarliestAskSerializer(data=request.data)
        s.is_valid(raise_exception=True)
        d = s.validated_data
        types = [_gpu_type(slug, "gpu_types") for slug in dict.fromkeys(d["gpu_types"])]
        found = reservation_earliest(
            actor=request.user, team=_team(request.user, d.get("team")), gpu_types=types,
            gpus=d["gpus"], duration=d["duration"], not_before=d.get("not_before"),
            book=d["book"], lend_unused=d["lend_unused"], name=d["name"])
        now = timezone.now()
        booked = next((e.reservation for e in found if e.reservation is not None), None)
        body = {"windows": [{"gpu_type": e.gpu_type.slug, "start": e.start, "end": e.end,
                             "reason": e.why} for e in found],
                "booked": reservation_data(booked, now=now) if booked else None}
        return Response(EarliestAnswerSerializer(body).data,
                        status=status.HTTP_201_CREATED if booked else status.HTTP_200_OK)
