"""`fairq reservations [book|cancel]`: booked GPUs through `/api/v1/reservations/`
(docs/cli.md, "Commands"; docs/reservations.md, "By CLI").

    fairq reservations                                  # your teams' bookings
    fairq reservations book -t h100 -g 8 --start 2026-12-10T14:00 --duration 2h --weekly
    fairq reservations book -t h100 -g 8 --asap 2h      # the earliest window, booked
    fairq reservations cancel 12
"""

from __future__ import annotations

import argparse
from typing import Any

from .durations import DURATION_HELP, format_duration, parse_duration


class ReservationUsage(ValueError):
    """A bad flag, said the way `fairq` says usage errors."""


WEEKLY_COUNT = 12  # --weekly alone: twelve weeks


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    re_ = sub.add_parser("reservations", parents=[common], aliases=["reservation"],
                         help="booked GPUs: list (default), book, cancel")
    rs = re_.add_subparsers(dest="reservation_cmd", required=False, metavar="ACTION")
    ls = rs.add_parser("list", parents=[common], help="your teams' bookings (the default)")
    ls.add_argument("--team")
    ls.add_argument("-t", "--gpu-type", dest="gpu_type")
    ls.add_argument("--all", action="store_true",
                    help="cancelled and past bookings too (default: the active ones)")
    bk = rs.add_parser("book", parents=[common],
                       help="book GPUs for a window (a team admin, or staff)")
    bk.add_argument("-t", "--gpu-type", dest="gpu_type", action="append", required=True,
                    help="the GPU type (with --asap: repeat it for types that would do)")
    bk.add_argument("-g", "--gpus", type=int, required=True,
                    help="whole GPUs (a MIG type's instances)")
    bk.add_argument("--team", help="default: your team when you are in one")
    bk.add_argument("--start", help="the (first) window's start: 2026-12-10T14:00 (in --tz) "
                                    "or an ISO 8601 instant with an offset")
    bk.add_argument("--duration", help=f"how long a window lasts ({DURATION_HELP})")
    bk.add_argument("--asap", metavar="DURATION",
                    help="book the earliest window of this length that can be guaranteed")
    rep = bk.add_mutually_exclusive_group()
    rep.add_argument("--weekly", action="store_true",
                     help=f"repeat every week ({WEEKLY_COUNT} weeks)")
    rep.add_argument("--rrule", help="an RFC 5545 RRULE with COUNT or UNTIL, e.g. "
                                     "FREQ=WEEKLY;BYDAY=MO,TH;COUNT=10")
    bk.add_argument("--tz", default="UTC",
                    help="the IANA zone of --start and of a recurring window's wall-clock "
                         "time (default UTC)")
    bk.add_argument("--no-lend", dest="lend", action="store_false",
                    help="do not lend unused booked GPUs to other teams' preemptible jobs")
    bk.add_argument("-J", "--name", default="")
    cn = rs.add_parser("cancel", parents=[common], help="cancel bookings")
    cn.add_argument("ids", type=int, nargs="+", metavar="ID")


def _start_instant(text: str, tz: str) -> str:
    """`--start` as the API takes it: an instant with an offset; without one, in `tz`."""
    from datetime import datetime
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ReservationUsage(f"bad --start {text!r}: use 2026-12-10T14:00 or an ISO 8601 "
                               "instant with an offset") from None
    if when.tzinfo is None:
        try:
            when = when.replace(tzinfo=ZoneInfo(tz))
        except (ZoneInfoNotFoundError, ValueError):
            raise ReservationUsage(f"bad --tz {tz!r}: an IANA zone, e.g. Europe/Paris") from None
    return when.isoformat()


def _duration(text: str, flag: str) -> int:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise ReservationUsage(f"{flag}: {exc}") from None


def book_body(a: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """(path, body) of `fairq reservations book`."""
    body: dict[str, Any] = {"gpus": a.gpus, "lend_unused": a.lend, "name": a.name}
    if a.team:
        body["team"] = a.team
    if a.asap:
        if a.start or a.duration or a.weekly or a.rrule:
            raise ReservationUsage("--asap books one window: no --start, --duration, "
                                   "--weekly or --rrule with it")
        body.update(gpu_types=a.gpu_type, duration=_duration(a.asap, "--asap"), book=True)
        return "/reservations/earliest/", body
    if len(a.gpu_type) > 1:
        raise ReservationUsage("several -t: only with --asap")
    if not a.start or not a.duration:
        raise ReservationUsage("book needs --start and --duration (or --asap DURATION)")
    body.update(gpu_type=a.gpu_type[0], starts_at=_start_instant(a.start, a.tz),
                duration=_duration(a.duration, "--duration"), timezone=a.tz,
                recurrence=f"FREQ=WEEKLY;COUNT={WEEKLY_COUNT}" if a.weekly else (a.rrule or ""))
    return "/reservations/", body


def _repeat(r: dict[str, Any]) -> str:
    return r["recurrence"] or "once"


def run(app: Any, a: argparse.Namespace) -> int:
    """One `fairq reservations` action; 0, or the CLI's exit codes (1: the server said
    no)."""
    from .client import ApiError
    from .main import EXIT_SERVER_SAID_NO, table

    cmd = a.reservation_cmd or "list"
    if cmd == "list":
        rows = app.client.get("/reservations/", team=getattr(a, "team", None),
                              gpu_type=getattr(a, "gpu_type", None),
                              active=None if getattr(a, "all", False) else "true")
        if app.as_json:
            app.emit_json(rows)
            return 0
        lines = []
        for r in rows:
            nxt = r["next_windows"][0] if r["next_windows"] else None
            lines.append([r["id"], r["team"], r["gpu_type"], r["gpus"],
                          app.stamp(nxt["start"]) if nxt else "-",
                          format_duration(int(r["duration_seconds"])), _repeat(r),
                          "yes" if r["lend_unused"] else "no",
                          "cancelled" if r["cancelled_at"] else
                          ("active" if r["active"] else "past"), r["name"] or "-"])
        app.say(table(lines, ["ID", "TEAM", "TYPE", "GPUS", "NEXT WINDOW", "LENGTH", "REPEAT",
                              "LENT", "STATE", "NAME"]))
        return 0
    if cmd == "book":
        path, body = book_body(a)
        answer = app.client.post(path, body)
        r = answer["booked"] if path.endswith("earliest/") else answer
        if app.as_json:
            app.emit_json(answer)
            return 0
        first = r["next_windows"][0] if r["next_windows"] else {"start": r["starts_at"],
                                                                 "end": r["ends_at"]}
        app.say(f"Booked reservation {r['id']} ({r['team']}): {r['gpus']} {r['gpu_type']} "
                f"from {app.stamp(first['start'])} to {app.stamp(first['end'])}, "
                f"{_repeat(r)}; unused GPUs {'lent' if r['lend_unused'] else 'not lent'}.")
        return 0
    refused = 0
    for rid in a.ids:
        try:
            r = app.client.post(f"/reservations/{rid}/cancel/")
        except ApiError as exc:
            if exc.code == "unreachable" or len(a.ids) == 1:
                raise
            app.err.write(f"fairq: reservation {rid}: {exc.message}\n")
            refused += 1
            continue
        if app.as_json:
            app.emit_json(r)
        else:
            app.say(f"Cancelled reservation {r['id']} ({r['team']}: {r['gpus']} "
                    f"{r['gpu_type']}).")
    return EXIT_SERVER_SAID_NO if refused else 0
