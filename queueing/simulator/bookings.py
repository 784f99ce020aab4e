"""Booked GPUs in the replay (docs/simulator.md, "Quotas in a tree and bookings";
docs/scheduling.md, "Booked GPUs").

- `booking_spec` checks one booking (its recurrence and time zone), `parse_booking` reads
  the command line's `--booking TEAM:TYPE:GPUS@START/DURATION[/RULE][/nolend]`.
- `expand` turns the scenario's bookings into the occurrences the snapshots carry
  (`policy.bookings.Booking`, through `policy.bookings.occurrences`): those that start
  inside the measuring window [0, horizon].
- `occurrence_report` measures each occurrence from the run's attempts: the delay from
  its start until its GPUs held only the team's jobs or were free, the other teams' jobs
  that crossed into it, and its booked GPU-hours used by the team, lent to others and
  left empty.

The measures count GPUs of the booking's type, not which GPUs: at an instant, the
other teams' jobs that may not be there (those that started before the window, and,
unless the booking lends, every other job; a lent job is a preemptible tier's that
started in the window) are on booked GPUs when they hold more than the type's capacity
less the booked GPUs (and the team's jobs beyond its booking). The team's own use
counts up to the booked GPUs; what is free counts as booked-and-empty first. Each
occurrence is measured as if it were the only booking of its type at the time.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from dateutil.rrule import rrulestr

from queueing.policy.bookings import Booking, occurrences

from .estimates import EstimateError, parse_duration
from .metrics import HOUR, queued_intervals
from .model import BookingSpec, RunResult, Workload

# How far ahead of `now` a snapshot carries bookings (the simulator's booking horizon):
# longer than any estimate of the replayed jobs (the trace caps them at 24 h), so rule
# W1 sees every booking a job admitted now could run into.
LOOKAHEAD_SECONDS = 7 * 86400.0

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_SHORT = {"once": "", "daily": "FREQ=DAILY", "weekly": "FREQ=WEEKLY"}


class BookingError(ValueError):
    """A booking that cannot be used; the message starts with the field's name."""


def booking_spec(team: str, gpu_type: str, gpus: int, start: float, duration: float,
                 recurrence: str = "", timezone: str = "UTC", lend: bool = True) -> BookingSpec:
    """One booking, its recurrence (an RFC 5545 RRULE) and time zone checked."""
    rule = _SHORT.get(recurrence.strip().lower(), recurrence.strip())
    try:
        ZoneInfo(timezone)
    except (ZoneInfoNotFoundError, ValueError):
        raise BookingError(f"timezone: no time zone {timezone!r}") from None
    if rule:
        try:
            rrulestr(rule)
        except (ValueError, TypeError) as exc:
            raise BookingError(f"recurrence: not an RRULE ({exc})") from None
    if gpus <= 0:
        raise BookingError("gpus: must be > 0")
    if duration <= 0:
        raise BookingError("duration_seconds: must be > 0")
    return BookingSpec(team, gpu_type, gpus, start, duration, rule, timezone, lend)


def parse_start(text: str) -> float:
    """`+110h` (an offset from the run's instant 0), `14:00` (on day 0) or `Thu14:00`
    (the first Thursday 14:00 from the run's instant 0, UTC: the simulation's
    2023-01-01 is a Sunday) as seconds from instant 0."""
    t = text.strip().lower()
    if t.startswith("+"):
        return 0.0 if t[1:] in ("0", "0s", "0h") else parse_duration(t[1:])
    m = re.fullmatch(r"(mon|tue|wed|thu|fri|sat|sun)?\s*(\d{1,2}):(\d{2})", t)
    if not m or int(m.group(2)) > 23 or int(m.group(3)) > 59:
        raise BookingError(f"start: {text!r} is not +DURATION, HH:MM or DayHH:MM")
    from .engine import EPOCH

    clock = int(m.group(2)) * 3600.0 + int(m.group(3)) * 60.0
    if m.group(1) is None:
        return clock
    days = (_DAYS.index(m.group(1)) - EPOCH.weekday()) % 7
    return days * 86400.0 + clock


