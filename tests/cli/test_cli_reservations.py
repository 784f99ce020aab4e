"""`fairq reservations [list|book|cancel]` against the real API in-process
(docs/reservations.md, "By CLI"): what a person reads, and refusals on one readable
line."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from accounts.services import token_issue
from queueing.models import Reservation
from tests.conftest import World

from .conftest import Cli

pytestmark = pytest.mark.django_db


def _next_hour(hours: int) -> Any:
    return timezone.now().replace(minute=0, second=0, microsecond=0) + timedelta(hours=hours)


def test_book_weekly_list_and_cancel(world: World, cli: Cli) -> None:
    start = _next_hour(30)
    local = start.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Paris"))
    out = cli("reservations", "book", "-t", "h100", "-g", "8", "--team", "vision",
              "--start", local.strftime("%Y-%m-%dT%H:%M"), "--duration", "2h", "--weekly",
              "--tz", "Europe/Paris", "-J", "eval")
    assert out.code == 0, out.err
    r = Reservation.objects.get()
    assert r.starts_at == start and r.ends_at == start + timedelta(hours=2)
    assert r.recurrence == "FREQ=WEEKLY;COUNT=12" and r.timezone == "Europe/Paris"
    assert out.out == (f"Booked reservation {r.pk} (vision): 8 h100 from "
                       f"{start:%Y-%m-%dT%H:%M:%S}Z to {start + timedelta(hours=2):%Y-%m-%dT%H:%M:%S}Z"
                       ", FREQ=WEEKLY;COUNT=12; unused GPUs lent.\n")
    listed = cli("reservations")
    assert listed.code == 0
    header, row = listed.out.splitlines()
    assert header.split() == ["ID", "TEAM", "TYPE", "GPUS", "NEXT", "WINDOW", "LENGTH",
                              "REPEAT", "LENT", "STATE", "NAME"]
    assert row.split() == [str(r.pk), "vision", "h100", "8", f"{start:%Y-%m-%dT%H:%M:%S}Z",
                           "2h", "FREQ=WEEKLY;COUNT=12", "yes", "active", "eval"]
    done = cli("reservations", "cancel", str(r.pk))
    assert done.code == 0 and done.out == f"Cancelled reservation {r.pk} (vision: 8 h100).\n"
    assert cli("reservations").out.splitlines()[1:] == []
    assert len(cli("reservations", "list", "--all").out.splitlines()) == 2


def test_asap_books_the_earliest_window(world: World, cli: Cli) -> None:
    staff = Cli(token=token_issue(user=world.staff).key, transport=cli.transport, sleeps=[])
    busy = staff("reservations", "book", "-t", "h100", "-g", "16", "--team", "nlp",
                 "--start", timezone.now().isoformat(), "--duration", "3h", "--no-lend")
    assert busy.code == 0, busy.err
    assert Reservation.objects.get().lend_unused is False
    out = cli("--json", "reservations", "book", "-t", "h100", "-g", "4", "--asap", "1h")
    assert out.code == 0, out.err
    booked = out.json["booked"]
    assert booked["gpu_type"] == "h100" and booked["duration_seconds"] == 3600
    nlp = Reservation.objects.get(team=world.nlp)
    assert Reservation.objects.get(pk=booked["id"]).starts_at == nlp.ends_at


def test_refusals_are_one_readable_line(world: World, cli: Cli) -> None:
    out = cli("reservations", "book", "-t", "h100", "-g", "8")
    assert (out.code, out.err) == (2, "fairq: book needs --start and --duration (or --asap "
                                      "DURATION)\n")
    out = cli("reservations", "book", "-t", "h100", "-g", "8", "--start", "tomorrow",
              "--duration", "2h")
    assert out.code == 2 and "bad --start 'tomorrow'" in out.err
    start = _next_hour(5).isoformat()
    assert cli("reservations", "book", "-t", "h100", "-g", "16", "--start", start,
               "--duration", "2h").code == 0
    clash = cli("reservations", "book", "-t", "h100", "-g", "1", "--start", start,
                "--duration", "1h")
    assert clash.code == 1
    assert clash.err.startswith("fairq: 1 h100 GPUs cannot be guaranteed from ")
    assert "The earliest window that fits starts" in clash.err
    member = Cli(token=token_issue(user=world.member).key, transport=cli.transport, sleeps=[])
    assert member("reservations", "cancel", str(Reservation.objects.get().pk)).err == (
        "fairq: Only a team admin of this team (or staff) may book or cancel its GPUs\n")
