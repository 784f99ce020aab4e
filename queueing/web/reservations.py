"""The booked GPUs page (docs/reservations.md, "On the web"): your teams' bookings, the
booked windows of the next week per GPU type, a form to book (a team admin of the team,
or staff) and a Cancel button. Thin: the form checks shapes, the service decides."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from accounts.selectors import is_team_admin, teams_for_user
from fairq_cli.durations import DURATION_HELP, parse_duration
from queueing.errors import DomainError, NotFound
from queueing.selectors.lookups import gpu_types_by_slug
from queueing.selectors.reservations import (
    booked_timeline,
    next_windows,
    reservation_get_for_actor,
    reservations_visible_to,
)
from queueing.services.reservations import BookingAsk, reservation_book, reservation_cancel

REPEATS = [("", "once"), ("FREQ=DAILY;COUNT=5", "every day, 5 times"),
           ("FREQ=WEEKLY;COUNT=4", "every week, 4 times"),
           ("FREQ=WEEKLY;COUNT=12", "every week, 12 times")]


class BookForm(forms.Form):
    team = forms.ChoiceField()
    gpu_type = forms.ChoiceField(label="GPU type")
    gpus = forms.IntegerField(label="GPUs", min_value=1, initial=1,
                              help_text="Whole GPUs (a MIG type's instances).")
    start = forms.DateTimeField(label="Start", widget=forms.DateTimeInput(
        attrs={"type": "datetime-local"}), help_text="In the time zone below.")
    duration = forms.CharField(max_length=20, initial="2h", help_text=DURATION_HELP)
    repeat = forms.ChoiceField(choices=REPEATS, required=False)
    timezone = forms.CharField(max_length=64, initial="UTC", label="Time zone",
                               help_text="IANA, e.g. Europe/Paris: a repeated window keeps "
                                         "its wall-clock time.")
    lend_unused = forms.BooleanField(required=False, initial=True, label="Lend unused GPUs",
                                     help_text="Other teams' preemptible jobs may use them, "
                                               "taken back when yours need them.")
    name = forms.CharField(max_length=200, required=False)

    def __init__(self, *args: Any, teams: list[Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, choices in (("team", [(t.slug, t.slug) for t in teams]),
                              ("gpu_type", [(s, s) for s in sorted(gpu_types_by_slug())])):
            field = self.fields[name]
            assert isinstance(field, forms.ChoiceField)
            field.choices = choices

    def clean_duration(self) -> timedelta:
        try:
            return timedelta(seconds=parse_duration(self.cleaned_data["duration"]))
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        start, zone = data.get("start"), data.get("timezone")
        if isinstance(start, datetime) and zone:
            try:
                data["start"] = timezone.make_naive(start).replace(tzinfo=ZoneInfo(zone))
            except (ZoneInfoNotFoundError, ValueError):
                self.add_error("timezone", f"{zone!r} is not an IANA time zone.")
        return data


def _bookable_teams(request: HttpRequest) -> list[Any]:
    """The teams the user may book for: those they are a team admin of (staff: all)."""
    return [t for t in teams_for_user(user=request.user) if is_team_admin(user=request.user,
                                                                         team=t)]


def _page(request: HttpRequest, form: BookForm | None = None, status: int = 200) -> HttpResponse:
    now = timezone.now()
    teams = _bookable_teams(request)
    rows = reservations_visible_to(actor=request.user, active=True, now=now)
    for r in rows:
        r.next = next_windows(r, now=now, count=3)  # type: ignore[attr-defined]
        r.devices = r.gpus // r.gpu_type.units_per_device  # type: ignore[attr-defined]
        r.may_cancel = any(t.pk == r.team_id for t in teams)  # type: ignore[attr-defined]
    if form is None and teams:
        form = BookForm(teams=teams, initial={
            "start": (now + timedelta(hours=1)).replace(minute=0, second=0, microsecond=0
                                                        ).strftime("%Y-%m-%dT%H:%M")})
    return render(request, "web/reservations.html", {
        "now": now, "rows": rows, "form": form, "timeline": booked_timeline(now=now),
        "days": 7}, status=status)


@login_required
def reservations_page(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _page(request)
    teams = _bookable_teams(request)
    form = BookForm(request.POST, teams=teams)
    if not form.is_valid():
        return _page(request, form, status=400)
    d = form.cleaned_data
    team = next(t for t in teams if t.slug == d["team"])
    try:
        row = reservation_book(actor=request.user, ask=BookingAsk(
            team=team, gpu_type=gpu_types_by_slug()[d["gpu_type"]], gpus=d["gpus"],
            starts_at=d["start"], ends_at=d["start"] + d["duration"],
            recurrence=d["repeat"] or "", timezone=d["timezone"],
            lend_unused=d["lend_unused"], name=d["name"]))
    except DomainError as exc:
        names = {"starts_at": "start", "ends_at": "duration", "recurrence": "repeat"}
        for field, errors in exc.fields.items():
            if field == "earliest":  # the message says it
                continue
            target = names.get(field, field)
            for e in errors:
                form.add_error(target if target in form.fields else None, e)
        if not exc.fields or exc.status_code in (403, 409):
            form.add_error(None, exc.message)
        return _page(request, form, status=exc.status_code)
    messages.success(request, f"Booked reservation {row.pk}: {d['gpus']} {d['gpu_type']}.")
    return redirect("web:reservations")


@require_POST
@login_required
def reservation_cancel_view(request: HttpRequest, reservation_id: int) -> HttpResponse:
    try:
        row = reservation_get_for_actor(actor=request.user, reservation_id=reservation_id)
    except NotFound as exc:
        raise Http404("no such reservation") from exc
    try:
        reservation_cancel(actor=request.user, reservation=row)
    except DomainError as exc:
        messages.error(request, exc.message)
        return redirect("web:reservations")
    messages.success(request, f"Cancelled reservation {row.pk}.")
    return redirect("web:reservations")