def parse_booking(text: str, teams: Iterable[str], capacity: Mapping[str, int]) -> BookingSpec:
    """`--booking TEAM:TYPE:GPUS@START/DURATION[/RULE][/nolend]`: RULE an RRULE
    (`FREQ=WEEKLY;BYDAY=TU,TH`), `daily`, `weekly` or `once` (the default); `nolend`:
    its unused GPUs stay empty (rule W4). E.g. `team-3:openb:8@Tue14:00/2h/weekly`."""
    head, sep, tail = text.partition("@")
    who = head.split(":")
    if not sep or len(who) != 3:
        raise BookingError(f"--booking: {text!r} is not TEAM:TYPE:GPUS@START/DURATION[/RULE]"
                           "[/nolend]")
    team, gpu_type, gpus_text = (x.strip() for x in who)
    if team not in set(teams):
        raise BookingError(f"--booking: no team {team!r}")
    if gpu_type not in capacity:
        raise BookingError(f"--booking: no GPU type {gpu_type!r} (the cluster has "
                           f"{', '.join(sorted(capacity))})")
    if not gpus_text.isdigit() or not 0 < int(gpus_text) <= capacity[gpu_type]:
        raise BookingError(f"--booking: GPUs must be 1-{capacity[gpu_type]}, not {gpus_text!r}")
    parts = [p.strip() for p in tail.split("/")]
    lend = True
    if parts and parts[-1].lower() == "nolend":
        lend = False
        parts.pop()
    if len(parts) not in (2, 3):
        raise BookingError("--booking: START/DURATION[/RULE][/nolend] after '@'")
    try:
        start, duration = parse_start(parts[0]), parse_duration(parts[1])
    except EstimateError as exc:
        raise BookingError(f"--booking: {exc}") from None
    try:
        return booking_spec(team, gpu_type, int(gpus_text), start, duration,
                            parts[2] if len(parts) == 3 else "", "UTC", lend)
    except BookingError as exc:
        raise BookingError(f"--booking: {exc}") from None


def expand(specs: Sequence[BookingSpec], horizon: float) -> tuple[Booking, ...]:
    """Every occurrence of `specs` that starts in [0, horizon], by start (ids from 1, in
    that order)."""
    from .engine import EPOCH, at

    found = []
    for k, b in enumerate(specs):
        for s, e in occurrences(at(b.start), timedelta(seconds=b.duration), b.recurrence,
                                b.timezone, after=EPOCH, before=at(horizon) + timedelta(
                                    microseconds=1)):
            found.append((s, k, e, b))
    found.sort(key=lambda x: (x[0], x[1]))
    return tuple(Booking(i + 1, b.team, b.gpu_type, b.gpus, s, e, b.lend)
                 for i, (s, _k, e, b) in enumerate(found))


def seconds(b: Booking) -> tuple[float, float]:
    """An occurrence's start and end in seconds from the run's instant 0."""
    from .engine import EPOCH

    return (b.start - EPOCH).total_seconds(), (b.end - EPOCH).total_seconds()


