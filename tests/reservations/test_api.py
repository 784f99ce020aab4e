"""Booked GPUs through the API (docs/reservations.md): book, refuse, negotiate the
earliest window, cancel; every change audited. PostgreSQL and a real token each time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise
from typing import Any

import pytest
from django.utils import timezone

from accounts.models import AuditEntry
from queueing.models import Reservation
from queueing.policy.states import JobState
from tests.conftest import World
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def _at(hours: float) -> datetime:
    """A whole hour `hours` from now (UTC)."""
    now = timezone.now().replace(minute=0, second=0, microsecond=0)
    return now + timedelta(hours=hours)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat()


def _book(world: World, user: Any = None, **over: Any) -> Any:
    body: dict[str, Any] = {"team": "vision", "gpu_type": "h100", "gpus": 8,
                            "starts_at": _iso(_at(24)), "duration": "2h"}
    body.update(over)
    return world.client(user or world.admin).post("/api/v1/reservations/", body, format="json")


def test_a_team_admin_books_and_it_is_audited(world: World) -> None:
    r = _book(world, recurrence="FREQ=WEEKLY;COUNT=4", timezone="Europe/Paris", name="eval")
    assert r.status_code == 201, r.content
    body = r.json()
    assert body["gpus"] == 8 and body["units"] == 8 and body["team"] == "vision"
    assert body["duration_seconds"] == 7200 and body["active"] is True
    starts = [datetime.fromisoformat(w["start"]) for w in body["next_windows"]]
    assert len(starts) == 4
    # Weekly at the same Paris wall-clock time: a week apart but where DST moves (never
    # less than 167 h, never more than 169 h).
    gaps = {(b - a).total_seconds() / 3600 for a, b in pairwise(starts)}
    assert gaps <= {167.0, 168.0, 169.0}
    entry = AuditEntry.objects.get(object_type="queueing.Reservation", object_id=str(body["id"]))
    assert entry.action == "book" and entry.actor == world.admin
    assert entry.changes["gpus"] == [None, 8]
    assert world.client(world.admin).get(f"/api/v1/reservations/{body['id']}/").json()["id"] \
        == body["id"]


def test_a_member_may_not_book_and_another_team_does_not_see_it(world: World) -> None:
    r = _book(world, user=world.member)
    assert r.status_code == 403
    assert "team admin" in r.json()["error"]["message"]
    made = _book(world).json()
    assert world.client(world.outsider).get(f"/api/v1/reservations/{made['id']}/").status_code \
        == 404
    assert world.client(world.outsider).get("/api/v1/reservations/").json() == []


@pytest.mark.parametrize(("over", "field", "words"), [
    ({"duration": None, "ends_at": _iso(_at(23))}, "ends_at", "end after it starts"),
    ({"duration": "73h"}, "ends_at", "FAIRQ_BOOKING_MAX_HOURS"),
    ({"recurrence": "FREQ=SOMETIMES"}, "recurrence", "RRULE"),
    ({"recurrence": "FREQ=WEEKLY"}, "recurrence", "COUNT or UNTIL"),
    ({"recurrence": "FREQ=DAILY;COUNT=400"}, "recurrence", "a year"),
    ({"recurrence": "FREQ=HOURLY;COUNT=3"}, "recurrence", "overlap"),
    ({"timezone": "Mars/Olympus"}, "timezone", "IANA"),
    ({"gpus": 17}, "gpus", "fleet has 16"),
    ({"starts_at": _iso(_at(-3))}, "starts_at", "now or later"),
    ({"gpu_type": "nope"}, "gpu_type", "No GPU type"),
])
def test_bad_bookings_are_refused_with_field_messages(world: World, over: dict[str, Any],
                                                      field: str, words: str) -> None:
    body = {k: v for k, v in over.items() if v is not None}
    r = _book(world, user=world.staff, **body) if over.get("duration", 1) is not None else \
        world.client(world.staff).post("/api/v1/reservations/", {
            "team": "vision", "gpu_type": "h100", "gpus": 8, "starts_at": _iso(_at(24)),
            **body}, format="json")
    assert r.status_code == 400, r.content
    fields = r.json()["error"]["fields"]
    assert words in " ".join(fields[field]), fields
    assert not Reservation.objects.exists()


def test_a_team_admin_books_at_most_nominal_plus_borrowing(world: World) -> None:
    world.vision.quotas.filter(gpu_type=world.h100).update(nominal=4, borrowing_limit=2)
    r = _book(world, gpus=7)
    assert r.status_code == 400
    assert "at most 6 h100" in r.json()["error"]["fields"]["gpus"][0]
    assert _book(world, gpus=6).status_code == 201
    # Staff are not held to it.
    assert _book(world, user=world.staff, gpus=8, starts_at=_iso(_at(48))).status_code == 201


def test_a_conflict_names_the_window_and_the_earliest_that_fits(world: World) -> None:
    assert _book(world, user=world.staff, team="nlp", gpus=12).status_code == 201
    r = _book(world, gpus=8, starts_at=_iso(_at(25)))
    assert r.status_code == 409, r.content
    err = r.json()["error"]
    assert f"from {_at(25):%Y-%m-%dT%H:%M:%S}Z" in err["message"]
    # nlp's 12 of 16 end at +26 h: that is the earliest 8 fit.
    assert err["fields"]["earliest"] == [f"{_at(26):%Y-%m-%dT%H:%M:%S}Z"]
    assert _book(world, gpus=4, starts_at=_iso(_at(25))).status_code == 201


def test_running_work_no_booking_preempts_is_held(world: World) -> None:
    now = timezone.now()
    JobFactory(team=world.nlp, gpu_type=world.h100, gpus_per_replica=12, tier=world.critical,
               status=JobState.RUNNING, started_at=now, max_runtime_seconds=None)
    r = _book(world, gpus=8, starts_at=_iso(_at(2)))
    assert r.status_code == 409
    assert r.json()["error"]["fields"]["earliest"] == []
    # A preemptible job is no hold: the booking preempts it at its start.
    JobFactory(team=world.nlp, gpu_type=world.a100, gpus_per_replica=16, tier=world.normal,
               status=JobState.RUNNING, started_at=now, max_runtime_seconds=None)
    assert _book(world, gpu_type="a100", gpus=8, starts_at=_iso(_at(2))).status_code == 201


def test_earliest_per_type_and_book_takes_it_once(world: World) -> None:
    assert _book(world, user=world.staff, team="nlp", gpus=16, starts_at=_iso(_at(1)),
                 duration="3h").status_code == 201
    ask = {"team": "vision", "gpu_types": ["h100", "a100"], "gpus": 8, "duration": "2h",
           "not_before": _iso(_at(1))}
    c = world.client(world.admin)
    answer = c.post("/api/v1/reservations/earliest/", ask, format="json")
    assert answer.status_code == 200, answer.content
    got = {w["gpu_type"]: w for w in answer.json()["windows"]}
    assert datetime.fromisoformat(got["h100"]["start"]) == _at(4)
    assert datetime.fromisoformat(got["a100"]["start"]) == _at(1)
    assert answer.json()["booked"] is None and Reservation.objects.count() == 1
    first = c.post("/api/v1/reservations/earliest/", {**ask, "book": True, "gpus": 16},
                   format="json")
    assert first.status_code == 201, first.content
    assert first.json()["booked"]["gpu_type"] == "a100"
    assert datetime.fromisoformat(first.json()["booked"]["starts_at"]) == _at(1)
    # The same ask again: a100 is taken for those 2 h, so the next answer moves on.
    second = c.post("/api/v1/reservations/earliest/", {**ask, "book": True, "gpus": 16},
                    format="json")
    assert second.status_code == 201
    assert datetime.fromisoformat(second.json()["booked"]["starts_at"]) == _at(3)
    assert AuditEntry.objects.filter(action="book").count() == 3


def test_earliest_accepts_seconds_and_refuses_bad_durations(world: World) -> None:
    c = world.client(world.admin)
    ok = c.post("/api/v1/reservations/earliest/",
                {"gpu_types": ["h100"], "gpus": 1, "duration": 3600}, format="json")
    assert ok.status_code == 200 and ok.json()["windows"][0]["start"] is not None
    bad = c.post("/api/v1/reservations/earliest/",
                 {"gpu_types": ["h100"], "gpus": 1, "duration": "soon"}, format="json")
    assert bad.status_code == 400 and "duration" in bad.json()["error"]["fields"]


def test_cancel_is_audited_once(world: World) -> None:
    made = _book(world).json()
    c = world.client(world.member)
    assert c.post(f"/api/v1/reservations/{made['id']}/cancel/").status_code == 403
    done = world.client(world.admin).post(f"/api/v1/reservations/{made['id']}/cancel/")
    assert done.status_code == 200
    assert done.json()["cancelled_at"] is not None and done.json()["next_windows"] == []
    again = world.client(world.admin).post(f"/api/v1/reservations/{made['id']}/cancel/")
    assert again.status_code == 409
    assert AuditEntry.objects.filter(action="cancel", object_id=str(made["id"])).count() == 1
    # Its GPUs are free again.
    assert _book(world, gpus=16).status_code == 201


def test_list_filters(world: World) -> None:
    a = _book(world).json()
    b = _book(world, gpu_type="a100").json()
    world.client(world.admin).post(f"/api/v1/reservations/{b['id']}/cancel/")
    c = world.client(world.member)
    assert [r["id"] for r in c.get("/api/v1/reservations/").json()] == [a["id"], b["id"]]
    assert [r["id"] for r in c.get("/api/v1/reservations/?gpu_type=a100").json()] == [b["id"]]
    assert [r["id"] for r in c.get("/api/v1/reservations/?active=true").json()] == [a["id"]]
    assert [r["id"] for r in c.get("/api/v1/reservations/?active=false").json()] == [b["id"]]
    assert c.get("/api/v1/reservations/?active=maybe").status_code == 400


def test_a_weekly_booking_clashes_with_one_beyond_the_horizon(world: World,
                                                              settings: Any) -> None:
    settings.FAIRQ_BOOKING_HORIZON_HOURS = 48
    # nlp holds 12 h100 in five weeks, far beyond the 48 h horizon.
    week5 = _at(24) + timedelta(weeks=4)
    assert _book(world, user=world.staff, team="nlp", gpus=12,
                 starts_at=_iso(week5)).status_code == 201
    r = _book(world, gpus=8, recurrence="FREQ=WEEKLY;COUNT=6")
    assert r.status_code == 409, r.content
    assert f"from {week5:%Y-%m-%dT%H:%M:%S}Z" in r.json()["error"]["message"]
    assert r.json()["error"]["fields"]["earliest"] == [
        f"{week5 + timedelta(hours=2):%Y-%m-%dT%H:%M:%S}Z"]
    assert _book(world, gpus=8, recurrence="FREQ=WEEKLY;COUNT=4").status_code == 201