def occurrence_report(result: RunResult, workload: Workload,
                      booked: Sequence[Booking]) -> list[dict[str, object]]:
    """Per occurrence (module docstring): `delay_seconds` from its start until its GPUs
    held only the team's jobs or were free (its duration when never), `unclear_gpu_hours`
    (GPU-hours other teams' jobs held on its GPUs though they may not: crossing jobs,
    and every other job when it does not lend), `crossed_jobs` (other teams' attempts
    running at its start) and `crossed_gpu_hours` (what they held in it), the booked
    GPU-hours `used_gpu_hours` (by the team), `lent_gpu_hours` and `empty_gpu_hours`
    (with `unclear_gpu_hours`, they add up to `booked_gpu_hours`),
    and `team_owed_wait_max_seconds`: the longest a job of the team waited in the window
    while the team held fewer of the type than booked, with the job fitting beside."""
    sc = workload.scenario
    preemptible = {t.name: t.preemptible for t in sc.tiers}
    capacity: dict[str, int] = {}
    for n in sc.nodes:
        capacity[n.gpu_type] = capacity.get(n.gpu_type, 0) + n.gpus
    out = []
    for b in booked:
        start, end = seconds(b)
        # (from, to, GPU-equivalents, kind): kind T (the team), X (crossed in), L (lent),
        # N (another team's job that may not be on booked GPUs).
        pieces: list[tuple[float, float, float, str]] = []
        crossed = 0
        for r in result.records:
            for a in r.attempts:
                gt = a.gpu_type or r.job.gpu_type
                if gt != b.gpu_type or a.held_until <= start or a.start >= end:
                    continue
                s, e = max(a.start, start), min(a.held_until, end)
                if r.job.team == b.team:
                    kind = "T"
                elif a.start < start:
                    kind, crossed = "X", crossed + 1
                elif b.lend and preemptible.get(r.job.tier, True):
                    kind = "L"
                else:
                    kind = "N"
                pieces.append((s, e, r.job.share, kind))
        row = _integrate(pieces, start, end, b.gpus, capacity.get(b.gpu_type, 0))
        row.update({"id": b.id, "team": b.team, "gpu_type": b.gpu_type, "gpus": b.gpus,
                    "start_hours": start / HOUR, "end_hours": end / HOUR, "lend": b.lend,
                    "crossed_jobs": crossed,
                    "team_owed_wait_max_seconds": _team_wait(result, b, start, end,
                                                             pieces)})
        out.append(row)
    return out


def _integrate(pieces: list[tuple[float, float, float, str]], start: float, end: float,
               booked: int, capacity: int) -> dict[str, object]:
    """Walk the window: the GPUs outside the booking (capacity - booked) hold the team's
    jobs beyond its booking first, then the jobs that may not be on booked GPUs (crossed
    in, or not lent), then the lent ones; what does not fit there is on booked GPUs."""
    edges = sorted({start, end, *(p[0] for p in pieces), *(p[1] for p in pieces)})
    used = lent = empty = unclear = crossed_h = 0.0
    delay: float | None = None
    for lo, hi in itertools.pairwise(edges):
        if lo < start or hi > end or hi <= lo:
            continue
        held = {"T": 0.0, "X": 0.0, "L": 0.0, "N": 0.0}
        for s, e, g, kind in pieces:
            if s <= lo and e >= hi:
                held[kind] += g
        dt = (hi - lo) / HOUR
        mine = min(float(booked), held["T"])
        room = max(0.0, capacity - booked - (held["T"] - mine))
        bad = max(0.0, held["X"] + held["N"] - room)
        on_loan = max(0.0, held["L"] - max(0.0, room - held["X"] - held["N"]))
        if bad <= 1e-9 and delay is None:
            delay = lo - start
        unclear += bad * dt
        crossed_h += held["X"] * dt
        used += mine * dt
        lent += on_loan * dt
        empty += max(0.0, booked - mine - bad - on_loan) * dt
    return {"delay_seconds": end - start if delay is None else delay,
            "cleared": delay is not None, "unclear_gpu_hours": unclear,
            "crossed_gpu_hours": crossed_h, "used_gpu_hours": used, "lent_gpu_hours": lent,
            "empty_gpu_hours": empty, "booked_gpu_hours": booked * (end - start) / HOUR}


def _team_wait(result: RunResult, b: Booking, start: float, end: float,
               pieces: list[tuple[float, float, float, str]]) -> float:
    """The longest stretch a job of the team (of the booking's type) waited in the
    window while the team's jobs held at most `gpus` less its size (rule W3/W4: it was
    owed a booked GPU)."""
    mine = [(s, e, g) for s, e, g, kind in pieces if kind == "T"]
    worst = 0.0
    for r in result.records:
        if r.job.team != b.team or b.gpu_type not in r.job.accepted_types:
            continue
        for qs, qe in queued_intervals(r, result.end):
            lo, hi = max(qs, start), min(qe, end)
            if hi <= lo:
                continue
            edges = sorted({lo, hi, *(x for s, e, _ in mine for x in (s, e) if lo < x < hi)})
            run = 0.0
            for a, z in itertools.pairwise(edges):
                held = sum(g for s, e, g in mine if s <= a and e >= z)
                if held + r.job.share <= b.gpus + 1e-9:
                    run += z - a
                    worst = max(worst, run)
                else:
                    run = 0.0
    return worst
